"""The packages import downwards only (docs/design.md section 5), checked by import-linter.

The contracts are in ``.importlinter`` at the repository root: the layers from ``errors`` at
the bottom to ``cli`` at the top, no torch in the planning core, nothing below the API
importing it. Every import counts, a function's and a ``TYPE_CHECKING`` one as much as a
module's, and so does a chain of them through other modules.

By hand, from the repository root: ``.venv/bin/lint-imports --no-cache``. To see it fail,
add ``import piebald.planner`` to a module of ``piebald/specs`` and run this test (or that
command): it names the contract, the two layers and the chain of imports that links them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".importlinter"


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.exists(), f"no {lint_imports}: install the dev extras (import-linter)"
    result = subprocess.run(
        [
            str(lint_imports),
            "--no-cache",
            "--no-logo",
            str(CONFIG),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, (
        f"an import breaks the layering of docs/design.md section 5 ({CONFIG.name}):\n"
        f"{result.stdout}{result.stderr}"
    )
