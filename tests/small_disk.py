"""A tiny tmpfs to fill up, for the full-disk tests (tests/conftest.py puts this on the
path): mounting needs root, so a test skips where the machine refuses it."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(path: Path, *, size: str) -> Iterator[Path]:
    """``path`` (created) with a tmpfs of ``size`` (``"256k"``, ``"3m"``) mounted on it
    while inside, unmounted after; skips the test where mounting is not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield path
    finally:
        # Lazily where a process the test started still holds a file open on it: a mount
        # left behind makes pytest's clean-up of old temporary directories fail.
        if subprocess.run(["umount", str(path)], check=False, capture_output=True).returncode:
            subprocess.run(["umount", "--lazy", str(path)], check=False, capture_output=True)


def fill(path: Path, *, leave: int = 0) -> None:
    """Write ``path`` until its disk is full, then free ``leave`` bytes of it again."""
    with contextlib.suppress(OSError), path.open("ab") as filler:
        while True:
            filler.write(bytes(4096))
            filler.flush()
    if leave:
        with path.open("r+b") as filler:
            filler.truncate(max(0, path.stat().st_size - leave))
