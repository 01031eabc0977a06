"""A run's scratch directory under ``$TMPDIR``, and the removal of those whose run is dead.

A run removes its own scratch directory when it ends, and its workers remove it when the
run dies under them (``parent_watch``). When the whole process group is killed at once
(``kill -9 -PGID``, a scheduler ending a job) nothing is left alive to do either, so each
scratch directory records its owner: the pid and, on Linux, the process's start time
(``/proc/PID/stat`` field 22), which tells a live owner from a later process that reused
its pid. :func:`run_scratch` removes the directories of its prefix whose owner is gone
before it makes its own, so what such a kill leaves is removed by the next run. A
directory without an owner record, another user's, or one whose owner cannot be read is
left alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["OWNER_FILE", "remove_dead_scratch", "run_scratch"]

OWNER_FILE = ".owner"


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None  # field 22 of the whole line


def _owner_record(pid: int) -> str:
    return f"{pid} {_start_time(pid) or '-'}\n"


def _owner_alive(record: str) -> bool:
    pid_text, _, started = record.strip().partition(" ")
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: the pid was reused
        return False
    return started in ("-", "") or _start_time(pid) in (None, started)


def remove_dead_scratch(prefix: str, *, root: Path | None = None) -> list[Path]:
    """Remove the directories ``root/prefix*`` (default root: ``$TMPDIR``) of this user
    whose owner record names a process that is gone; returns what was removed."""
    base = Path(root if root is not None else tempfile.gettempdir())
    removed = []
    for path in base.glob(f"{prefix}*"):
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            record = (path / OWNER_FILE).read_text()
            if _owner_alive(record):
                continue
        except (OSError, ValueError):  # no record, unreadable, or not ours to judge
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


@contextlib.contextmanager
def run_scratch(prefix: str) -> Iterator[Path]:
    """A new scratch directory ``$TMPDIR/prefix*`` owned by this process, removed on exit;
    the dead runs' directories of ``prefix`` are removed first."""
    remove_dead_scratch(prefix)
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        scratch = Path(name)
        (scratch / OWNER_FILE).write_text(_owner_record(os.getpid()))
        yield scratch
