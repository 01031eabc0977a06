"""The price of a hop (``cost.traffic``) against its closed form: latency plus bytes at the
slower of the path's bandwidth and each crossed resource's share, n streams each taking
n S / capacity, stretched by 1 / (1 - rho) for the resource's other traffic (M/G/1-PS)."""

from __future__ import annotations

import pytest

from piebald.cost.traffic import (
    MAX_BACKGROUND,
    BoundaryTraffic,
    Crossing,
    PairHop,
    Way,
    background_stretch,
)


def test_background_stretch_is_one_over_one_minus_the_load_capped() -> None:
    assert background_stretch(0.3, horizon_s=None) == 1.0
    assert background_stretch(0.0, horizon_s=2.0) == 1.0
    assert background_stretch(1.0, horizon_s=2.0) == pytest.approx(2.0, rel=1e-15)
    capped = 1 / (1 - MAX_BACKGROUND)
    assert background_stretch(5.0, horizon_s=2.0) == pytest.approx(capped, rel=1e-15)


@pytest.mark.parametrize(
    ("streams", "capacity", "background_s", "horizon_s"),
    [
        (1, 1e9, 0.0, None),  # the path's bandwidth binds
        (4, 1e9, 0.0, None),  # four streams share the resource
        (1, 2.5e8, 0.0, 1.0),  # a slower resource than the path
        (2, 1e9, 0.25, 1.0),  # two streams, a quarter of the step taken by other traffic
        (3, 1e9, 0.9, 1.0),  # more load than the cap
    ],
)
def test_a_way_takes_latency_plus_bytes_at_its_share(
    streams: int, capacity: float, background_s: float, horizon_s: float | None
) -> None:
    latency_s, bandwidth, num_bytes = 2e-5, 1e9, 3e6
    way = Way(
        latency_s=latency_s,
        bandwidth_bytes_per_s=bandwidth,
        crossings=(
            Crossing(streams=streams, capacity_bytes_per_s=capacity, background_s=background_s),
        ),
    )
    load = min(background_s / horizon_s, MAX_BACKGROUND) if horizon_s else 0.0
    rate = min(bandwidth, capacity / streams * (1 - load))
    expected = latency_s + num_bytes / rate
    assert way.seconds(num_bytes, horizon_s=horizon_s) == pytest.approx(expected, rel=1e-12)


def test_a_boundarys_hop_is_its_slowest_pairs_there_and_back() -> None:
    def way(bandwidth: float) -> Way:
        return Way(latency_s=1e-6, bandwidth_bytes_per_s=bandwidth, crossings=())

    fast = PairHop(num_bytes=1e6, there=way(1e9), back=way(1e9))
    slow = PairHop(num_bytes=1e6, there=way(1e9), back=way(1e8))
    boundary = BoundaryTraffic(busy_s=1.0, pairs=(fast, slow))
    expected = (1e-6 + 1e6 / 1e9) + (1e-6 + 1e6 / 1e8)
    assert boundary.hop_s(horizon_s=None) == pytest.approx(expected, rel=1e-12)
    assert BoundaryTraffic(busy_s=0.0, pairs=()).hop_s(horizon_s=1.0) == 0.0
