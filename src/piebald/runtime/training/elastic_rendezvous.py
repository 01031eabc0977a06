"""Elastic training under torchrun's elastic agent (``torchrun --nnodes MIN:MAX
--rdzv-backend c10d``, ``piebald launch --elastic``): every (re)start of the workers plans
for the nodes that are live and resumes from the newest checkpoint.

torchrun is "stop the world" (docs/research/torch_distributed.md section 5): a lost node
fails the survivors' workers, a node that waits to join makes every agent stop its
workers, and the agents then meet in a new rendezvous round and start the script again
with new ``RANK`` and ``WORLD_SIZE``. So everything happens at start-up, in every worker:

1. A bootstrap process group (gloo) on torchrun's ranks, from torchrun's store
   (``MASTER_ADDR:MASTER_PORT``, a fresh one each round: torchrun's rank 0 hosts it when
   ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, which ``piebald launch`` sets and which is
   required here: an agent's store shared across rounds keeps the previous round's keys,
   and gloo would connect to dead peers).
2. An all-gather of (node, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``): every worker checks the
   same facts and refuses alike, in one line: a node the cluster file does not name, a
   node whose agent started another number of workers than its GPUs, a node two agents
   claim. A worker's node is ``config.node``, else ``$PIEBALD_NODE`` (what ``piebald
   launch --elastic`` sets: torchrun's own argument parser refuses a ``--node`` after the
   script, as an ambiguous abbreviation of its ``--node-rank``), else its host name.
3. torchrun's rank 0 (the deciding worker) makes the plan of the live membership (the
   given plan when every node is live, else its stored fallback plan from
   ``config.fallback_dir``, else ``planner.replan``: the same global batch),
   writes it beside the checkpoints (``plan-<digest>.json``, never over another file),
   looks for the newest complete checkpoint and broadcasts the plan, a fresh token and
   its verdict.
4. Each worker takes its rank in that plan: node i of the plan's cluster is the i-th live
   node (``Membership.live_nodes``), so the rank is its first rank + ``LOCAL_RANK``. The
   bootstrap group is destroyed and the plan's group made on ``PrefixStore(token)`` over
   the same store, so no key of an earlier group is ever read.
5. The run resumes from the newest complete checkpoint when there is one (the checkpoints
   reshard to any plan); a run whose newest checkpoint is at ``config.steps`` is complete
   and every worker returns at once.

Ranks the plan leaves idle talk to no one, so nothing would tell them that a node was
lost: they wait for the leader's end-of-run message on a gloo group (a killed leader's
closed connections fail the wait at once, and any other training node's loss fails the
leader), and watch one heartbeat per training node in the store (a node silent for the
collective timeout, at most 30 s, fails them: a node that lost its power or network
closes nothing); torchrun then restarts everyone. A worker also dies with its agent
(``parent_watch``): a node whose agent was killed leaves no headless worker training on
an old plan or holding the checkpoint directory's lock.

The rendezvous host (the first node of ``piebald launch``, ``--rdzv-endpoint``) holds
torchrun's rendezvous: losing it ends the job (pytorch#67742).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not in its stubs
from torch.distributed.distributed_c10d import PrefixStore

from piebald.errors import SpecError, error_fields
from piebald.outputs import OutputError
from piebald.planner.fallback import plan_for_live_nodes
from piebald.planner.replan import Infeasible
from piebald.runtime.distributed.checkpoint import find_latest_checkpoint, read_checkpoint_info
from piebald.runtime.parent_watch import die_with_parent
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.metrics import RunSummary
from piebald.runtime.training.plan_support import check_runtime_supports
from piebald.runtime.training.rank_worker import run_rank
from piebald.runtime.training.resume import SUPERSEDED_PREFIX, free_name
from piebald.specs.cluster import ClusterSpec
from piebald.specs.membership import Membership, node_named, some_nodes
from piebald.specs.plan import Plan
from piebald.specs.plan_io import plan_from_dict, plan_to_dict, save_plan

__all__ = [
    "BOOTSTRAP_TIMEOUT_S",
    "HEARTBEAT_S",
    "MAX_SILENCE_S",
    "NODE_VARIABLE",
    "ElasticStart",
    "NodeWorker",
    "check_workers",
    "elastic_start",
    "plan_digest",
    "train_elastic",
]

logger = logging.getLogger(__name__)

PrintLine = Callable[[str], None]

_SOURCE = "piebald train --elastic"
NODE_VARIABLE = "PIEBALD_NODE"  # the cluster file's node a worker runs on (its name or host)
# The bootstrap group waits for the deciding worker, which may search a plan for a large
# cluster (minutes: docs/research/schedules_and_elasticity.md B.2).
BOOTSTRAP_TIMEOUT_S = 600.0
HEARTBEAT_S = 1.0  # a training node's heartbeat period
MAX_SILENCE_S = 30.0  # an idle rank takes a node silent this long (or the timeout) as lost
_DIGEST_CHARS = 12
_DONE_TAG = 0x7E1A  # the leader's "the run ended" to the idle ranks
_FOREVER_S = 30 * 24 * 3600.0  # an idle rank waits for the run, however long it takes


@dataclass(frozen=True, slots=True)
class NodeWorker:
    """What one torchrun worker says of itself at start-up."""

    node: str  # as given: --node, or this machine's host name
    local_rank: int
    local_world_size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ElasticStart:
    """One (re)start's decision, the same in every worker."""

    plan: Plan  # for the live nodes
    membership: Membership
    rank: int  # this worker's rank in ``plan``
    token: str  # unique to this start: the prefix of its process group's keys
    digest: str  # of the plan (its file: plan-<digest>.json beside the checkpoints)
    resume_from: Path | None  # the newest complete checkpoint, None: a fresh run
    complete: bool  # the newest checkpoint is at config.steps: nothing to train


