"""Every source file is under ruff: its default ``exclude`` silently skips folders with common
names (``dist``, ``build``, ``venv``, ...), which once hid the whole distributed runtime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_checks_every_python_file_under_src() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    result = subprocess.run(
        [str(ruff), "check", "--show-files", "src"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    checked = {
        Path(line.strip()).resolve()
        for line in result.stdout.splitlines()
        if line.strip().endswith(".py")
    }
    sources = {path.resolve() for path in (ROOT / "src").rglob("*.py")}
    assert sources, "no source files found"
    assert sources - checked == set(), "ruff skips these files"
