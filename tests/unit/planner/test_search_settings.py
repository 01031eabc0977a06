"""The search's settings and strategy hooks against closed forms and the memory model.

- The small-cluster switch and the number of plans built exactly (``SearchSettings``).
- ``improves``: float noise between equal structures never counts as better.
- A strategy's layer split: the DP's bottleneck for piebald (brute force over every split),
  the even split's slowest stage for uniform-layer baselines.
- The most frugal ZeRO mode and recompute a strategy allows keep the fewest bytes
  (``cost.memory.stage_memory_bytes``).
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt
import pytest

from cluster_builders import hand_model
from piebald.cost.memory import stage_memory_bytes
from piebald.cost.pass_shape import PassShape
from piebald.planner.improvement import improves
from piebald.planner.partition import uniform_bounds
from piebald.planner.search.settings import ALL_SIZES_UP_TO, SearchSettings
from piebald.planner.strategies import PIEBALD, STRATEGIES, with_recompute
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import Optimizer
from piebald.specs.plan import ZeroMode
from piebald.specs.recompute import Recompute


@pytest.mark.parametrize(
    ("num_gpus", "small", "num_exact"),
    [
        (1, True, 24),  # small: three times the plans
        (ALL_SIZES_UP_TO, True, 24),
        (ALL_SIZES_UP_TO + 1, False, 8),
        (4096, False, 8),
        (8192, False, 4),  # 8 x 4096 / 8192
        (32768, False, 2),  # never fewer than two
    ],
)
def test_small_clusters_and_the_plans_built_exactly(
    num_gpus: int, small: bool, num_exact: int
) -> None:
    settings = SearchSettings.for_cluster(num_gpus)
    assert settings.small_cluster is small
    assert settings.num_exact_plans == num_exact
    assert settings.refined_depths(3) == ((2, 3, 4) if small else (3,))
    assert settings.most_exhaustive_cuts(5) == (64 if small else 10)


def test_improves_only_beyond_float_noise() -> None:
    assert improves(0.9, 1.0)
    assert not improves(1.0, 1.0)
    assert not improves(1.0 - 1e-12, 1.0)  # rounding between equal structures
    assert improves(1.0, float("inf"))
    assert not improves(float("inf"), float("inf"))


def _random_costs(
    rng: np.random.Generator, num_stages: int, num_layers: int
) -> list[npt.NDArray[np.float64]]:
    costs = []
    for _ in range(num_stages):
        prefix = np.concatenate([[0.0], np.cumsum(rng.uniform(0.5, 2.0, num_layers))])
        cost = prefix[None, :] - prefix[:, None]
        cost[np.tril_indices(num_layers + 1)] = np.inf
        costs.append(cost)
    return costs


@pytest.mark.parametrize("seed", range(5))
def test_a_strategys_layer_split(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_layers, num_stages = 7, 3
    costs = _random_costs(rng, num_stages, num_layers)
    brute = min(
        max(costs[s][bounds[s], bounds[s + 1]] for s in range(num_stages))
        for cuts in itertools.combinations(range(1, num_layers), num_stages - 1)
        for bounds in [(0, *cuts, num_layers)]
    )
    value, bounds = STRATEGIES["piebald"].split_layers(costs, num_layers=num_layers)
    assert value == pytest.approx(brute, rel=1e-12)
    assert max(costs[s][bounds[s], bounds[s + 1]] for s in range(num_stages)) == value
    for name in ("megatron", "sailor", "holmes"):
        value, bounds = STRATEGIES[name].split_layers(costs, num_layers=num_layers)
        assert bounds == uniform_bounds(num_layers, num_stages) == (0, 3, 5, 7)
        assert value == max(costs[s][bounds[s], bounds[s + 1]] for s in range(num_stages))
    assert STRATEGIES["piebald"].moves_layer_bounds
    assert not STRATEGIES["megatron"].moves_layer_bounds


DEVICE = DeviceType(
    name="frugal-test",
    memory_bytes=80e9,
    bf16_flops=1e14,
    fp16_flops=1e14,
    fp32_flops=5e13,
    memory_bandwidth_bytes_per_s=1e12,
)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_most_frugal_setting_keeps_the_fewest_bytes(name: str) -> None:
    rules = STRATEGIES[name].stage_rules
    model = hand_model(4)

    def held(zero: ZeroMode, recompute: Recompute) -> float:
        shape = PassShape(
            device=DEVICE, dtype=Dtype.BF16, micro_batch_size=2, seq_len=64, recompute=recompute
        )
        fixed, sharded = stage_memory_bytes(
            model,
            shape=shape,
            layers=(0, model.num_layers),
            optimizer=Optimizer.ADAMW,
            zero=zero,
            num_in_flight=1,
            num_neighbor_stages=0,
        )
        return float(fixed) + float(sharded) / 4  # an even share of four ranks

    frugal = held(rules.most_frugal_zero, rules.most_frugal_recompute)
    for zero, recompute in itertools.product(rules.zero_modes, rules.recompute):
        assert frugal <= held(zero, recompute)


def test_selective_recompute_is_searched_up_to_its_cluster_size_unless_asked() -> None:
    """piebald searches selective recompute on clusters up to
    ``selective_recompute_up_to`` GPUs; beyond, none and full, unless the user asks for it
    (``plan --recompute``), which holds at any size."""
    limit = PIEBALD.selective_recompute_up_to
    assert limit is not None
    assert Recompute.SELECTIVE in PIEBALD.for_cluster_of(limit).stage_rules.recompute
    beyond = PIEBALD.for_cluster_of(limit + 1).stage_rules.recompute
    assert beyond == (Recompute.NONE, Recompute.FULL)
    asked = with_recompute(PIEBALD, (Recompute.SELECTIVE, Recompute.NONE))
    assert asked is not None
    assert asked.for_cluster_of(100 * limit).stage_rules.recompute == (
        Recompute.NONE,
        Recompute.SELECTIVE,
    )
    assert with_recompute(STRATEGIES["zorse"], (Recompute.NONE,)) is None
