"""A command imports what it needs, not what every command needs: ``piebald --help`` and
``piebald plan`` start without the profiler's scipy.optimize, the runtime's torch,
transformers, matplotlib or the simulator (``import piebald.api`` loads each name's module
on first use; the CLI imports a command's API functions when the command runs).

Each case runs the command line in a fresh interpreter and lists its ``sys.modules``
afterwards, so no module imported by other tests hides an import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_builders import CPU_LAB_YAML

RUN = """
import json, sys
out = sys.argv[1]
sys.argv = ["piebald", *sys.argv[2:]]
code = None
if len(sys.argv) > 1:
    from piebald.cli import main
    try:
        main()
    except SystemExit as exit:
        code = exit.code
else:  # the entry point alone
    import piebald.cli
with open(out, "w") as file:
    json.dump({"code": code, "modules": sorted(sys.modules)}, file)
"""


# What no planning process loads: other commands' dependencies and the packages behind them.
NOT_FOR_PLANNING = (
    "scipy.optimize",
    "torch",
    "transformers",
    "matplotlib",
    "piebald.runtime",
    "piebald.simulator",
    "piebald.profiler.calibrate",
    "piebald.api.training",
    "piebald.api.simulation",
    "piebald.api.profiling",
)
# ...and what only the commands that plan load.
NOT_FOR_HELP = (*NOT_FOR_PLANNING, "piebald.planner", "piebald.api.planning")


def _modules_after(*args: str, cwd: Path) -> tuple[object, list[str]]:
    """The exit code of ``piebald ARGS...`` (None: no command, the import alone) and every
    module it imported."""
    out = cwd / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(out), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and out.is_file(), done.stderr[-2000:]
    result = json.loads(out.read_text())
    return result["code"], result["modules"]


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if any(m == name or m.startswith(f"{name}.") for m in modules)]


@pytest.mark.parametrize(
    "args", [(), ("--help",), ("plan", "--help")], ids=["import", "help", "plan-help"]
)
def test_starting_the_command_line_loads_no_command(args: tuple[str, ...], tmp_path: Path) -> None:
    code, modules = _modules_after(*args, cwd=tmp_path)
    assert code in (None, 0)
    assert "piebald.cli.commands" in modules
    assert _loaded(modules, NOT_FOR_HELP) == []


def test_planning_loads_the_planner_only(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CPU_LAB_YAML)
    code, modules = _modules_after(
        "plan", "--cluster", str(cluster), "--model", "tiny",
        "--global-batch", "8", "--seq-len", "64", "--out", "plan.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert code in (None, 0)
    assert (tmp_path / "plan.json").is_file()
    assert "piebald.planner.search" in modules
    assert _loaded(modules, NOT_FOR_PLANNING) == []
