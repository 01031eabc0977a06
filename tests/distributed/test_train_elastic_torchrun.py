"""Elastic training under real torchrun (``runtime.training.elastic_rendezvous``): three
torchrun agents on this machine play the example cluster's three 2-GPU nodes, with
torchrun's own elastic rendezvous (``--nnodes 2:3 --rdzv-backend c10d``). One agent is
SIGKILLed with its workers mid-run: the two others go on under a plan of their own, from
the newest checkpoint; started again, it rejoins and the first plan comes back. The losses
are those of an uninterrupted run at every step (fp32). A peer that stops answering in
the middle of a step fails its survivor within the collective timeout."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
from dist_harness import StageSpec, make_plan

from piebald.api import build_job, load_cluster, plan
from piebald.examples import example_path
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.elastic_rendezvous import plan_digest
from piebald.runtime.training.reference import train_reference
from piebald.specs.plan_io import load_plan, save_plan
from proc_table import children

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

DRIVER = Path(__file__).with_name("elastic_driver.py")
STEPS = 12
LR = 3e-3
DEADLINE_S = 240
# Quick recovery: a dead agent's rendezvous heartbeat expires after 1 s x 3, a round
# completes 1 s after its minimum is reached, agents look for waiting nodes twice a second.
RDZV_CONF = "join_timeout=120,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
STEP_LINE = re.compile(r"^step +(\d+) ")
# gloo's words for a collective timeout: "Timed out waiting 5000ms for recv operation",
# "Application timeout caused pair closure" (a wait on another pair of that context).
TIMEOUT_WORDS = re.compile(r"(?i)time(d )?out")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONPATH": os.pathsep.join([str(DRIVER.parent), os.environ.get("PYTHONPATH", "")]),
        **extra,
    }


class _Agent:
    """One torchrun agent (a node), in a session of its own; its output in a file."""

    def __init__(self, command: list[str], *, log: Path, env: dict[str, str]) -> None:
        self.log = log
        self._out: IO[str] = log.open("w")
        self.process = subprocess.Popen(
            command, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._out.close()


def _wait_for(what: str, found: Callable[[], object], agents: list[_Agent]) -> object:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        for agent in agents:
            status = agent.process.poll()
            if status not in (None, 0):
                tail = "\n".join(agent.lines()[-30:])
                pytest.fail(f"{agent.log.name} exited {status} before {what}:\n{tail}")
        time.sleep(0.05)
    pytest.fail(f"no {what} within {DEADLINE_S} s")


@pytest.fixture
def agents() -> Iterator[list[_Agent]]:
    started: list[_Agent] = []
    yield started
    for agent in started:  # their workers die with them (parent_watch)
        agent.kill()


def test_a_lost_node_and_its_rejoin_keep_the_losses(tmp_path: Path, agents: list[_Agent]) -> None:
    cluster = load_cluster(example_path())  # three node groups of one 2-GPU node each
    original = plan(cluster, "tiny", build_job(global_batch=8, seq_len=64))
    used_nodes = sorted({cluster.node_of(rank).index for rank in original.used_ranks})
    killed = cluster.nodes[used_nodes[0]]  # the plan trains there: its leader's node
    others = [node for node in cluster.nodes if node != killed]
    plan_path, checkpoints, metrics = tmp_path / "plan.json", tmp_path / "ckpt", tmp_path / "m"
    save_plan(original, plan_path)
    # The uninterrupted run, in this process while the agents wait on each other.
    reference: list[list[float]] = []
    config = TrainConfig(steps=STEPS, optimizer=OptimizerConfig(lr=LR), measure_memory=False)

    def train_uninterrupted() -> None:
        summary = train_reference(original.model, original.job, config, print_line=lambda _: 0)
        reference.append(list(summary.losses))

    uninterrupted = threading.Thread(target=train_uninterrupted, daemon=True)
    uninterrupted.start()
    port = _free_port()

    def start(node_name: str, *, host: bool, pace: str, attempt: int = 0) -> _Agent:
        conf = f"is_host={int(host)},{RDZV_CONF}"
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2:3"]
        command += ["--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-id", "elastic"]
        command += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", conf]
        command += ["--max-restarts", "3", "--monitor-interval", "0.5", str(DRIVER)]
        command += ["--plan", str(plan_path), "--steps", str(STEPS), "--lr", str(LR)]
        command += ["--checkpoint-dir", str(checkpoints), "--checkpoint-every", "2"]
        command += ["--metrics", str(metrics), "--collective-timeout", "30", "--pace", pace]
        # The killed node is named as piebald launch names it, the others by the flag.
        env = _env(PIEBALD_NODE=node_name) if node_name == killed.name else _env()
        if node_name != killed.name:
            command += ["--node-name", node_name]
        agent = _Agent(command, log=tmp_path / f"{node_name}.{attempt}.log", env=env)
        agents.append(agent)
        return agent

    # The rendezvous host first: losing it would end the job (pytorch#67742).
    # Each plan's leader sleeps after its step lines (--pace WORLD=S), so that the test
    # acts between steps: the first plan's 0.3 s until the kill, the survivors' plan's
    # 1.5 s until the rejoin (which cuts it short), none after.
    started = time.monotonic()
    survivors = [start(others[0].name, host=True, pace="4=1.5")]
    time.sleep(0.3)
    survivors.append(start(others[1].name, host=False, pace="4=1.5"))
    lost = start(killed.name, host=False, pace="6=0.3")

    def lines_of(*chosen: _Agent, since: dict[int, int] | None = None) -> list[str]:
        """The output of ``chosen`` (after ``since``'s line counts, by process id)."""
        start = since or {}
        return [
            line for agent in chosen for line in agent.lines()[start.get(agent.process.pid, 0) :]
        ]

    def mark() -> dict[int, int]:
        return {agent.process.pid: len(agent.lines()) for agent in agents}

    def step_lines(*chosen: _Agent, since: dict[int, int] | None = None) -> list[int]:
        lines = lines_of(*chosen, since=since)
        return [int(m.group(1)) for line in lines if (m := STEP_LINE.match(line))]

    _wait_for("step 5", lambda: 5 in step_lines(lost), agents)
    workers = children(lost.process.pid)
    assert len(workers) == killed.num_gpus, workers
    at_kill = mark()
    lost.kill()  # the node's agent; its workers die with it
    killed_at = time.monotonic()
    _wait_for("the killed node's workers gone", lambda: not _alive(workers), [])
    _wait_for(
        "a step on the survivors' plan", lambda: step_lines(*survivors, since=at_kill), survivors
    )
    recovery_s = time.monotonic() - killed_at
    (shrunk,) = [
        line for line in lines_of(*survivors, since=at_kill) if line.startswith("elastic:")
    ]
    live = ", ".join(node.name for node in others)
    assert f"2 of 3 nodes live ({live})" in shrunk, shrunk
    resumed = re.search(r"resuming from .*step-(\d+)$", shrunk)
    assert resumed is not None, shrunk
    # Started again once the survivors' plan has written a checkpoint of its own.
    newer = checkpoints / f"step-{int(resumed.group(1)) + 2:08d}"
    _wait_for(newer.name, lambda: (newer / "manifest.json").is_file(), survivors)
    at_rejoin = mark()
    rejoined = start(killed.name, host=False, pace="", attempt=1)
    for agent in [*survivors, rejoined]:
        agent.process.wait(timeout=DEADLINE_S)
        assert agent.process.returncode == 0, "\n".join(agent.lines()[-40:])
    wall_s = time.monotonic() - started

    # The survivors' plan beside the checkpoints, and the first plan back at the end.
    files = {path.name: load_plan(path) for path in checkpoints.glob("plan-*.json")}
    first_file = f"plan-{plan_digest(original)}.json"
    assert first_file in files and len(files) == 2, sorted(files)
    (small,) = [p for name, p in files.items() if name != first_file]
    assert [node.name for node in small.cluster.nodes] == [node.name for node in others]
    assert small.job == original.job
    (back,) = [
        line
        for line in lines_of(*survivors, rejoined, since=at_rejoin)
        if line.startswith("elastic:")
    ]
    assert "3 of 3 nodes live" in back and first_file in back and "resuming from" in back, back
    assert STEPS in step_lines(rejoined)  # the first plan's leader trains there again

    # Every step's loss, the last line of a step trained twice, as uninterrupted.
    records = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        records[record["step"]] = record["loss"]
    assert sorted(records) == list(range(1, STEPS + 1))
    losses = [records[step] for step in range(1, STEPS + 1)]
    uninterrupted.join(timeout=DEADLINE_S)
    assert losses == pytest.approx(reference[0], rel=1e-5, abs=1e-5)
    print(f"elastic torchrun: kill -> first step {recovery_s:.1f} s, whole run {wall_s:.1f} s")

    # Started again, a complete run ends at once: exit 0, nothing trained or written.
    before = metrics.read_text()
    node = others[0]
    command = [sys.executable, str(DRIVER), "--plan", str(plan_path), "--steps", str(STEPS)]
    command += ["--checkpoint-dir", str(checkpoints), "--metrics", str(metrics)]
    command += ["--node-name", node.name]
    port = _free_port()
    again = [
        subprocess.Popen(
            command,
            env=_env(**_torchrun_env(local, node.num_gpus, port=port)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for local in range(node.num_gpus)
    ]
    outputs = [process.communicate(timeout=DEADLINE_S) for process in again]
    assert [process.returncode for process in again] == [0] * node.num_gpus, outputs
    assert f"step-{STEPS:08d} reaches step {STEPS}: the run is complete" in outputs[0][0]
    assert not any(STEP_LINE.match(line) for out, _ in outputs for line in out.splitlines())
    assert metrics.read_text() == before


def _torchrun_env(rank: int, world_size: int, *, port: int) -> dict[str, str]:
    """What torchrun sets for a worker of a one-node world (its local rank = its rank)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _alive(pids: list[int]) -> bool:
    return any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in pids)


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "Z"
    return stat[stat.rindex(")") + 2]


def test_a_stopped_peer_fails_the_survivor_within_the_timeout(tmp_path: Path) -> None:
    """B7 of docs/research: a peer that stops answering in the middle of a step (SIGSTOP:
    nothing closes its connections) is a failure after the collective timeout, not a
    hang. Two workers of a 1+1 pipeline, as torchrun would start them."""
    two = make_plan(
        [
            StageSpec(layer_end=3, ranks=(0,), num_micro_batches=(2,), fractions=(1.0,)),
            StageSpec(layer_end=6, ranks=(1,), num_micro_batches=(2,), fractions=(1.0,)),
        ],
        num_gpus=2,
    )
    path = tmp_path / "plan.json"
    save_plan(two, path)
    timeout_s = 5.0
    port = _free_port()
    command = [sys.executable, str(DRIVER), "--plan", str(path), "--steps", "100"]
    command += ["--node-name", two.cluster.nodes[0].name, "--pace", "2=0.2"]
    command += ["--collective-timeout", str(timeout_s), "--checkpoint-dir", str(tmp_path / "c")]
    ranks = []
    for rank in range(2):
        ranks.append(
            subprocess.Popen(
                command,
                env=_env(**_torchrun_env(rank, 2, port=port)),
                stdout=(tmp_path / f"out.{rank}").open("w"),
                stderr=(tmp_path / f"err.{rank}").open("w"),
            )
        )
    survivor, stopped = ranks
    try:
        # Rank 0 leads: after its step line it sleeps, while rank 1 waits inside the next
        # step for its activations.
        deadline = time.monotonic() + DEADLINE_S
        while "step     2" not in (tmp_path / "out.0").read_text():
            assert survivor.poll() is None and time.monotonic() < deadline, (
                tmp_path / "err.0"
            ).read_text()[-3000:]
            time.sleep(0.05)
        stopped.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        reported_s = None  # when its error is written
        while survivor.poll() is None and time.monotonic() < stopped_at + timeout_s + 60:
            if reported_s is None and TIMEOUT_WORDS.search((tmp_path / "err.0").read_text()):
                reported_s = time.monotonic() - stopped_at
            time.sleep(0.05)
        failed_after_s = time.monotonic() - stopped_at
    finally:
        for process in ranks:
            process.kill()
            process.wait()
    errors = (tmp_path / "err.0").read_text()
    assert survivor.returncode not in (None, 0), errors[-3000:]
    assert TIMEOUT_WORDS.search(errors), errors[-3000:]
    reported = "no error" if reported_s is None else f"error after {reported_s:.1f} s"
    timing = f"{reported}, exit after {failed_after_s:.1f} s"
    assert failed_after_s <= timeout_s + 10, (timing, errors[-3000:])
    print(f"stopped peer, timeout {timeout_s:g} s: {timing}")
