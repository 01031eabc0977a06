"""``profile network --emulate`` stopped by SIGTERM stops its workers and removes its
``$TMPDIR/piebald-network-*`` scratch directory (it left it behind)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from proc_table import session_members

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

_CLUSTER = """\
name: pair
nodes:
  - {name: g, gpu: T4, gpus_per_node: 2, intra_link: 16GB/s}
"""


def test_sigterm_removes_the_scratch_directory_and_stops_the_workers(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    scratch = Path(tempfile.mkdtemp(prefix="pb-", dir="/tmp"))  # short: AF_UNIX paths
    try:
        (tmp_path / "c.yaml").write_text(_CLUSTER)
        parent = subprocess.Popen(
            [
                sys.executable, "-m", "piebald", "profile", "network",
                "--cluster", str(tmp_path / "c.yaml"), "--emulate",
                "--message-sizes", "16", "--repeats", "100000",
                "--out", str(tmp_path / "net.json"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "TMPDIR": str(scratch)},
            text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            # The workers are up once the store of their rendezvous is there.
            while not list(scratch.glob("piebald-network-*/store*")):
                assert parent.poll() is None, parent.communicate()
                assert time.monotonic() < deadline, "no workers within 120 s"
                time.sleep(0.05)
            time.sleep(1.0)
            parent.send_signal(signal.SIGTERM)
            _, stderr = parent.communicate(timeout=60)
        finally:
            if parent.poll() is None:
                os.killpg(parent.pid, signal.SIGKILL)
                parent.wait()
        assert parent.returncode == 128 + signal.SIGTERM, stderr
        assert "Traceback" not in stderr, stderr
        deadline = time.monotonic() + 10
        while session_members(parent.pid):
            assert time.monotonic() < deadline, "workers outlived the parent by 10 s"
            time.sleep(0.1)
        assert not list(scratch.glob("piebald-network-*"))
        assert not (tmp_path / "net.json").exists()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
