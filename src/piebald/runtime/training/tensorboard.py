"""TensorBoard event files beside the metrics JSONL (``--tensorboard DIR``).

Written with tensorboardX, the light writer (numpy and protobuf; torch's own
``torch.utils.tensorboard`` needs the whole ``tensorboard`` server package), installed by
the ``tensorboard`` extra: ``pip install 'piebald[tensorboard]'``. It is imported only when
a directory is given, so training without it never needs it.

Each writer opens a new event file (a random suffix: a run resumed in the same second as
the last one started does not reopen, and truncate, that one's file). A run resumed from
the checkpoint of step k purges what an earlier run logged after step k, as it retrains
those steps (TensorBoard's ``purge_step``).

A directory or event file that cannot be written (a full disk) is an
:class:`~piebald.outputs.OutputError` naming ``--tensorboard``, the directory and the OS's
words; scalars are flushed at every step, so the error comes at the step that failed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from piebald.outputs import make_run_directory, write_error

__all__ = ["MISSING_PACKAGE", "TensorBoardWriter", "tensorboard_available"]

MISSING_PACKAGE = (
    "the tensorboardX package (pip install 'piebald[tensorboard]', or pip install tensorboardX)"
)


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboardX") is not None


class TensorBoardWriter:
    """Scalars per step into ``directory`` (created if missing); with ``None``, nothing."""

    def __init__(self, directory: Path | None, *, first_step: int = 0) -> None:
        self._writer: Any = None
        if directory is None:
            return
        from tensorboardX import SummaryWriter

        self._directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)  # a link to a directory: theirs
        except OSError:
            make_run_directory(directory, flag=_FLAG)  # says why in one line
        try:
            self._writer = SummaryWriter(
                logdir=str(directory),
                # Metrics steps are 1-based: a resumed run's first is first_step + 1.
                purge_step=first_step + 1 if first_step else None,
                filename_suffix=f".{uuid.uuid4().hex[:8]}",
            )
        except OSError as error:
            raise write_error(error, flag=_FLAG, path=directory) from None

    def write_scalars(self, *, step: int, scalars: Mapping[str, float]) -> None:
        """One value per tag at ``step``, flushed now: a crashed run keeps what it logged."""
        if self._writer is None:
            return
        try:
            for tag, value in scalars.items():
                self._writer.add_scalar(tag, float(value), global_step=step)
            self._writer.flush()
        except OSError as error:
            self._abandon()
            raise write_error(error, flag=_FLAG, path=self._directory) from None

    def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as error:
                self._abandon()
                raise write_error(error, flag=_FLAG, path=self._directory) from None
            self._writer = None

    def _abandon(self) -> None:
        """Forget a writer that failed. tensorboardX would write again what it still holds
        (its logger thread, the atexit hook that closes every writer, the file's own
        buffer when it is collected), each failing again with a traceback after the run's
        one line; so each of its event files is pointed at an anonymous memory file first
        (:func:`_sink`), where those writes succeed and vanish. What reached the disk
        stays."""
        for file_writer in (getattr(self._writer, "all_writers", None) or {}).values():
            record = getattr(getattr(file_writer, "event_writer", None), "_ev_writer", None)
            stream: Any = getattr(getattr(record, "_py_recordio_writer", None), "_writer", None)
            if stream is None:
                continue
            with contextlib.suppress(AttributeError, OSError, ValueError):
                sink = _sink()
                try:
                    os.dup2(sink, stream.fileno())
                finally:
                    os.close(sink)
        self._writer = None


_FLAG = "--tensorboard"


def _sink() -> int:
    """A descriptor whose writes and fsyncs succeed and keep nothing on disk: an anonymous
    memory file (Linux), else ``/dev/null`` (where fsync may fail: nothing better)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("piebald-abandoned-events")
    return os.open(os.devnull, os.O_WRONLY)
