"""Commands that need an optional dependency say which extra to install, in one line.

Planning and simulation run without torch (``pip install piebald``); training, profiling
and the demo's emulated training need it (``piebald[train]``). Each case runs the command
line in a fresh interpreter in which torch cannot be imported (a finder first on
``sys.meta_path`` refuses it), so no module imported by other tests hides the failure.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from piebald.examples import example_path

BLOCK_TORCH = """
import sys

class NoTorch:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch)
from piebald.cli import main
sys.argv = ["piebald", *sys.argv[1:]]
main()
"""


def _without_torch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("train", "--model", "tiny", "--global-batch", "4", "--seq-len", "32", "--steps", "1"),
        ("demo", "--out-dir", "demo"),
        ("profile", "compute", "--model", "tiny", "--seq-len", "32", "--device", "cpu"),
    ],
    ids=["train", "demo", "profile-compute"],
)
@pytest.mark.slow
def test_a_command_that_needs_torch_names_the_extra(args: tuple[str, ...], tmp_path: Path) -> None:
    done = _without_torch(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "error: this command needs torch, which is not installed: pip install 'piebald[train]'"
    ]
    assert not (tmp_path / "demo").exists()  # the demo stopped before writing anything


@pytest.mark.slow
def test_planning_needs_no_torch(tmp_path: Path) -> None:
    done = _without_torch(
        "plan", "--cluster", str(example_path()), "--model", "tiny",
        "--global-batch", "8", "--seq-len", "64", "--out", "plan.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "plan.json").is_file()
