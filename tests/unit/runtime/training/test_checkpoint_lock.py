"""One run per checkpoint directory (reliability finding 2): a second holder is refused in
one line naming the first's pid and host; the lock dies with its process, SIGKILL too."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from piebald.errors import SpecError
from piebald.runtime.training.checkpoint_lock import LOCK_FILE, CheckpointDirLock


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    """Finding 2: two runs sharing a --checkpoint-dir replaced each other's checkpoints."""
    directory = tmp_path / "new" / "ckpt"  # created by the lock
    with CheckpointDirLock(directory):
        # flock locks an open file: a second open of the file in this process conflicts
        # exactly as another process's would.
        with pytest.raises(SpecError) as caught:
            CheckpointDirLock(directory).acquire()
        message = str(caught.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in message
        assert str(directory) in message and "\n" not in message
    with CheckpointDirLock(directory):  # released: free again
        pass


def test_the_lock_dies_with_its_process(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from piebald.runtime.training.checkpoint_lock import CheckpointDirLock; "
            "CheckpointDirLock(Path(sys.argv[1])).acquire(); print('held', flush=True); "
            "time.sleep(600)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(SpecError, match=f"pid {holder.pid} "):
            CheckpointDirLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 5
    while True:  # the kernel drops the lock as the process's files close
        try:
            CheckpointDirLock(tmp_path).acquire().release()
            break
        except SpecError:
            assert time.monotonic() < deadline, "the lock outlived its process"
            time.sleep(0.05)
    assert (tmp_path / LOCK_FILE).is_file()


def test_a_file_or_unwritable_place_is_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    with pytest.raises(SpecError, match="expected a directory to keep checkpoints in"):
        CheckpointDirLock(a_file).acquire()
    assert a_file.read_text() == "mine"
    with pytest.raises(SpecError, match="--checkpoint-dir"):
        CheckpointDirLock(a_file / "below").acquire()


def test_a_lock_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    """A ``.lock`` planted as a link in a shared directory made the run truncate and
    overwrite the file it pointed to; now it is one line and the target is as it was."""
    victim = tmp_path / "victim.txt"
    victim.write_text("VICTIM DATA\n")
    directory = tmp_path / "ck"
    directory.mkdir()
    (directory / LOCK_FILE).symlink_to(victim)
    with pytest.raises(SpecError) as caught:
        CheckpointDirLock(directory).acquire()
    message = str(caught.value)
    assert message.startswith("--checkpoint-dir: got") and "a symbolic link" in message
    assert "\n" not in message
    assert victim.read_text() == "VICTIM DATA\n"
    (directory / LOCK_FILE).unlink()
    os.mkfifo(directory / LOCK_FILE)  # nor anything else that is not a regular file
    with pytest.raises(SpecError, match="a named pipe"):
        CheckpointDirLock(directory).acquire()
