"""An emulated run owns its checkpoint directory and its processes (reliability findings 2,
3, 9, 25, 29, 30): a second run on the directory is refused while the first finishes
intact; the workers die within seconds of a SIGKILLed parent and take its scratch directory
with them; a worker's error is the only line the user sees; a run can go back to an older
checkpoint, its metrics holding each step once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_train_resume import PLAN, paced

from cli_runner import run_cli
from piebald.runtime.distributed.checkpoint import (
    find_latest_checkpoint,
    list_checkpoints,
    verify_checkpoint,
)
from piebald.runtime.training.checkpoint_lock import LOCK_FILE, CheckpointDirLock
from piebald.specs.plan_io import save_plan
from proc_table import session_members

pytestmark = pytest.mark.distributed

SLOW = paced(1.0)  # a step of about 1.0 s: the run outlives what the test does meanwhile
DEADLINE_S = 240


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A short TMPDIR for a run: its forkserver's socket lives there, and a socket path
    must stay under AF_UNIX's 108 bytes, which a pytest-xdist worker's tmp_path exceeds."""
    path = Path(tempfile.mkdtemp(prefix="pb-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _train(plan: Path, checkpoints: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "piebald",
        "train",
        "--plan",
        str(plan),
        "--emulate",
        "--seed",
        "7",
        "--checkpoint-dir",
        str(checkpoints),
        *args,
    ]


def _wait_for(
    condition: Callable[[], object], process: subprocess.Popen[str] | None, what: str
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert process is None or process.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s"
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["KILL", "TERM"])
def test_workers_die_with_their_parent(
    tmp_path: Path, scratch: Path, signum: signal.Signals
) -> None:
    """Finding 3: kill -9 of `piebald train --emulate` left the workers training (and the
    note: killed runs left /tmp/piebald-emulate-* behind)."""
    plan = tmp_path / "plan.json"
    save_plan(PLAN, plan)
    checkpoints = tmp_path / "ckpt"
    parent = subprocess.Popen(
        _train(plan, checkpoints, "--steps", "50", "--checkpoint-every", "1", *SLOW),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its session: every process it starts is found by it
        env={**os.environ, "TMPDIR": str(scratch)},
        text=True,
    )
    try:
        _wait_for(lambda: find_latest_checkpoint(checkpoints), parent, "checkpoint")
        workers = [pid for pid in session_members(parent.pid) if pid != parent.pid]
        assert len(workers) >= PLAN.cluster.num_gpus  # the ranks, and the forkserver
        assert list(scratch.glob("piebald-emulate-*"))
    finally:
        parent.send_signal(signum)  # the parent alone, as the OOM killer would
        parent.wait()
    # SIGTERM: the parent cleans up and exits 128 + 15; SIGKILL: the workers do.
    assert parent.returncode == (-signum if signum == signal.SIGKILL else 128 + signum)
    deadline = time.monotonic() + 10
    while session_members(parent.pid) or list(scratch.glob("piebald-emulate-*")):
        if time.monotonic() > deadline:
            for pid in session_members(parent.pid):  # leave nothing behind for the next test
                os.kill(pid, signal.SIGKILL)
            pytest.fail("workers or their scratch directory outlived the parent by 10 s")
        time.sleep(0.1)
    CheckpointDirLock(checkpoints).acquire().release()  # and the directory is free


def test_one_run_per_directory_clean_errors_and_going_back(tmp_path: Path, scratch: Path) -> None:
    """Findings 2 (a second run on the directory), 29 (--steps at the checkpoint's step),
    25 (a worker's error is the only line), 30 and 9 (back to an older checkpoint, the
    metrics holding every step once)."""
    plan = tmp_path / "plan.json"
    save_plan(PLAN, plan)
    checkpoints, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    steps = ["--steps", "8", "--checkpoint-every", "2", "--metrics", str(metrics)]
    first = subprocess.Popen(
        _train(plan, checkpoints, *steps, "--json", *SLOW),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        lock = checkpoints / LOCK_FILE
        _wait_for(lambda: lock.is_file() and f"pid {first.pid} " in lock.read_text(), first, "lock")
        for extra in ([], ["--resume"]):
            code, output = run_cli(*_train(plan, checkpoints, *steps, *extra)[3:])
            assert code == 2 and f"in use by another run (pid {first.pid} on host" in output
            assert "Traceback" not in output
        stdout, _ = first.communicate(timeout=DEADLINE_S)
    finally:
        first.kill()
    assert first.returncode == 0
    whole = json.loads(stdout.strip().splitlines()[-1])["losses"]
    saved = [verify_checkpoint(path).step for path in list_checkpoints(checkpoints)]
    assert saved == [2, 4, 6, 8]  # all there, every byte as its manifest says

    code, output = run_cli(*_train(plan, checkpoints, "--steps", "8", "--resume")[3:])
    assert code == 2 and "--steps: got 8; expected more than 8" in output

    shard = sorted((checkpoints / "step-00000008").glob("rank-*.pt"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    broken = subprocess.run(
        _train(plan, checkpoints, "--steps", "9", "--resume"),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert not list(scratch.glob("piebald-emulate-*"))  # removed after a worker's failure
    lines = [line for line in broken.stderr.splitlines() if line.strip()]
    assert broken.returncode == 2 and len(lines) == 1, broken.stderr
    assert lines[0].startswith("error:") and shard.name in lines[0]
    assert "--resume-from" in lines[0] and "step-00000006" in lines[0]

    metrics.write_text(metrics.read_text() + '{"step": 9, "lo')  # a kill mid-line
    resumed = subprocess.run(
        [
            *_train(plan, checkpoints, "--steps", "9", "--resume-from", "step-00000006"),
            *["--json", "--metrics", str(metrics)],
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["losses"][:2] == whole[6:8]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 10))
    assert [r["loss"] for r in records[:8]] == whole
    assert (checkpoints / "superseded-step-00000008").is_dir()
    assert find_latest_checkpoint(checkpoints) == checkpoints / "step-00000009"


def test_under_torchrun_the_leader_holds_the_directory(tmp_path: Path) -> None:
    """Finding 2 under torchrun: the lowest used rank takes the lock and decides; every
    rank gets its verdict (refused while another process holds the directory; a fresh run
    and its resume once free)."""
    plan = tmp_path / "plan.json"
    save_plan(PLAN, plan)
    checkpoints = tmp_path / "ckpt"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc-per-node", str(PLAN.cluster.num_gpus), "-m", "piebald", "train"]
    common = [*torchrun, "--plan", str(plan), "--device", "cpu", "--seed", "7"]
    common += ["--checkpoint-dir", str(checkpoints), "--json"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*common, *args], env=env, capture_output=True, text=True, timeout=DEADLINE_S
        )

    with CheckpointDirLock(checkpoints):
        refused = run("--steps", "1")
    assert refused.returncode != 0
    assert f"in use by another run (pid {os.getpid()} on host" in refused.stderr
    assert find_latest_checkpoint(checkpoints) is None

    first = run("--steps", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run("--steps", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(json.loads(resumed.stdout.strip().splitlines()[-1])["losses"]) == 1
    assert find_latest_checkpoint(checkpoints) == checkpoints / "step-00000002"
