"""The planning core never imports torch, so `pip install piebald` plans on a laptop."""

from __future__ import annotations

import subprocess
import sys

import pytest

CORE = [
    "piebald.specs",
    "piebald.cost",
    "piebald.planner",
    "piebald.schedule",
    "piebald.simulator",
    "piebald.report",
    # The API and the CLI import the runtime only when training or profiling is called.
    "piebald.api",
    "piebald.cli",
]


@pytest.mark.parametrize("module", CORE)
@pytest.mark.slow
def test_core_module_does_not_import_torch(module: str) -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        f"package = importlib.import_module({module!r})\n"
        "for info in pkgutil.walk_packages(getattr(package, '__path__', []), "
        "package.__name__ + '.'):\n"
        "    importlib.import_module(info.name)\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False", f"{module} imported torch"


def test_core_imports_where_torch_cannot_be_imported() -> None:
    """Block torch outright: the core must still import and plan."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any 'import torch' now raises ImportError\n"
        "import piebald.specs, piebald.cost\n"
        "from piebald.specs.presets import load_model\n"
        "print(load_model('gpt2').num_params)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert int(result.stdout) > 100_000_000


def test_data_preparation_imports_where_torch_cannot_be_imported() -> None:
    """``piebald data prepare`` tokenizes on a machine without torch."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import piebald.runtime.data.prepare, piebald.cli.data\n"
        "from piebald.runtime.data import open_token_file\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "ok"