def plan_digest(plan: Plan) -> str:
    """A short SHA-256 of the plan's JSON (sorted keys): its file's name."""
    text = json.dumps(plan_to_dict(plan), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:_DIGEST_CHARS]


def check_workers(cluster: ClusterSpec, workers: Sequence[NodeWorker]) -> Membership:
    """The live membership that torchrun's workers (``workers[r]``: torchrun rank r) form;
    a one-line SpecError for a node the cluster does not name, a node with another number
    of workers than its GPUs, or a node two agents claim (the same local rank twice)."""
    by_node: dict[int, list[NodeWorker]] = {}
    for rank, worker in enumerate(workers):
        node = node_named(cluster, worker.node)
        if node is None:
            raise SpecError(
                source=_SOURCE,
                field="--node-name",
                value=worker.node,
                expected=f"a node of cluster {cluster.name} by name or host "
                f"({some_nodes(cluster)}); "
                f"torchrun rank {rank} runs there (name it with --node-name or "
                f"{NODE_VARIABLE}, or run on a host the cluster file names)",
            )
        by_node.setdefault(node.index, []).append(worker)
    for index, found in sorted(by_node.items()):
        node = cluster.nodes[index]
        local = sorted(worker.local_rank for worker in found)
        sizes = {worker.local_world_size for worker in found}
        if local == list(range(node.num_gpus)) and sizes == {node.num_gpus}:
            continue
        agents = "two agents claim it" if len(set(local)) < len(local) else "its agent started"
        raise SpecError(
            source=_SOURCE,
            field="--node-name",
            value=node.name,
            expected=f"{node.num_gpus} workers on node {node.name} (its GPUs; torchrun "
            f"--nproc-per-node={node.num_gpus}), one agent per node: {agents} "
            f"{len(found)} (local ranks {', '.join(map(str, local))})",
        )
    names = [cluster.nodes[index].name for index in by_node]
    return Membership.of(cluster, names, source=_SOURCE)


def _torchrun_env() -> tuple[int, int, int, int]:
    """RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, as torchrun sets them."""
    missing = [
        name
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        if name not in os.environ
    ]
    if missing:
        raise SpecError(
            source=_SOURCE,
            field="environment",
            value=", ".join(missing) + " unset",
            expected="a worker started by torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, "
            "MASTER_ADDR and MASTER_PORT)",
        )
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True):
        raise SpecError(
            source=_SOURCE,
            field="environment",
            value="TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset",
            expected="torchrun started with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (piebald "
            "launch sets it): the agent's store, shared across restarts, keeps an earlier "
            "round's addresses",
        )
    local_rank = int(os.environ["LOCAL_RANK"])
    return (
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        local_rank,
        int(os.environ.get("LOCAL_WORLD_SIZE", str(local_rank + 1))),
    )


