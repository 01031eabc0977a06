"""The pipeline step model (``cost.step_model``) against closed forms.

- p equal stages of t per micro-batch, m micro-batches, no traffic: (m + p - 1) t (Huang
  et al. 2019), with each stage's Little's round trips in it (they never bind there).
- A link busier than every stage: the link's busy time plus every pass and both hops.
- Little's bound: a rank holding one micro-batch at a time pays a round trip per
  micro-batch; with a later stage of two ranks, the waits there make the pipeline the root
  of a quadratic (the horizon's fixed point).
- The exposed sync and the optimizer step.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from piebald.cost.in_flight import in_flight_micro_batches, num_round_trips, slack_of
from piebald.cost.step_model import (
    HORIZON_TOLERANCE,
    RESIDUAL_OF_PASS,
    Bottleneck,
    RoundTrip,
    StageTerms,
    settle,
    step_at,
)
from piebald.cost.traffic import BoundaryTraffic, Crossing, PairHop, Way
from piebald.specs.plan import Schedule

QUIET = BoundaryTraffic(busy_s=0.0, pairs=())  # a boundary that costs nothing


def _stage(
    *,
    busy_s: float,
    pass_s: float,
    width: int = 1,
    trips: tuple[RoundTrip, ...] = (),
    sync_s: float = 0.0,
    optimizer_s: float = 0.0,
) -> StageTerms:
    return StageTerms(
        busy_s=busy_s,
        pass_s=pass_s,
        num_working_ranks=width,
        round_trips=trips,
        sync_s=sync_s,
        optimizer_s=optimizer_s,
    )


@pytest.mark.parametrize(("num_stages", "num_micro_batches"), [(1, 1), (2, 2), (3, 8), (5, 7)])
def test_equal_stages_take_m_plus_p_minus_one_passes(
    num_stages: int, num_micro_batches: int
) -> None:
    p, m, t = num_stages, num_micro_batches, 0.125
    stages = []
    for index in range(p):
        budget = in_flight_micro_batches(
            schedule=Schedule.ONE_F_ONE_B,
            ranks_to_end=p - index,
            rank_micro_batches=m,
            stage_micro_batches=m,
            slack=slack_of(schedule=Schedule.ONE_F_ONE_B, widths=[1] * (p - index)),
            last_stage=index == p - 1,
        )
        trip = RoundTrip(rounds=num_round_trips(m, budget), pass_s=t)
        stages.append(_stage(busy_s=m * t, pass_s=t, trips=(trip,)))
    step = settle(stages, [QUIET] * (p - 1))
    assert step.pipeline_s == pytest.approx((m + p - 1) * t, rel=1e-12)
    assert step.step_s == step.pipeline_s
    bubble = (step.pipeline_s - m * t) / step.pipeline_s
    assert bubble == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert step.bottleneck == Bottleneck(stage_index=p - 1, link=False)  # last of equals


def _pair(*, latency_s: float, num_bytes: float, bandwidth: float, streams: int) -> PairHop:
    crossing = Crossing(streams=streams, capacity_bytes_per_s=bandwidth, background_s=0.0)
    way = Way(latency_s=latency_s, bandwidth_bytes_per_s=bandwidth, crossings=(crossing,))
    return PairHop(num_bytes=num_bytes, there=way, back=way)


def test_a_link_busier_than_every_stage_is_the_bottleneck() -> None:
    latency_s, num_bytes, bandwidth, streams = 1e-3, 2e6, 1e9, 2
    hop_s = 2 * (latency_s + streams * num_bytes / bandwidth)  # there and back, two streams
    link = BoundaryTraffic(
        busy_s=3.0,
        pairs=(_pair(latency_s=latency_s, num_bytes=num_bytes, bandwidth=bandwidth, streams=2),),
    )
    stages = [_stage(busy_s=1.0, pass_s=0.25), _stage(busy_s=2.0, pass_s=0.5)]
    step = settle(stages, [link])
    assert step.bottleneck == Bottleneck(stage_index=0, link=True)
    assert str(step.bottleneck) == "link 0->1"
    assert step.hop_s == pytest.approx((hop_s, 0.0), rel=1e-12)
    assert step.micro_batch_s == pytest.approx((0.25 + hop_s, 0.5), rel=1e-12)
    assert step.pipeline_s == pytest.approx(3.0 + 0.25 + hop_s + 0.5, rel=1e-12)


def test_the_bottleneck_stage_still_pays_its_own_hop() -> None:
    pair = _pair(latency_s=0.0, num_bytes=1e6, bandwidth=1e8, streams=1)
    stages = [_stage(busy_s=2.0, pass_s=0.5), _stage(busy_s=1.0, pass_s=0.25)]
    step = step_at(stages, [BoundaryTraffic(busy_s=0.1, pairs=(pair,))], horizon_s=None)
    assert step.bottleneck == Bottleneck(stage_index=0, link=False)
    assert str(step.bottleneck) == "stage 0"
    assert step.pipeline_s == pytest.approx(2.0 + 2 * 0.01 + 0.25, rel=1e-12)


def test_one_micro_batch_in_flight_pays_a_round_trip_per_micro_batch() -> None:
    """Stage 0 runs 4 micro-batches one at a time (budget 1): each goes through stage 1 and
    back before the next starts, 4 x (1 + 1) = 8 s; fill and drain give only 4 + 1."""
    first = _stage(busy_s=4.0, pass_s=1.0, trips=(RoundTrip(rounds=4, pass_s=1.0),))
    second = _stage(busy_s=2.0, pass_s=1.0)
    step = settle([first, second], [QUIET])
    assert step.pipeline_s == pytest.approx(8.0, rel=1e-12)


def test_waits_at_a_later_stage_of_two_ranks_settle_at_the_fixed_point() -> None:
    """Stage 1 has two ranks, so a round trip waits there for the pass it finds running:
    once (the last stage), rho = 2 / T of the time, for 5/18 of a pass. T = 4 (2 + w(T)),
    w(T) = (2 / T) (5 / 18): T^2 - 8 T - 40 / 18 = 0."""
    first = _stage(busy_s=4.0, pass_s=1.0, trips=(RoundTrip(rounds=4, pass_s=1.0),))
    second = _stage(busy_s=2.0, pass_s=1.0, width=2)
    step = settle([first, second], [QUIET])
    assert pytest.approx(5 / 18) == RESIDUAL_OF_PASS
    fixed_point = (8 + math.sqrt(64 + 4 * 40 / 18)) / 2
    assert step.pipeline_s == pytest.approx(fixed_point, rel=10 * HORIZON_TOLERANCE)
    # A chain of one rank per stage waits nowhere: 8 s as above.
    assert settle([first, _stage(busy_s=2.0, pass_s=1.0)], [QUIET]).pipeline_s == 8.0


def test_sync_not_hidden_by_the_drain_is_exposed_then_the_slowest_optimizer_step() -> None:
    """Stage 1 finishes its last backward while stage 0 still drains one micro-batch
    (1 s): of its 3 s sync, 2 s are exposed. Stage 0's 0.5 s has no drain to hide behind;
    the larger exposure counts, then the slower optimizer step."""
    stages = [
        _stage(busy_s=4.0, pass_s=1.0, sync_s=0.5, optimizer_s=0.2),
        _stage(busy_s=4.0, pass_s=1.0, sync_s=3.0, optimizer_s=0.3),
    ]
    step = settle(stages, [QUIET])
    assert step.pipeline_s == pytest.approx(5.0, rel=1e-12)
    assert step.exposed_sync_s == pytest.approx(2.0, rel=1e-12)
    assert step.optimizer_s == 0.3
    assert step.step_s == pytest.approx(5.0 + 2.0 + 0.3, rel=1e-12)


def test_a_busy_resource_stretches_the_hop_until_the_horizon_settles() -> None:
    """One way crosses a resource that other traffic keeps busy b seconds of the pipeline
    T: the way takes S (1 / (1 - b / T)) / B. With one stage of busy 1 s and no pass, the
    pipeline is T = 1 + h(T); the settled step is that fixed point."""
    background_s, alone_s = 0.5, 0.1
    crossing = Crossing(streams=1, capacity_bytes_per_s=1.0, background_s=background_s)
    busy = Way(latency_s=0.0, bandwidth_bytes_per_s=1.0, crossings=(crossing,))
    quiet = Way(latency_s=0.0, bandwidth_bytes_per_s=1.0, crossings=())
    link = BoundaryTraffic(busy_s=0.0, pairs=(PairHop(num_bytes=alone_s, there=busy, back=quiet),))
    stages = [_stage(busy_s=1.0, pass_s=0.0), _stage(busy_s=0.0, pass_s=0.0)]
    step = settle(stages, [link])
    # T = 1 + alone (1 + 1 / (1 - b / T)): T^2 - (1 + 2a + b) T + b (1 + a) = 0.
    a, b = alone_s, background_s
    fixed_point = ((1 + 2 * a + b) + math.sqrt((1 + 2 * a + b) ** 2 - 4 * b * (1 + a))) / 2
    assert step.pipeline_s == pytest.approx(fixed_point, rel=10 * HORIZON_TOLERANCE)
    assert step_at(stages, [link], horizon_s=None).pipeline_s == pytest.approx(1 + 2 * a)


def test_boundaries_must_number_one_fewer_than_stages() -> None:
    with pytest.raises(ValueError, match="2 stages need 1 boundaries"):
        step_at([_stage(busy_s=1.0, pass_s=1.0)] * 2, [], horizon_s=None)


def test_the_drain_that_hides_a_sync_counts_the_hops_unless_told_not_to() -> None:
    """The plan estimate hides stage 1's sync behind stage 0's pass and hop (1 s + 0.5 s);
    the planner's proxy behind the pass alone."""
    pair = _pair(latency_s=0.25, num_bytes=0.0, bandwidth=1.0, streams=1)  # 0.5 s both ways
    stages = [
        _stage(busy_s=4.0, pass_s=1.0),
        _stage(busy_s=4.0, pass_s=1.0, sync_s=3.0),
    ]
    link = BoundaryTraffic(busy_s=0.0, pairs=(pair,))
    assert settle(stages, [link]).exposed_sync_s == pytest.approx(1.5, rel=1e-12)
    assert settle(stages, [link], drain_hops=False).exposed_sync_s == pytest.approx(2.0, rel=1e-12)


