"""One run per checkpoint directory: an advisory lock on ``DIR/.lock``, held for the
whole run by the process that owns it.

Who holds it: under ``--emulate`` the parent process, taken before any worker starts; under
``torchrun`` the leader (the lowest used rank), which decides alone whether and from where
to resume and tells the other ranks (``resume.claim_checkpoint_dir``), so the lock is
taken once however many nodes share the directory.

``fcntl.flock`` locks an open file description, so the lock dies with the process that
holds it, SIGKILL included, and never needs cleaning up; the file itself stays (removing it
on release would let a third run lock a new file while a second one waits on the old).
The holder writes its pid, host and start time into the file so a refused run can say who
has the directory. On NFS, Linux implements ``flock`` with POSIX locks, which work across
nodes; Lustre needs the ``flock`` mount option. Where the file system has no locks at
all the run goes on unlocked, with a warning.

The file is opened with :func:`piebald.outputs.open_run_file`: a ``.lock`` that is a
symbolic link (planted in a shared directory to make the run overwrite what it points to)
or anything but a regular file is refused in one line, and its target is never touched.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

from piebald.errors import SpecError
from piebald.outputs import OutputError, open_run_file

__all__ = ["LOCK_FILE", "CheckpointDirLock"]

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
_MAX_HOLDER_CHARS = 200


class CheckpointDirLock:
    """The lock on one checkpoint directory; :meth:`acquire` it, :meth:`release` it (or
    use it as a context manager). Creates the directory when it is missing."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None

    def acquire(self) -> CheckpointDirLock:
        """Take the lock without waiting; a directory another run holds is a one-line
        :class:`SpecError` naming the holder."""
        directory = self.directory
        if directory.exists() and not directory.is_dir():
            raise SpecError(
                source=str(directory),
                field="--checkpoint-dir",
                value="a file",
                expected="a directory to keep checkpoints in",
            )
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SpecError(
                source=str(directory),
                field="--checkpoint-dir",
                value=error.strerror,
                expected="a directory this user can create files in",
            ) from None
        fd = open_run_file(directory / LOCK_FILE, "update", flag="--checkpoint-dir", mode=0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise SpecError(
                source=str(directory),
                field="--checkpoint-dir",
                value=f"in use by another run ({holder})",
                expected="a checkpoint directory no other run is using: wait for that run "
                "to end, or choose another --checkpoint-dir",
            ) from None
        except OSError as error:
            if error.errno not in _NO_LOCKS:
                os.close(fd)
                raise
            logger.warning(
                "%s: the file system does not support locks (%s); running without the "
                "one-run-per-directory lock",
                directory,
                error.strerror,
            )
        self._fd = fd
        try:
            _write_holder(fd)
        except OSError as error:  # a full disk: the lock is held, the note is not written
            self.release()
            raise OutputError(
                flag="--checkpoint-dir",
                path=directory / LOCK_FILE,
                expected=f"a location piebald can write ({error.strerror})",
            ) from None
        return self

    def release(self) -> None:
        """Closing the file releases the lock (and would, at the latest, on exit)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> CheckpointDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _write_holder(fd: int) -> None:
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    text = f"pid {os.getpid()} on host {socket.gethostname()}, since {started}\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


def _read_holder(fd: int) -> str:
    """What the holder wrote; it may not have written yet (it locks, then writes)."""
    try:
        text = os.pread(fd, _MAX_HOLDER_CHARS, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return " ".join(text.split()) or "it has not written its pid yet"