def _torchrun_store(rank: int, *, timeout_s: float) -> TCPStore:
    """torchrun's store of this round: hosted by rank 0 (multi-tenant, as torch's own
    ``env://`` makes it), a client elsewhere."""
    return TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=rank == 0,
        timeout=timedelta(seconds=timeout_s),
        multi_tenant=True,
        wait_for_workers=False,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Verdict:
    """What the deciding worker broadcasts: the plan (JSON) and what to do, or an error."""

    plan_json: str = ""
    digest: str = ""
    token: str = ""
    resume_from: str | None = None
    complete: bool = False
    error: dict[str, object] | None = None  # a SpecError's fields
    failure: str | None = None  # any other error, as one line


def _decide(plan: Plan, membership: Membership, config: TrainConfig) -> _Verdict:
    """The deciding worker's part: the plan for ``membership``, its file, the checkpoint."""
    try:
        chosen = plan_for_live_nodes(plan, membership, fallback_dir=config.fallback_dir)
        check_runtime_supports(chosen)
        data = plan_to_dict(chosen)
        digest = plan_digest(chosen)
        directory = config.checkpoint_dir
        latest = find_latest_checkpoint(directory) if directory is not None else None
        complete = latest is not None and read_checkpoint_info(latest).step >= config.steps
        if directory is not None:
            _write_plan(chosen, directory / f"plan-{digest}.json")
        if latest is None and config.metrics_path is not None:
            _set_metrics_aside(config.metrics_path)
        return _Verdict(
            plan_json=json.dumps(data),
            digest=digest,
            token=secrets.token_hex(8),
            resume_from=None if latest is None else str(latest),
            complete=complete,
        )
    except SpecError as error:
        return _Verdict(error=error_fields(error))
    except Infeasible as error:
        live = ", ".join(membership.live)
        return _Verdict(failure=f"the live nodes ({live}) cannot train the model: {error}")
    except Exception as error:  # told to every worker, so none waits for the decider
        return _Verdict(failure=f"{type(error).__name__}: {error}")


def _write_plan(plan: Plan, path: Path) -> None:
    """The plan beside the checkpoints; an existing file is kept (the same plan, or
    someone's file of that name: then said)."""
    if path.exists():
        try:
            same = plan_to_dict(plan_from_dict(json.loads(path.read_text()), source=str(path)))
        except (OSError, ValueError):
            same = None
        if same != plan_to_dict(plan):
            logger.warning("%s exists and holds another plan: left as it is", path)
        return
    try:
        save_plan(plan, path, flag="--checkpoint-dir")
    except OutputError as error:  # written meanwhile, or not writable: training goes on
        logger.warning("the plan was not written beside the checkpoints: %s", error)


