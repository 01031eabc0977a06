"""Elastic emulated training (``piebald train --emulate --elastic``): a node that is lost,
leaves or joins changes the plan, not the run's fate (docs/guides/elastic.md).

This process supervises the emulated nodes. Each start of the workers runs one plan
(``emulate.SegmentRunner``); when it ends before the last step:

- **lost**: some workers were ended by a signal this process did not send (SIGKILL: the
  OOM killer, a preemption, a node gone). Their nodes leave the membership; the others'
  workers are stopped. The run resumes from the newest complete checkpoint, so the steps
  after it are trained again (``lost_steps``).
- **left / joined**: the membership file (``--membership``) was edited. This process asks
  the workers to stop after their current step (``emulate.STOP_REQUEST``); they agree on the
  step, save a checkpoint of it and exit, and the run resumes there: nothing is trained
  twice (``lost_steps`` 0).

Either way the live nodes get a new plan (``planner.replan``: the same global batch, the
per-GPU micro-batches re-solved; the original plan again when every node is back), written
beside the checkpoints. The batch of a step is a function of (seed, step) alone (docs/
design.md section 3) and any plan trains like one process, so the losses go on as if
nothing had happened. A failure that is not a lost node (a worker's error, bad input)
ends the run as without ``--elastic``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from piebald.errors import RunFailedError, SpecError
from piebald.outputs import open_run_file
from piebald.planner.fallback import plan_for_live_nodes
from piebald.planner.replan import Infeasible
from piebald.runtime.distributed.checkpoint import (
    checkpoint_step,
    find_latest_checkpoint,
    read_checkpoint_info,
)
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import Segment, SegmentRunner, worker_places
from piebald.runtime.training.metrics import RunSummary
from piebald.specs.cluster import ClusterSpec
from piebald.specs.membership import Membership, read_membership
from piebald.specs.plan import Plan
from piebald.specs.plan_io import save_plan

__all__ = ["DEATH_GRACE_S", "MembershipEvent", "MembershipFile", "merge_segments", "run_elastic"]

logger = logging.getLogger(__name__)

# After a worker dies, how long its node's other workers get to be seen dying of the same
# signal before the survivors are stopped (a node's processes are killed within this).
DEATH_GRACE_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipEvent:
    """One change of the live nodes: after which step it was seen, what happened to which
    nodes, the GPUs before and after, the plan written for the new membership, and the
    time it took to notice (``detect_s``), to plan (``replan_s``) and to start again up to
    the first step (``restore_s``: processes, process groups, the checkpoint's load), and
    the steps trained again (``lost_steps``: since the checkpoint resumed from)."""

    step: int
    kind: str  # lost | left | joined
    nodes: tuple[str, ...]
    gpus_before: int
    gpus_after: int
    plan_file: str | None
    detect_s: float
    replan_s: float
    restore_s: float
    lost_steps: int

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["nodes"] = list(self.nodes)
        return data

    def line(self, *, resume_step: int) -> str:
        """The event as the step lines say it, when it is decided (before the restore)."""
        again = f", {self.lost_steps} trained again" if self.lost_steps else ", none lost"
        return (
            f"membership: {', '.join(self.nodes)} {self.kind} after step {self.step} "
            f"({self.gpus_before} -> {self.gpus_after} GPUs); plan "
            f"{self.plan_file or 'as given'} made in {self.replan_s:.1f} s; resuming from "
            f"step {resume_step}{again} (noticed in {self.detect_s:.1f} s)"
        )


class MembershipFile:
    """The membership file an operator edits (``specs.membership``), watched: an edit that
    changes the live nodes is seen by :meth:`poll`. An edit that cannot be read (half
    written, a typo) is said once and ignored until the next edit."""

    def __init__(self, path: Path, cluster: ClusterSpec) -> None:
        self.path = path
        self.cluster = cluster
        self._stamp: tuple[int, int] | None = None
        self._digest: str | None = None
        self.changed_at: float | None = None

    def read(self) -> Membership:
        """The file's membership now (a SpecError if it is not a membership file)."""
        self._remember()
        return read_membership(self.path, self.cluster)

    def poll(self, current: Membership) -> Membership | None:
        """The membership of an edit since the last look, when it differs from
        ``current``; None otherwise."""
        try:
            stamp = self._stat()
        except OSError:
            return None
        if stamp == self._stamp:
            return None
        digest = self._remember()
        try:
            stated = read_membership(self.path, self.cluster)
        except SpecError as error:
            logger.warning("membership file ignored until its next edit: %s", error)
            return None
        if digest is None or stated.live == current.live:
            return None
        self.changed_at = time.time()
        return stated

    def _stat(self) -> tuple[int, int]:
        status = self.path.stat()
        return status.st_mtime_ns, status.st_size

    def _remember(self) -> str | None:
        try:
            self._stamp = self._stat()
            self._digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None
        return self._digest


def run_elastic(
    plan: Plan, config: TrainConfig, *, run_segment: SegmentRunner, source: str
) -> RunSummary:
    """Train ``config.steps`` steps under ``plan`` and, after each change of the live nodes,
    under a new plan for them (the module's docstring). The caller holds the checkpoint
    directory (``config.checkpoint_dir``, required) and has decided where to resume.
    Returns the summary of every step trained, with the changes in
    ``membership_events``."""
    if config.checkpoint_dir is None:
        raise SpecError(
            source=source,
            field="--checkpoint-dir",
            has_value=False,
            expected="a checkpoint directory with --elastic: the run resumes from it",
        )
    everyone = Membership.everyone(plan.cluster)
    watched = (
        MembershipFile(config.membership_path, plan.cluster)
        if config.membership_path is not None
        else None
    )
    membership = watched.read() if watched is not None else everyone
    plans = Plans(original=plan, directory=config.checkpoint_dir, fallbacks=config.fallback_dir)
    segments: list[Segment] = []
    events: list[MembershipEvent] = []
    restoring: list[int] = []  # the events whose restore_s the next start measures
    restarted_at = 0.0
    say = _printer(run_segment.lines_to_stderr)
    while True:
        current, _ = plans.plan_for(membership, step=_resume_step(config))
        stated: list[Membership] = []

        def watch(membership: Membership = membership, stated: list[Membership] = stated) -> None:
            if watched is not None and not stated:
                change = watched.poll(membership)
                if change is not None:
                    stated.append(change)
                    run_segment.request_stop()

        segment = run_segment(
            current,
            config,
            places=worker_places(membership),
            grace_s=DEATH_GRACE_S,
            watch=watch,
        )
        decided_at = time.time()
        segments.append(segment)
        ready_at = segment.progress[0]["time"] if segment.progress else decided_at
        for index in restoring:
            events[index] = replace(events[index], restore_s=max(0.0, ready_at - restarted_at))
        restoring = []
        if segment.summary is not None and segment.stopped_after is None:
            break
        last_step = _last_step(segment, config)
        if segment.stopped_after is not None and stated:
            after, kinds = stated[0], _kinds(membership, stated[0])
            assert watched is not None and watched.changed_at is not None
            detect_s = decided_at - watched.changed_at
        elif segment.stopped_after is not None:  # a stop nobody asked for: cannot happen
            raise RunFailedError(f"the run stopped after step {segment.stopped_after} unasked")
        else:
            dead = segment.outcome.died_of_signal()
            since = segment.outcome.failed_at or decided_at
            if not dead:  # a hang: noticed from the last step done, through the timeout
                dead = _hung(segment, current)
                since = segment.progress[-1]["time"] if segment.progress else since
            if not dead:
                run_segment.raise_failure(
                    segment, checkpoint_dir=config.checkpoint_dir, timeout_s=config.timeout_s
                )
            lost = _nodes_of(dead, membership)
            after, kinds = membership.without(lost), [("lost", lost)]
            if stated:  # an edit seen in the same start is not forgotten
                after = stated[0].without(lost)
                kinds += _kinds(membership.without(lost), after)
            detect_s = decided_at - since
        if not after.live:
            raise RunFailedError(
                f"every node is gone ({', '.join(membership.live)}); the newest checkpoint is "
                f"{find_latest_checkpoint(config.checkpoint_dir)}"
            )
        checkpoint = find_latest_checkpoint(config.checkpoint_dir)
        resume_step = (checkpoint_step(checkpoint) or 0) if checkpoint is not None else 0
        planned_at = time.time()
        _, plan_file = plans.plan_for(after, step=resume_step)
        replan_s = time.time() - planned_at
        config = _resumed(config, checkpoint=checkpoint)
        for kind, nodes in kinds:
            event = MembershipEvent(
                step=last_step,
                kind=kind,
                nodes=nodes,
                gpus_before=membership.num_gpus,
                gpus_after=after.num_gpus,
                plan_file=str(plan_file) if plan_file is not None else None,
                detect_s=detect_s,
                replan_s=replan_s,
                restore_s=0.0,
                lost_steps=last_step - resume_step,
            )
            say(event.line(resume_step=resume_step))
            _record_event(config, event, checkpoint=checkpoint, step=resume_step)
            restoring.append(len(events))
            events.append(event)
        membership = after
        restarted_at = time.time()
    events_data = tuple(event.as_dict() for event in events)
    return replace(merge_segments(segments), membership_events=events_data)


@dataclass(slots=True, kw_only=True)
class Plans:
    """The plan of each membership met: the original for every node, else the stored
    fallback plan (``planner.fallback``, from ``fallbacks``) or a search, once, written
    beside the checkpoints (``plan-from-step-NNNNNNNN.json``)."""

    original: Plan
    directory: Path
    fallbacks: Path | None = None
    made: dict[tuple[str, ...], tuple[Plan, Path | None]] = field(default_factory=dict)

    def plan_for(self, membership: Membership, *, step: int) -> tuple[Plan, Path | None]:
        if membership.is_everyone:
            return self.original, None
        known = self.made.get(membership.live)
        if known is not None:
            return known
        try:
            plan = plan_for_live_nodes(self.original, membership, fallback_dir=self.fallbacks)
        except Infeasible as error:
            raise Infeasible(
                f"after losing nodes, {', '.join(membership.live)} cannot hold the model: {error}"
            ) from None
        path = self._free_path(step)
        save_plan(plan, path)
        self.made[membership.live] = (plan, path)
        return plan, path

    def _free_path(self, step: int) -> Path:
        path = self.directory / f"plan-from-step-{step:08d}.json"
        number = 1
        while path.exists():
            number += 1
            path = self.directory / f"plan-from-step-{step:08d}.{number}.json"
        return path


def _kinds(before: Membership, after: Membership) -> list[tuple[str, tuple[str, ...]]]:
    left = tuple(name for name in before.live if name not in set(after.live))
    joined = tuple(name for name in after.live if name not in set(before.live))
    return [(kind, nodes) for kind, nodes in (("left", left), ("joined", joined)) if nodes]


def _nodes_of(ranks: tuple[int, ...], membership: Membership) -> tuple[str, ...]:
    places = worker_places(membership)
    indices = {places[rank].group_rank for rank in ranks}
    return tuple(node.name for node in membership.cluster.nodes if node.index in indices)


def _hung(segment: Segment, plan: Plan) -> tuple[int, ...]:
    """The ranks of the nodes that hung: when the first failure was a collective timed out
    (a peer stopped answering), the used ranks of the nodes none of whose used ranks ended
    by themselves (this process killed them after the others had failed)."""
    outcome = segment.outcome
    if outcome.first_failed is None:
        return ()
    failure = segment.scratch / f"failure-{outcome.first_failed}.txt"
    try:
        said = failure.read_text().lower()
    except OSError:
        return ()
    # gloo says "Timed out waiting 5000ms for recv" or "Application timeout caused pair
    # closure", depending on where the wait was.
    if "timed out" not in said and "timeout" not in said:
        return ()
    by_node: dict[int, list[int]] = {}
    for rank in plan.used_ranks:
        by_node.setdefault(plan.cluster.gpus[rank].node_index, []).append(rank)
    return tuple(
        rank
        for ranks in by_node.values()
        if all(rank in outcome.killed for rank in ranks)
        for rank in ranks
    )


def _resume_step(config: TrainConfig) -> int:
    if config.resume_from is None:
        return 0
    return checkpoint_step(config.resume_from) or 0


def _last_step(segment: Segment, config: TrainConfig) -> int:
    """The last step the segment finished (the step it started from, if none)."""
    if segment.progress:
        return int(segment.progress[-1]["step"])
    return _resume_step(config)


def _resumed(config: TrainConfig, *, checkpoint: Path | None) -> TrainConfig:
    """``config`` for the next start: from ``checkpoint``, or afresh when the run had not
    saved one yet (its metrics file, this run's own, is emptied for the steps again)."""
    if checkpoint is None:
        if config.metrics_path is not None and config.metrics_path.is_file():
            os.truncate(config.metrics_path, 0)
        return replace(config, resume=False, resume_from=None)
    return replace(config, resume=True, resume_from=checkpoint)


def _record_event(
    config: TrainConfig, event: MembershipEvent, *, checkpoint: Path | None, step: int
) -> None:
    """The event in the metrics file, as a record of the step resumed from (so the resumed
    run keeps it), in its run; ``restore_s`` is not known yet (null)."""
    if config.metrics_path is None or checkpoint is None:
        return
    record = {
        **event.as_dict(),
        "step": step,  # the step resumed from
        "after_step": event.step,
        "event": event.kind,
        "restore_s": None,
        "run_id": read_checkpoint_info(checkpoint).run_id,
    }
    descriptor = open_run_file(config.metrics_path, "append", flag="--metrics")
    with os.fdopen(descriptor, "a") as stream:
        stream.write(json.dumps(record) + "\n")


def merge_segments(segments: list[Segment]) -> RunSummary:
    """One summary of the starts of an elastic run: each step's loss as last trained (a
    start that failed reports its steps through its progress records), evaluations as
    last made, counts over every finished start, and the speed, memory and prediction of
    the last start (the one that finished the run)."""
    summaries = [segment.summary for segment in segments if segment.summary is not None]
    assert summaries, "no start finished"
    losses: dict[int, float] = {}
    evals: dict[int, float] = {}
    for segment in segments:
        for record in segment.progress:
            if record.get("loss") is not None:
                losses[int(record["step"])] = float(record["loss"])
        if segment.summary is not None:
            summary = segment.summary
            for index, loss in enumerate(summary.losses):
                losses[summary.first_step + index + 1] = loss
            evals.update(zip(summary.eval_steps, summary.eval_losses, strict=True))
    first_step = min(losses, default=summaries[-1].first_step + 1) - 1
    return replace(
        summaries[-1],
        losses=tuple(losses[step] for step in sorted(losses)),
        first_step=first_step,
        overruns=sum(summary.overruns for summary in summaries),
        paced_operations=sum(summary.paced_operations for summary in summaries),
        skipped_steps=sum(summary.skipped_steps for summary in summaries),
        clamped_values=sum(summary.clamped_values for summary in summaries),
        eval_steps=tuple(sorted(evals)),
        eval_losses=tuple(evals[step] for step in sorted(evals)),
    )


def _printer(to_stderr: bool) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(line, flush=True, file=sys.stderr if to_stderr else sys.stdout)

    return say
