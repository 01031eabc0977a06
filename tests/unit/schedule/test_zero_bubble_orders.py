"""Zero bubble family orders (``schedule.actions``, ``generators``, ``replay``).

- golden step times on equal stages: 1F1B (m + p - 1)(F + B + W), ZB-H1
  m(F + B + W) + (p - 1)(F + B - W), interleaved m(F + B + W) + (p - 1)(F + B + W)/v;
- the research note's table of torch's orders on unequal ranks (schedules_and_elasticity.md
  A.4, p = 4, m = 8), reproduced to the unit;
- peaks in flight: p for 1F1B and ZB-H1, 2p - 1 for ZB-2p at its first stage, ZB-V no
  higher than 1F1B in the paper's units (a V chunk holds half a stage);
- the validator and the deadlock report;
- a property: on random unequal stages and caps, the heterogeneous generator is never
  slower than a fixed schedule that fits the caps (1F1B, ZB-H1, ZB-2p: the ones over the
  same stages; interleaved and ZB-V split the model into other stages) and stays within
  its caps.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from piebald.schedule.actions import Action, ActionKind, PipelineOrders, Placement
from piebald.schedule.generators import (
    heterogeneous,
    interleaved,
    one_f_one_b,
    zb_2p,
    zb_h1,
    zb_v,
)
from piebald.schedule.replay import PassTimes, PipelineDeadlockError, replay

F, B, W, BW = ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW
SHAPES = [(p, m) for p in (2, 3, 4, 6) for m in (p, 2 * p, 3 * p)]
EQUAL_TIMES = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.5, 0.5)]


def _equal(p: int, f: float, b: float, w: float, *, chunks: int = 1) -> list[PassTimes]:
    """p ranks of equal stages, each rank's F, B, W split evenly over its chunks."""
    times = PassTimes(forward=f / chunks, backward_input=b / chunks, backward_weight=w / chunks)
    return [times] * (p * chunks)


@pytest.mark.parametrize(("p", "m"), SHAPES)
@pytest.mark.parametrize(("f", "b", "w"), EQUAL_TIMES)
def test_golden_step_times_on_equal_stages(p: int, m: int, f: float, b: float, w: float) -> None:
    for orders in (one_f_one_b(p, m), zb_h1(p, m), zb_2p(p, m)):
        orders.validate()
    assert replay(one_f_one_b(p, m), _equal(p, f, b, w)).makespan == pytest.approx(
        (m + p - 1) * (f + b + w)
    )
    assert replay(zb_h1(p, m), _equal(p, f, b, w)).makespan == pytest.approx(
        m * (f + b + w) + (p - 1) * (f + b - w)
    )
    # ZB-2p's longer warm-up buys nothing in one step here: the last rank starts at
    # (p - 1)F whatever the order, so the paper's (p - 1)(F + B - 2W) (a steady state of
    # tiled steps) is not a one-step makespan; the fixed order ties with ZB-H1.
    assert (
        replay(zb_2p(p, m), _equal(p, f, b, w)).makespan
        <= replay(zb_h1(p, m), _equal(p, f, b, w)).makespan + 1e-9
    )
    for v in (2, 3):
        orders = interleaved(p, v, m)
        orders.validate()
        assert replay(orders, _equal(p, f, b, w, chunks=v)).makespan == pytest.approx(
            m * (f + b + w) + (p - 1) * (f + b + w) / v
        )


@pytest.mark.parametrize(
    ("factors", "expected"),
    [
        # research note A.4: 1F1B, interleaved v=2, ZB-H1 (torch's ZB1P), ZB-V; F = B = W
        # = factor / v per chunk.
        ((1, 1, 1, 1), (33.0, 28.5, 27.0, 25.5)),
        ((1, 1, 2, 2), (60.0, 54.0, 52.0, 50.0)),
        ((2, 2, 1, 1), (56.0, 51.0, 50.0, 49.0)),
        ((1, 1, 1, 1.25), (39.0, 34.5, 33.0, 31.5)),
    ],
)
def test_research_note_table_on_unequal_ranks(
    factors: tuple[float, ...], expected: tuple[float, ...]
) -> None:
    p, m = 4, 8
    got = []
    for orders in (one_f_one_b(p, m), interleaved(p, 2, m), zb_h1(p, m), zb_v(p, m)):
        orders.validate()
        placement = orders.placement
        times = []
        for stage in range(placement.stages):
            each = factors[placement.holder(stage)[0]] / placement.chunks
            times.append(PassTimes(forward=each, backward_input=each, backward_weight=each))
        got.append(replay(orders, times).makespan)
    assert tuple(got) == pytest.approx(expected)