def _set_metrics_aside(path: Path) -> None:
    """A fresh start finds the metrics of earlier attempts that left no checkpoint (under
    another run id, which a later resume would refuse): kept under another name."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    aside = free_name(path.parent, f"{SUPERSEDED_PREFIX}{path.name}")
    path.rename(aside)
    logger.warning(
        "elastic start without a checkpoint: the earlier metrics %s are kept as %s",
        path,
        aside.name,
    )


def elastic_start(
    plan: Plan, config: TrainConfig, *, backend: str, print_line: PrintLine
) -> tuple[ElasticStart, TCPStore]:
    """Steps 1 to 4 of the module docstring: on return the default process group is the
    plan's (``backend``; none when the run is complete), and the store under it (keep it
    alive as long as the group)."""
    rank, world_size, local_rank, local_world_size = _torchrun_env()
    me = NodeWorker(
        node=config.node or os.environ.get(NODE_VARIABLE) or socket.gethostname(),
        local_rank=local_rank,
        local_world_size=local_world_size,
    )
    store = _torchrun_store(rank, timeout_s=max(config.timeout_s, BOOTSTRAP_TIMEOUT_S))
    dist.init_process_group(
        "gloo",
        store=PrefixStore("piebald/bootstrap/", store),
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=max(config.timeout_s, BOOTSTRAP_TIMEOUT_S)),
    )
    try:
        gathered: list[object] = [None] * world_size
        dist.all_gather_object(gathered, me)
        workers = [w for w in gathered if isinstance(w, NodeWorker)]
        membership = check_workers(plan.cluster, workers)  # the same verdict everywhere
        shared: list[object] = [_decide(plan, membership, config) if rank == 0 else None]
        dist.broadcast_object_list(shared, src=0)
        verdict = shared[0]
        assert isinstance(verdict, _Verdict)
    finally:
        dist.destroy_process_group()
    if verdict.error is not None:
        raise SpecError(**verdict.error)  # type: ignore[arg-type]  # error_fields' keywords
    if verdict.failure is not None:
        raise RuntimeError(f"elastic start: {verdict.failure}")
    chosen = plan_from_dict(json.loads(verdict.plan_json), source="elastic plan")
    # Node i of the plan's cluster is the i-th live node.
    position = [node.name for node in membership.live_nodes].index(_node_name(plan, me.node))
    plan_rank = chosen.cluster.nodes[position].first_rank + local_rank
    if chosen.cluster.num_gpus != world_size:  # check_workers makes this impossible
        raise RuntimeError(
            f"elastic start: the plan has {chosen.cluster.num_gpus} ranks, torchrun "
            f"started {world_size} workers"
        )
    start = ElasticStart(
        plan=chosen,
        membership=membership,
        rank=plan_rank,
        token=verdict.token,
        digest=verdict.digest,
        resume_from=None if verdict.resume_from is None else Path(verdict.resume_from),
        complete=verdict.complete,
    )
    if rank == 0:
        print_line(_start_line(start, plan=plan, config=config))
    if start.complete:  # every worker returns: no group
        return start, store
    dist.init_process_group(
        backend,
        store=PrefixStore(f"piebald/{start.token}/", store),
        rank=plan_rank,
        world_size=world_size,
        timeout=timedelta(seconds=config.timeout_s),
    )
    return start, store


def _node_name(plan: Plan, name: str) -> str:
    node = node_named(plan.cluster, name)
    assert node is not None  # check_workers found every worker's node
    return node.name


def _start_line(start: ElasticStart, *, plan: Plan, config: TrainConfig) -> str:
    live = start.membership.live
    nodes = f"{len(live)} of {len(plan.cluster.nodes)} nodes live ({', '.join(live)})"
    where = f"plan-{start.digest}.json" if config.checkpoint_dir is not None else "its plan"
    used = start.plan.cluster.num_gpus - len(start.plan.idle_ranks)
    if start.complete:
        then = f"{start.resume_from} reaches step {config.steps}: the run is complete"
    elif start.resume_from is not None:
        then = f"resuming from {start.resume_from}"
    else:
        then = "starting at step 0"
    return f"elastic: {nodes}; {where}, {used} ranks training; {then}"


def train_elastic(
    plan: Plan,
    config: TrainConfig,
    *,
    backend: str,
    print_line: PrintLine | None = None,
) -> RunSummary | None:
    """Train this torchrun worker elastically (module docstring); the plan's leader
    returns the run's summary, the other workers (and every worker of a complete run)
    None."""
    if config.resume_from is not None:
        raise SpecError(
            source=_SOURCE,
            field="--resume-from",
            value=str(config.resume_from),
            expected="no --resume-from: every elastic (re)start resumes from the newest "
            "checkpoint of --checkpoint-dir",
        )
    die_with_parent(os.getppid())  # the agent: killed, it leaves no worker behind
    emit = print_line or (lambda line: print(line, flush=True))
    start, store = elastic_start(plan, config, backend=backend, print_line=emit)
    if start.complete:
        return None
    config = replace(config, resume=start.resume_from is not None)
    try:
        # Before the plan's groups, on every rank alike (groups are made in one order).
        live = _Liveness(store, start=start, silence_s=min(config.timeout_s, MAX_SILENCE_S))
        if start.rank in start.plan.idle_ranks:
            run_rank(start.plan, config, print_line=emit)  # its part of every group, only
            live.wait_for_the_end()
            dist.barrier()
            return None
        live.start_beating()
        try:
            result = run_rank(start.plan, config, print_line=emit)
        finally:
            live.stop_beating()
        live.finished()
        dist.barrier()
        return result.summary
    finally:
        dist.destroy_process_group()  # before the store under it goes


class _Liveness:
    """How the ranks a plan leaves idle learn that the run ended, or that it failed:
    nothing else would tell them, and torchrun restarts only the workers of a node whose
    own workers fail.

    An idle rank waits for one message from the plan's leader (the lowest used rank),
    sent when the run has ended, on a gloo group of the leader and the idle ranks. A
    failing run ends the leader's process too (any training node's loss fails its
    collectives), and its closed connections fail that wait at once. A node that goes
    silent without closing anything (power lost, network cut) is caught by heartbeats:
    each training node's lowest rank adds to a counter in the store every second, and
    an idle rank raises when one stays unchanged for ``silence_s``. Keys under this
    start's token, so no earlier start's are read."""

    def __init__(self, store: TCPStore, *, start: ElasticStart, silence_s: float) -> None:
        self._store = PrefixStore(f"piebald/{start.token}/live/", store)
        self._start = start
        self._silence_s = silence_s
        plan = start.plan
        idle = sorted(plan.idle_ranks)
        # One beating rank per training node: its lowest used rank.
        self._beaters: dict[int, int] = {}
        for rank in range(plan.cluster.num_gpus):
            if rank not in set(idle):
                self._beaters.setdefault(plan.cluster.gpus[rank].node_index, rank)
        self._leader = min(self._beaters.values())
        self._idle = idle
        # Collective: every rank makes it (or none, when no rank is idle).
        self._group = (
            dist.new_group(
                [self._leader, *idle], backend="gloo", timeout=timedelta(seconds=_FOREVER_S)
            )
            if idle
            else None
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _key(self, node: int) -> str:
        return f"beat/{node}"

    def start_beating(self) -> None:
        nodes = [node for node, rank in self._beaters.items() if rank == self._start.rank]
        if not nodes or not self._idle:
            return
        # Its own connection: the store's client is not shared with the training thread.
        client = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=self._silence_s),
        )
        store = PrefixStore(f"piebald/{self._start.token}/live/", client)
        key = self._key(nodes[0])

        def beat() -> None:
            try:
                while not self._stop.is_set():
                    store.add(key, 1)
                    self._stop.wait(HEARTBEAT_S)
            except Exception:  # the store's host is gone: the run is failing anyway
                logger.debug("heartbeat stopped", exc_info=True)

        self._thread = threading.Thread(target=beat, name="piebald-heartbeat", daemon=True)
        self._thread.start()

    def stop_beating(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * HEARTBEAT_S)

    def finished(self) -> None:
        """The leader, after the run's last step: tell every idle rank."""
        if self._start.rank != self._leader or self._group is None:
            return
        done = torch.ones(1)
        sends = [
            dist.isend(done, dst=rank, group=self._group, tag=_DONE_TAG) for rank in self._idle
        ]
        for send in sends:
            if send is not None:
                send.wait()

    def wait_for_the_end(self) -> None:
        """Until the leader says the run ended; its process gone, or a training node
        silent for ``silence_s``, raises (and torchrun restarts everyone)."""
        done = torch.zeros(1)
        receive = dist.irecv(done, src=self._leader, group=self._group, tag=_DONE_TAG)
        assert receive is not None
        outcome: list[BaseException | None] = []

        def wait() -> None:
            try:
                receive.wait(timedelta(seconds=_FOREVER_S))
                outcome.append(None)
            except BaseException as error:  # handed to the main thread
                outcome.append(error)

        waiter = threading.Thread(target=wait, name="piebald-idle-wait", daemon=True)
        waiter.start()
        seen: dict[int, tuple[int, float]] = {}
        while not outcome:
            now = time.monotonic()
            for node in self._beaters:
                count = self._store.add(self._key(node), 0)
                last = seen.get(node)
                if last is None or last[0] != count:
                    seen[node] = (count, now)
                elif now - last[1] > self._silence_s:
                    raise RuntimeError(
                        f"elastic: node {self._node_name(node)} has been silent for "
                        f"{self._silence_s:g} s (lost?); torchrun restarts the workers"
                    )
            waiter.join(HEARTBEAT_S / 2)
        error = outcome[0]
        if error is not None:
            raise RuntimeError(
                f"elastic: the plan's leader (rank {self._leader}, node "
                f"{self._node_name(self._start.plan.cluster.gpus[self._leader].node_index)}) "
                f"is gone ({' '.join(str(error).split())[:200]}); torchrun restarts the workers"
            ) from error

    def _node_name(self, node: int) -> str:
        return self._start.membership.live_nodes[node].name
