"""Property: after any sequence of membership changes (losses resuming from the newest
checkpoint, graceful changes from the step they stop at), each step of an elastic run
trains on exactly the samples of the uninterrupted run's step, once: the plans change,
the multiset of rows each step's micro-batches take does not."""

from __future__ import annotations

import functools
import hashlib
from itertools import combinations
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piebald.api import build_job, load_cluster, plan
from piebald.examples import example_path
from piebald.planner.replan import replan
from piebald.runtime.data.batches import batch_offsets
from piebald.runtime.pipeline.rows import micro_batch_rows
from piebald.runtime.training.elastic import merge_segments
from piebald.runtime.training.emulate import Segment, WorkersOutcome
from piebald.runtime.training.metrics import RunSummary
from piebald.specs.membership import Membership
from piebald.specs.plan import Plan

CLUSTER = load_cluster(example_path())
NAMES = tuple(node.name for node in CLUSTER.nodes)
MEMBERSHIPS = tuple(live for size in range(1, len(NAMES) + 1) for live in combinations(NAMES, size))
NUM_TOKENS = 10_000
SEED = 11


@functools.cache
def _original() -> Plan:
    return plan(CLUSTER, "tiny", build_job(global_batch=8, seq_len=64))


@functools.cache
def _plan_of(live: tuple[str, ...]) -> Plan:
    return replan(_original(), Membership(cluster=CLUSTER, live=live))


def _samples(step: int, chosen: Plan) -> float:
    """A fingerprint of the multiset of samples ``chosen``'s micro-batches take at ``step``
    (1-based), as the loss the simulated run reports."""
    offsets = batch_offsets(
        NUM_TOKENS,
        seed=SEED,
        step=step - 1,
        global_batch_size=chosen.job.global_batch_size,
        seq_len=chosen.job.seq_len,
    )
    taken = sorted(int(offsets[row]) for rows in micro_batch_rows(chosen) for row in rows)
    digest = hashlib.sha256(repr(taken).encode()).digest()
    return float(int.from_bytes(digest[:6], "big"))


def _segment(chosen: Plan, *, start: int, end: int, finished: bool, stopped: bool) -> Segment:
    """A start of the workers under ``chosen`` that trained steps start+1..end, as the
    emulator reports it: progress records always, a summary when it exited cleanly."""
    trained = [
        {"step": step, "time": float(step), "loss": _samples(step, chosen)}
        for step in range(start + 1, end + 1)
    ]
    progress = ({"step": start, "time": 0.0, "loss": None}, *trained)
    clean = finished or stopped
    summary = RunSummary(
        steps=end,
        losses=tuple(_samples(step, chosen) for step in range(start + 1, end + 1)),
        tokens_per_s=1.0,
        predicted_tokens_per_s=None,
        emulated=True,
        model_name="tiny",
        first_step=start,
    )
    return Segment(
        outcome=WorkersOutcome(
            exitcodes=(0,) if clean else (-9,),
            first_failed=None if clean else 0,
            killed=frozenset(),
        ),
        summary=summary if clean else None,
        stopped_after=end if stopped else None,
        progress=progress,
        scratch=Path("/nonexistent"),
    )


changes = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=11),  # after this step
        st.booleans(),  # graceful (else lost: back to the newest checkpoint)
        st.sampled_from(MEMBERSHIPS),
    ),
    max_size=4,
)


@pytest.mark.slow  # the example cluster's seven plans: about 15 s
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.integers(min_value=2, max_value=12),
    every=st.integers(min_value=1, max_value=4),
    sequence=changes,
)
def test_every_step_trains_on_the_uninterrupted_runs_samples(
    steps: int, every: int, sequence: list[tuple[int, bool, tuple[str, ...]]]
) -> None:
    segments: list[Segment] = []
    live, position, saved = NAMES, 0, {0}
    for at, graceful, after in sorted(sequence):
        if at <= position or at >= steps:
            continue  # a change before the resume point, or after the run's end
        chosen = _plan_of(live)
        segments.append(_segment(chosen, start=position, end=at, finished=False, stopped=graceful))
        saved |= {step for step in range(position + 1, at + 1) if step % every == 0}
        if graceful:
            saved.add(at)  # the workers save the step they stop at
            position = at
        else:
            position = max(step for step in saved if step <= at)
        live = after
    segments.append(
        _segment(_plan_of(live), start=position, end=steps, finished=True, stopped=False)
    )
    merged = merge_segments(segments)
    original = _original()
    assert merged.first_step == 0
    assert merged.losses == tuple(_samples(step, original) for step in range(1, steps + 1))
