"""Worker processes die with the process that started them, whatever killed it.

A parent killed by SIGKILL (the OOM killer, ``kill -9``) runs no clean-up, so its workers
must notice by themselves, or they go on training headless and writing into a checkpoint
directory whose lock died with the parent. Two mechanisms, because neither covers all:

* ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the worker when its parent exits.
  A forkserver's children have the forkserver as parent, not the run's process, so alone
  it only helps once the forkserver itself exits (it does, when the process that started
  it goes away).
* a watchdog thread waiting on a pidfd of the run's process (``os.pidfd_open``: readable
  once that process exits, immune to pid reuse; polling once a second where pidfds are
  missing). It removes the run's scratch directory first, since the dead parent cannot,
  then kills the worker.

The parent's own side is :func:`exit_on_sigterm`: SIGTERM becomes ``SystemExit``, so its
clean-up (kill the workers, remove the scratch directory) runs as for any exception.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

__all__ = ["die_with_parent", "exit_on_sigterm"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_POLL_S = 1.0


def die_with_parent(parent_pid: int, *, scratch: Path | None = None) -> None:
    """Kill this process within about a second of ``parent_pid`` exiting (at once with a
    pidfd), removing ``scratch`` first. Call it first thing in a worker."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    watchdog = threading.Thread(
        target=_watch, args=(parent_pid, scratch), name="piebald-parent-watch", daemon=True
    )
    watchdog.start()


def _watch(parent_pid: int, scratch: Path | None) -> None:
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:  # gone before the worker got here
        _die(scratch)
    except (AttributeError, OSError):  # no pidfds (old kernel, not Linux): poll
        while _alive(parent_pid):
            time.sleep(_POLL_S)
        _die(scratch)
    else:
        select.select([pidfd], [], [])  # readable once the process has exited
        _die(scratch)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's: the pid was reused
        return False
    return True


def _die(scratch: Path | None) -> None:
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Inside, SIGTERM raises ``SystemExit(143)`` (128 + the signal's number), so the
    caller's ``finally`` and ``with`` clean-up runs instead of the process vanishing. Only
    the main thread may set handlers; elsewhere this does nothing (workers still die with
    the process, ``die_with_parent``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