@pytest.mark.parametrize(("p", "m"), SHAPES)
def test_peaks_in_flight(p: int, m: int) -> None:
    times = _equal(p, 1.0, 1.0, 1.0)
    descending = tuple(range(p, 0, -1))
    result = replay(one_f_one_b(p, m), times)
    assert result.peak_in_flight == descending
    assert result.peak_in_flight_freed_at_b == descending
    # ZB-H1: every rank holds p until W (rank r holds back r W's), p - r freed at B.
    result = replay(zb_h1(p, m), times)
    assert result.peak_in_flight == (p,) * p
    assert result.peak_in_flight_freed_at_b == descending
    result = replay(zb_2p(p, m), times)
    assert result.peak_in_flight[0] == min(2 * p - 1, m)
    assert max(result.peak_in_flight) == result.peak_in_flight[0]
    if m >= 2 * p - 1:
        # V chunks hold half a stage each: 2p chunk-micro-batches are 1F1B's p.
        result = replay(zb_v(p, m), _equal(p, 1.0, 1.0, 1.0, chunks=2))
        assert max(result.peak_in_flight) / 2 <= p
        assert result.peak_in_flight == (2 * p,) * p


def test_interleaved_and_zb_v_preconditions() -> None:
    with pytest.raises(ValueError, match="divisible"):
        interleaved(4, 2, 6)
    with pytest.raises(ValueError, match="2p - 1"):
        zb_v(4, 6)
    assert interleaved(4, 2, 8).placement.stage(1, 1) == 5
    v = zb_v(4, 7).placement
    assert [v.stage(rank, 1) for rank in range(4)] == [7, 6, 5, 4]
    assert [v.holder(stage) for stage in (0, 4, 7)] == [(0, 0), (3, 1), (0, 1)]


def test_latency_is_paid_between_ranks_only() -> None:
    f, b, w, lat = 1.0, 2.0, 1.0, 0.25
    for p in (2, 3, 4):
        # one micro-batch: the chain goes down and back, 2(p - 1) hops.
        result = replay(one_f_one_b(p, 1), _equal(p, f, b, w), latency=lat)
        assert result.makespan == pytest.approx(p * (f + b + w) + 2 * (p - 1) * lat)
    # ZB-V on one rank: its turn from stage 0 to stage 1 stays on the rank.
    orders = zb_v(1, 3)
    times = _equal(1, f, b, w, chunks=2)
    assert replay(orders, times, latency=lat).makespan == replay(orders, times).makespan
    assert replay(orders, times).makespan == pytest.approx(3 * (f + b + w))


def _orders(p: int, m: int, *ranks: str) -> PipelineOrders:
    """Orders from strings like "F0 B0 W0 BW1 F1@1" (kind, micro-batch, @chunk)."""
    parsed = []
    for text in ranks:
        actions = []
        for token in text.split():
            head, _, chunk = token.partition("@")
            kind = next(k for k in (BW, F, B, W) if head.startswith(k.value))
            actions.append(
                Action(kind=kind, micro_batch=int(head[len(kind.value) :]), chunk=int(chunk or 0))
            )
        parsed.append(tuple(actions))
    return PipelineOrders(placement=Placement.classic(p), micro_batches=m, orders=tuple(parsed))


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        (("F0 B0 W0", "F0 B0"), r"stage 1 micro-batch 0: has B, F"),
        (("F0 W0 B0", "F0 BW0"), r"rank 0 position 1 \(W0\): comes before its B"),
        (("B0 F0 W0", "F0 BW0"), r"rank 0 position 0 \(B0\): comes before its F"),
        (("F0 F0 BW0", "F0 BW0"), r"rank 0 position 1 \(F0\): repeats rank 0 position 0"),
        (("F0 B0 BW0 W0", "F0 BW0"), r"mixes BW with B/W"),
        (("F0 BW0 F1 BW1", "F0 BW0"), r"micro-batch outside 0..0"),
        (("F0@1 BW0@1", "F0 BW0"), r"no chunk 1 on a rank"),
        (("F0 BW0", "F0 BW0"), r"stage 0 micro-batch 1: has nothing"),
    ],
)
def test_validator_names_the_broken_rule(ranks: tuple[str, str], message: str) -> None:
    m = 2 if "micro-batch 1" in message else 1
    with pytest.raises(ValueError, match=message):
        _orders(2, m, *ranks).validate()


def test_generated_orders_validate() -> None:
    for p in range(1, 6):
        for m in (p, 2 * p + 1):
            for orders in (one_f_one_b(p, m), zb_h1(p, m), zb_2p(p, m)):
                orders.validate()
            if m >= 2 * p - 1:
                zb_v(p, m).validate()
            if m % p == 0:
                interleaved(p, 3, m).validate()