def _gpipe_stage(*, m: int, forward_s: float, backward_s: float) -> StageTerms:
    """One rank of m micro-batches under GPipe: all its forwards, then its backwards."""
    return StageTerms(
        busy_s=m * (forward_s + backward_s),
        pass_s=forward_s + backward_s,
        num_working_ranks=1,
        round_trips=(),
        sync_s=0.0,
        optimizer_s=0.0,
        forward_busy_s=m * forward_s,
        forward_pass_s=forward_s,
        backward_busy_s=m * backward_s,
    )


def test_gpipe_equal_stages_take_m_plus_p_minus_one_passes_too() -> None:
    p, m, forward_s, backward_s = 4, 6, 0.1, 0.2
    stages = [_gpipe_stage(m=m, forward_s=forward_s, backward_s=backward_s)] * p
    step = settle(stages, [QUIET] * (p - 1))
    assert step.pipeline_s == pytest.approx((m + p - 1) * (forward_s + backward_s), rel=1e-12)


def test_gpipe_phases_with_different_busiest_stages_take_longer() -> None:
    # Stage 0 is the busiest in the forwards, stage 1 in the backwards: each phase is a
    # pipeline of its own (m forwards of 0.3 then one of 0.2; m backwards of 0.5 then one
    # of 0.3), longer than one stage bounding both (the 1F1B form: 2.8 + 0.6).
    m = 4
    stages = [
        _gpipe_stage(m=m, forward_s=0.3, backward_s=0.3),
        _gpipe_stage(m=m, forward_s=0.2, backward_s=0.5),
    ]
    step = settle(stages, [QUIET])
    assert step.pipeline_s == pytest.approx((m * 0.3 + 0.2) + (m * 0.5 + 0.3), rel=1e-12)
    one_f_one_b = [replace(stage, forward_busy_s=None) for stage in stages]
    assert settle(one_f_one_b, [QUIET]).pipeline_s == pytest.approx(m * 0.7 + 0.6, rel=1e-12)
