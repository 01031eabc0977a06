"""Scratch directories of dead runs are removed by the next run; nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from piebald.runtime.scratch import OWNER_FILE, remove_dead_scratch, run_scratch


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    return int(child.stdout)


def _scratch(root: Path, name: str, owner: str | None) -> Path:
    path = root / name
    path.mkdir()
    (path / "store").write_text("x")
    if owner is not None:
        (path / OWNER_FILE).write_text(owner)
    return path


def test_only_the_dead_runs_directories_of_the_prefix_go(tmp_path: Path) -> None:
    dead = _scratch(tmp_path, "piebald-emulate-dead", f"{_dead_pid()} -\n")
    alive = _scratch(tmp_path, "piebald-emulate-alive", f"{os.getpid()} -\n")
    unowned = _scratch(tmp_path, "piebald-emulate-old", None)  # made before owner records
    other = _scratch(tmp_path, "piebald-network-dead", f"{_dead_pid()} -\n")
    garbled = _scratch(tmp_path, "piebald-emulate-garbled", "not a pid\n")
    assert remove_dead_scratch("piebald-emulate-", root=tmp_path) == [dead]
    assert not dead.exists()
    assert alive.exists() and unowned.exists() and other.exists() and garbled.exists()


def test_a_reused_pid_with_another_start_time_is_dead(tmp_path: Path) -> None:
    """This process's pid with a start time that is not its own: the owner is gone."""
    reused = _scratch(tmp_path, "piebald-emulate-reused", f"{os.getpid()} 1\n")
    if Path(f"/proc/{os.getpid()}/stat").exists():
        assert remove_dead_scratch("piebald-emulate-", root=tmp_path) == [reused]


def test_run_scratch_records_its_owner_and_removes_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _scratch(tmp_path, "piebald-test-dead", f"{_dead_pid()} -\n")
    with run_scratch("piebald-test-") as scratch:
        assert not dead.exists()
        pid, started = (scratch / OWNER_FILE).read_text().split()
        assert int(pid) == os.getpid() and started
        assert remove_dead_scratch("piebald-test-", root=tmp_path) == []  # its own: alive
    assert not scratch.exists()
