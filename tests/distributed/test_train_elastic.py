"""Elastic emulated training: a node SIGKILLed mid-run, a graceful removal through the
membership file and a re-join, and the run goes on with the losses of an uninterrupted
run at every step (fp32), on a new plan for the live nodes each time."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piebald.api import TrainConfig, build_job, emulate, load_cluster, plan
from piebald.examples import example_path
from piebald.runtime.training.emulate import worker_process_name
from piebald.specs.plan_io import load_plan, save_plan
from proc_table import session_members

pytestmark = pytest.mark.distributed

STEPS = 12
STEP_S = 0.4  # wall seconds per step of the original plan: the test acts between steps
DEADLINE_S = 300


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A short TMPDIR: the forkserver's socket path must stay under AF_UNIX's 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="pb-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _node_pids(node_index: int, *, session: int) -> list[int]:
    """The emulated workers of one node of the run of ``session``, found by their process
    name as ``pkill -s SESSION`` would (other tests' runs name theirs alike)."""
    prefix = worker_process_name(group_rank=node_index, rank=0)[: -len("0")]
    found = []
    for pid in session_members(session):
        try:
            name = (Path("/proc") / str(pid) / "comm").read_text().strip()
        except OSError:
            continue
        if name.startswith(prefix):
            found.append(pid)
    return found


def _train_elastic(
    arguments: list[str],
    *,
    scratch: Path,
    summary_file: Path,
    on_line: Callable[[str, int], None],
) -> tuple[int, list[str]]:
    """Run ``piebald train ARGUMENTS --json`` (summary into ``summary_file``) in a session
    of its own, calling ``on_line(line, session)`` with each step line as it comes; its
    exit status and the lines. An exception in ``on_line`` kills the run and is raised
    here, not lost in the thread."""
    process = subprocess.Popen(
        [sys.executable, "-m", "piebald", "train", *arguments, "--json"],
        stdout=summary_file.open("w"),
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
        start_new_session=True,
    )
    lines: list[str] = []
    failures: list[BaseException] = []

    def read() -> None:
        assert process.stderr is not None
        try:
            for line in process.stderr:
                lines.append(line)
                on_line(line, process.pid)
        except BaseException as error:
            failures.append(error)
            os.killpg(process.pid, signal.SIGKILL)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process.wait(timeout=DEADLINE_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    reader.join(timeout=10)
    if failures:
        raise failures[0]
    return process.returncode, lines


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_lost_node_a_removal_and_a_rejoin_keep_the_losses(tmp_path: Path, scratch: Path) -> None:
    cluster = load_cluster(example_path())  # three node groups of one 2-GPU node each
    original = plan(cluster, "tiny", build_job(global_batch=8, seq_len=64))
    used_nodes = {cluster.node_of(rank).index for rank in original.used_ranks}
    killed = cluster.nodes[min(used_nodes)]  # a node the plan trains on
    removed = next(node for node in cluster.nodes if node.index != killed.index)
    plan_file = tmp_path / "plan.json"
    save_plan(original, plan_file)
    membership = tmp_path / "membership.yaml"
    everyone = [node.name for node in cluster.nodes]
    membership.write_text(f"nodes: {json.dumps(everyone)}\n")
    checkpoints = tmp_path / "ckpt"
    metrics = tmp_path / "metrics.jsonl"

    reference = emulate(original, config=TrainConfig(steps=STEPS, seed=3, measure_memory=False))

    assert original.predicted is not None
    summary_file = tmp_path / "summary.json"
    stage = [0]

    def react(line: str, session: int) -> None:
        """Kill ``killed`` after step 5; remove ``removed`` once step 7 is done, and bring
        every node back once step 9 is."""
        if stage[0] == 0 and line.startswith("step     5"):
            pids = _node_pids(killed.index, session=session)
            assert pids, "the node's workers are named as a tool finds them"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            stage[0] = 1
        elif stage[0] == 1 and line.startswith("step     7"):
            rest = [name for name in everyone if name not in (killed.name, removed.name)]
            membership.write_text(f"nodes: {json.dumps(rest)}\n")
            stage[0] = 2
        elif stage[0] == 2 and line.startswith("step     9"):
            membership.write_text(f"nodes: {json.dumps(everyone)}\n")
            stage[0] = 3

    code, lines = _train_elastic(
        [
            *("--plan", str(plan_file), "--emulate", "--elastic"),
            *("--membership", str(membership), "--seed", "3", "--steps", str(STEPS)),
            *("--checkpoint-dir", str(checkpoints), "--checkpoint-every", "2"),
            *("--metrics", str(metrics)),
            *("--time-scale", f"{STEP_S / original.predicted.step_time_s:.6g}"),
        ],
        scratch=scratch,
        summary_file=summary_file,
        on_line=react,
    )
    assert code == 0, "".join(lines[-5:])
    summary = json.loads(summary_file.read_text())

    # Every step, once, with the uninterrupted run's loss.
    assert len(summary["losses"]) == STEPS
    assert summary["losses"] == pytest.approx(list(reference.losses), abs=1e-5, rel=0)
    events = summary["membership_events"]
    assert [(e["kind"], e["nodes"]) for e in events] == [
        ("lost", [killed.name]),
        ("left", [removed.name]),
        ("joined", sorted([killed.name, removed.name], key=everyone.index)),
    ]
    lost, left, joined = events
    resumed_from = int(Path(lost["plan_file"]).stem.split("-")[-1])  # plan-from-step-N
    assert lost["step"] >= 5 and resumed_from % 2 == 0
    assert lost["lost_steps"] == lost["step"] - resumed_from
    assert left["lost_steps"] == 0 and joined["lost_steps"] == 0
    assert lost["gpus_before"] == 6 and lost["gpus_after"] == 4
    assert left["gpus_after"] == 2 and joined["gpus_after"] == 6
    for event in (lost, left):  # a new plan for the live nodes, beside the checkpoints
        written = load_plan(event["plan_file"])
        assert written.cluster.num_gpus == event["gpus_after"]
        assert Path(event["plan_file"]).parent == checkpoints
    assert joined["plan_file"] is None  # every node is back: the original plan
    assert all(e["restore_s"] > 0 and e["replan_s"] >= 0 for e in events)

    # The step lines say it, and the metrics file holds every step once and the events.
    said = [line for line in lines if line.startswith("membership:")]
    assert len(said) == 3 and killed.name in said[0]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r["step"] for r in records if "event" not in r]
    assert steps == list(range(1, STEPS + 1))
    assert [r["event"] for r in records if "event" in r] == ["lost", "left", "joined"]
    assert not list(scratch.glob("piebald-emulate-*"))  # the scratch went with the run


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_hung_node_is_found_by_the_collective_timeout_and_dropped(
    tmp_path: Path, scratch: Path
) -> None:
    """A node whose workers stop answering (SIGSTOP) in the middle of a step: its peers'
    collectives time out (--collective-timeout), the supervisor kills the hung workers and
    the run goes on without the node, all within the timeout + 10 s of the hang."""
    cluster = load_cluster(example_path())
    spread = plan(cluster, "tiny", build_job(global_batch=48, seq_len=32))
    nodes = {cluster.node_of(rank).index for rank in spread.used_ranks}
    assert len(nodes) >= 2, "the hung node's peers must wait on it"
    hung = cluster.nodes[min(nodes)]
    plan_file = tmp_path / "plan.json"
    save_plan(spread, plan_file)
    summary_file = tmp_path / "summary.json"
    timeout_s = 3
    assert spread.predicted is not None
    stopped_at: list[float] = []
    sessions: list[int] = []

    def react(line: str, session: int) -> None:
        if not stopped_at and line.startswith("step     3"):
            pids = _node_pids(hung.index, session=session)
            sessions.append(session)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            stopped_at.append(time.time() if pids else 0.0)

    code, lines = _train_elastic(
        [
            *("--plan", str(plan_file), "--emulate", "--elastic", "--steps", "5"),
            *("--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "2"),
            *("--collective-timeout", str(timeout_s)),
            *("--time-scale", f"{STEP_S / spread.predicted.step_time_s:.6g}"),
        ],
        scratch=scratch,
        summary_file=summary_file,
        on_line=react,
    )
    assert code == 0 and stopped_at and stopped_at[0] > 0
    said = [line for line in lines if line.startswith("membership:")]
    summary = json.loads(summary_file.read_text())
    (event,) = summary["membership_events"]
    assert event["kind"] == "lost" and event["nodes"] == [hung.name]
    assert event["detect_s"] <= timeout_s + 10
    assert len(summary["losses"]) == 5 and len(said) == 1
    # The hung workers were killed, not left stopped (the run's exit may take its forkserver
    # a moment longer).
    deadline = time.monotonic() + 10
    while _node_pids(hung.index, session=sessions[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _node_pids(hung.index, session=sessions[0])