def test_deadlock_names_what_waits_on_what() -> None:
    # Valid per rank, but rank 0 wants micro-batch 0's gradient before it forwards 1,
    # while rank 1 forwards 1 before it does micro-batch 0.
    orders = _orders(2, 2, "F0 BW0 F1 BW1", "F1 BW1 F0 BW0")
    orders.validate()
    with pytest.raises(PipelineDeadlockError) as caught:
        replay(orders, _equal(2, 1.0, 1.0, 1.0))
    text = str(caught.value)
    assert "rank 0 position 1 (BW0, stage 0) waits for the input gradient" in text
    assert "B0 of stage 1 (rank 1 chunk 0" in text
    assert "rank 1 is at position 0 (F1)" in text
    assert "rank 1 position 0 (F1, stage 1) waits for F1 of stage 0 (rank 0 chunk 0)" in text
    assert "rank 0 is at position 1 (BW0)" in text


def test_heterogeneous_rejects_bad_caps() -> None:
    times = _equal(3, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="at least one"):
        heterogeneous(times, [1, 0, 2], 3)
    with pytest.raises(ValueError, match="2 memory caps for 3"):
        heterogeneous(times, [1, 2], 3)


def test_heterogeneous_with_tight_caps_and_latency() -> None:
    times = [
        PassTimes(forward=f, backward_input=b, backward_weight=w)
        for f, b, w in [(1.0, 2.0, 0.5), (3.0, 2.5, 2.0), (0.5, 1.0, 1.0), (2.0, 3.0, 1.0)]
    ]
    caps = [1, 1, 1, 1]
    orders = heterogeneous(times, caps, 8, latency=0.3)
    orders.validate()
    result = replay(orders, times, latency=0.3)
    assert result.peak_in_flight == (1, 1, 1, 1)
    # one micro-batch at a time: m round trips of the whole chain.
    one_trip = sum(t.forward + t.backward_input for t in times) + 6 * 0.3
    assert result.makespan >= 8 * one_trip - 1e-9


@st.composite
def _stages(draw: st.DrawFn) -> tuple[list[PassTimes], list[int], int]:
    p = draw(st.integers(2, 6))
    m = draw(st.integers(p, 3 * p))
    span = st.floats(0.5, 3.0)
    times = []
    for _ in range(p):
        f, b = draw(span), draw(span)
        w = draw(st.floats(0.5, b))
        times.append(PassTimes(forward=f, backward_input=b, backward_weight=w))
    caps = [draw(st.integers(1, 2 * p)) for _ in range(p)]
    return times, caps, m


@pytest.mark.slow  # 200 replays of several schedules: about 15 s
@settings(max_examples=200, deadline=None, derandomize=True)
@given(_stages())
def test_heterogeneous_never_slower_than_a_fixed_schedule_that_fits(
    case: tuple[list[PassTimes], list[int], int],
) -> None:
    times, caps, m = case
    p = len(times)
    orders = heterogeneous(times, caps, m)
    orders.validate()
    result = replay(orders, times)
    assert all(peak <= cap for peak, cap in zip(result.peak_in_flight, caps, strict=True))
    for fixed in (one_f_one_b(p, m), zb_h1(p, m), zb_2p(p, m)):
        other = replay(fixed, times)
        if all(peak <= cap for peak, cap in zip(other.peak_in_flight, caps, strict=True)):
            assert result.makespan <= other.makespan + 1e-9, fixed.name


@pytest.mark.parametrize(
    ("factors", "expected"),
    [
        # slow ranks last: the last rank starts at F0 + F1 + F2 = 4 and then never idles
        # (4 + 8 x 6 = 52, a lower bound), where ZB-H1 and ZB-2p take 54.5.
        ((1, 1, 2, 2), 52.0),
        ((1, 1, 1, 2), 51.0),
        # slow ranks first: 51 against ZB-2p's 52 and ZB-H1's 53.
        ((2, 2, 1, 1), 51.0),
    ],
)
def test_heterogeneous_beats_the_fixed_orders_on_uneven_ranks(
    factors: tuple[float, ...], expected: float
) -> None:
    p, m = 4, 8
    times = [PassTimes(forward=k, backward_input=1.5 * k, backward_weight=0.5 * k) for k in factors]
    caps = [2 * p - 1] * p
    orders = heterogeneous(times, caps, m)
    assert orders.name == "heterogeneous"
    result = replay(orders, times)
    assert result.makespan == pytest.approx(expected)
    assert max(result.peak_in_flight) <= 2 * p - 1
    fixed = min(replay(o, times).makespan for o in (one_f_one_b(p, m), zb_h1(p, m), zb_2p(p, m)))
    assert result.makespan < fixed
