"""The layer-split DP against brute force over every composition of layers into stages."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from piebald.planner.partition import split_layers


def _matrices(
    num_layers: int, stage_weights: list[list[float]], infeasible: set[tuple[int, int, int]]
) -> list[np.ndarray]:
    """cost[s][a, b] = sum of stage s's per-layer weights over [a, b); inf where marked."""
    costs = []
    for s, weights in enumerate(stage_weights):
        prefix = np.concatenate([[0.0], np.cumsum(weights)])
        cost = prefix[None, :] - prefix[:, None]
        cost[np.tril_indices(num_layers + 1)] = np.inf
        for stage, a, b in infeasible:
            if stage == s:
                cost[a, b] = np.inf
        costs.append(cost)
    return costs


def _brute_force(costs: list[np.ndarray], num_layers: int) -> float:
    best = float("inf")
    for cuts in itertools.combinations(range(1, num_layers), len(costs) - 1):
        bounds = (0, *cuts, num_layers)
        value = max(costs[s][bounds[s], bounds[s + 1]] for s in range(len(costs)))
        best = min(best, value)
    return best


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_split_matches_brute_force(data: st.DataObject) -> None:
    num_layers = data.draw(st.integers(1, 8))
    num_stages = data.draw(st.integers(1, num_layers))
    weights = [
        data.draw(st.lists(st.floats(0.1, 10.0), min_size=num_layers, max_size=num_layers))
        for _ in range(num_stages)
    ]
    holes = data.draw(
        st.sets(
            st.tuples(
                st.integers(0, num_stages - 1),
                st.integers(0, num_layers),
                st.integers(0, num_layers),
            ),
            max_size=6,
        )
    )
    costs = _matrices(num_layers, weights, holes)
    value, bounds = split_layers(costs)
    expected = _brute_force(costs, num_layers)
    assert value == pytest.approx(expected) if np.isfinite(expected) else value == np.inf
    if np.isfinite(expected):
        assert bounds[0] == 0 and bounds[-1] == num_layers and len(bounds) == num_stages + 1
        achieved = max(costs[s][bounds[s], bounds[s + 1]] for s in range(num_stages))
        assert achieved == pytest.approx(value)
    else:
        assert bounds == ()


def test_equal_stages_split_evenly() -> None:
    costs = _matrices(12, [[1.0] * 12] * 4, set())
    assert split_layers(costs) == (3.0, (0, 3, 6, 9, 12))


def test_twice_as_fast_stage_takes_twice_the_layers() -> None:
    costs = _matrices(9, [[1.0] * 9, [2.0] * 9], set())
    value, bounds = split_layers(costs)
    assert bounds == (0, 6, 9) and value == 6.0


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="no stages"):
        split_layers([])
    with pytest.raises(ValueError, match="cost matrix"):
        split_layers([np.zeros((3, 3)), np.zeros((4, 4))])
