"""A lowered 1F1B in-flight budget where Little's does not fit memory.

- ``build_stage``: no setting fits with Little's budget, so the stage takes the fewest
  round trips rho whose budgets ceil(n / rho) fit, found against brute force over every rho
  with ``rank_memory`` directly, and records them.
- The layer-split DP's version of the same search (``range_memory.FewestRounds``, closed
  form bounds then bisection over all ranges at once) equals brute force over every rho
  on random instances, with even and with water-filled shards.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from cluster_builders import hand_model
from piebald.cost.in_flight import (
    IN_FLIGHT_SLACK,
    in_flight_for_rounds,
    in_flight_micro_batches,
    slack_of,
    stage_round_trips,
)
from piebald.cost.memory import rank_memory
from piebald.cost.pass_shape import PassShape
from piebald.planner.range_memory import FewestRounds, RankRoom, fits_ranges
from piebald.planner.stage_builder import StageRules, build_stage
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import Schedule, ZeroMode
from piebald.specs.recompute import Recompute

MODEL = hand_model(4)
JOB = JobSpec(global_batch_size=24, seq_len=32)
RULES = StageRules(zero_modes=(ZeroMode.NONE,), recompute=(Recompute.NONE,))
LAYERS = (0, 3)  # embedding and two blocks: the first stage of a deep pipeline
WIDTHS = (2, 2, 4, 4)  # ranks of this stage and of each later one
RANKS_TO_END = sum(WIDTHS)


def _tight_cluster(memory_bytes: float) -> ClusterSpec:
    """A fast and a half-speed GPU of ``memory_bytes`` each, on one node."""
    types: list[dict[str, Any]] = [
        {
            "name": name,
            "memory": f"{memory_bytes:.0f}B",
            "bf16_tflops": tflops,
            "fp16_tflops": tflops,
            "fp32_tflops": tflops / 2,
            "memory_bandwidth": "1TB/s",
        }
        for name, tflops in (("tight-fast", 1.0), ("tight-slow", 0.5))
    ]
    nodes = [
        {"name": "fast", "gpu": "tight-fast", "gpus_per_node": 1, "intra_link": "100GB/s"},
        {"name": "slow", "gpu": "tight-slow", "gpus_per_node": 1, "intra_link": "100GB/s"},
    ]
    return parse_cluster({"name": "tight", "gpu_types": types, "nodes": nodes}, source="test")


def _memory_bytes(cluster: ClusterSpec, rank: int, in_flight: int) -> float:
    device = cluster.device_of(rank)
    return rank_memory(
        MODEL,
        layer_start=LAYERS[0],
        layer_end=LAYERS[1],
        shape=PassShape(
            device=device,
            dtype=device.training_dtype(JOB.precision),
            micro_batch_size=1,
            seq_len=JOB.seq_len,
            recompute=Recompute.NONE,
        ),
        optimizer=JOB.optimizer,
        zero=ZeroMode.NONE,
        shard_fraction=0.5,
        num_in_flight=in_flight,
        num_neighbor_stages=1,
    ).total_bytes


def _capacity_for(in_flight: int) -> float:
    """A memory size holding ``in_flight`` micro-batches plus half of one more (the
    framework reserve grows with the capacity: 5% of it, solved for)."""
    probe = _tight_cluster(1e12)
    empty, one = _memory_bytes(probe, 0, 0), _memory_bytes(probe, 0, 1)
    without_reserve = empty - 0.05 * 1e12
    return (without_reserve + (in_flight + 0.5) * (one - empty)) / 0.95


def _build(cluster: ClusterSpec) -> Any:
    return build_stage(
        cluster,
        model=MODEL,
        job=JOB,
        ranks=(0, 1),
        layer_start=LAYERS[0],
        layer_end=LAYERS[1],
        micro_batch_sizes=(1, 1),
        stage_index=0,
        num_stages=4,
        widths=WIDTHS,
        rules=RULES,
    )


@pytest.mark.parametrize("room", [1, 2, 3, 5])
def test_a_stage_takes_the_fewest_round_trips_that_fit(room: int) -> None:
    cluster = _tight_cluster(_capacity_for(room))
    choice = _build(cluster)
    assert choice is not None
    counts = choice.stage.num_micro_batches
    little = [
        in_flight_micro_batches(
            schedule=Schedule.ONE_F_ONE_B,
            ranks_to_end=RANKS_TO_END,
            rank_micro_batches=n,
            stage_micro_batches=sum(counts),
            slack=0,
            last_stage=False,
        )
        for n in counts
    ]

    def fits(budgets: list[int]) -> bool:
        return all(
            _memory_bytes(cluster, rank, w) <= cluster.device_of(rank).memory_bytes
            for rank, w in enumerate(budgets)
        )

    assert not fits(little)
    fewest = next(
        rounds
        for rounds in range(1, max(counts) + 1)
        if fits(
            [
                in_flight_for_rounds(budget=w, rank_micro_batches=n, num_rounds=rounds)
                for w, n in zip(little, counts, strict=True)
            ]
        )
    )
    expected = tuple(
        in_flight_for_rounds(budget=w, rank_micro_batches=n, num_rounds=fewest)
        for w, n in zip(little, counts, strict=True)
    )
    assert choice.stage.max_in_flight == expected
    assert max(expected) <= room < max(little)
    little_rounds = max(math.ceil(n / w) for n, w in zip(counts, little, strict=True))
    rounds = max(math.ceil(n / w) for n, w in zip(counts, expected, strict=True))
    assert rounds == fewest > little_rounds
    assert choice.round_trip_factor == rounds / little_rounds


def test_nothing_fits_with_even_one_micro_batch_in_flight() -> None:
    cluster = _tight_cluster(_capacity_for(0))  # half a micro-batch of room
    assert _build(cluster) is None


def _littles(counts: tuple[int, ...], slack: int) -> tuple[int, ...]:
    return tuple(
        in_flight_micro_batches(
            schedule=Schedule.ONE_F_ONE_B,
            ranks_to_end=RANKS_TO_END,
            rank_micro_batches=n,
            stage_micro_batches=sum(counts),
            slack=slack,
            last_stage=False,
        )
        for n in counts
    )


def test_littles_budget_and_its_slack_when_they_fit() -> None:
    choice = _build(_tight_cluster(_capacity_for(12)))
    assert choice is not None
    assert choice.stage.max_in_flight is None  # the default: stage_in_flight's
    assert choice.round_trip_factor == 1.0
    slack = slack_of(schedule=Schedule.ONE_F_ONE_B, widths=WIDTHS)
    assert slack == IN_FLIGHT_SLACK > 0
    roomy = _littles(choice.stage.num_micro_batches, slack)
    assert max(roomy) <= 12


def test_littles_budget_without_its_slack_where_only_that_fits() -> None:
    probe = _build(_tight_cluster(_capacity_for(12)))
    assert probe is not None
    counts = probe.stage.num_micro_batches
    little, roomy = _littles(counts, 0), _littles(counts, IN_FLIGHT_SLACK)
    assert max(roomy) > max(little)
    choice = _build(_tight_cluster(_capacity_for(max(little))))
    assert choice is not None
    assert choice.stage.num_micro_batches == counts
    assert choice.stage.max_in_flight == little  # recorded: not the default
    assert choice.round_trip_factor == 1.0


# -- the DP's search over every range at once ----------------------------------------------


def _random_kinds(
    rng: random.Random, *, size: int
) -> tuple[list[RankRoom], list[np.ndarray[Any, np.dtype[np.float64]]]]:
    """Random GPU types of a stage over ``size`` ranges, and each one's Little's budget."""
    kinds, littles = [], []
    for _ in range(rng.randint(1, 3)):
        micro_batches = np.array([float(rng.randint(1, 40)) for _ in range(size)])
        littles.append(np.array([float(rng.randint(1, int(n))) for n in micro_batches]))
        kinds.append(
            RankRoom(
                count=rng.randint(1, 4),
                free_bytes=np.array([rng.uniform(-5.0, 60.0) for _ in range(size)]),
                per_in_flight_bytes=np.array([rng.uniform(0.0, 4.0) for _ in range(size)]),
                sharded_bytes=np.array([rng.uniform(0.0, 30.0) for _ in range(size)]),
                micro_batches=micro_batches,
            )
        )
    return kinds, littles


def _fits(
    kinds: list[RankRoom],
    littles: list[np.ndarray[Any, np.dtype[np.float64]]],
    rounds: float | None,
    *,
    even_shards: bool,
) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Where every rank fits with Little's budgets (``rounds`` None) or with those of
    ``rounds`` round trips."""
    budgets = [
        little
        if rounds is None
        else in_flight_for_rounds(
            budget=little, rank_micro_batches=kind.micro_batches, num_rounds=rounds
        )
        for kind, little in zip(kinds, littles, strict=True)
    ]
    num_ranks = sum(int(kind.count) for kind in kinds)
    return fits_ranges(kinds, budgets, even_shards=even_shards, num_ranks=num_ranks)


@pytest.mark.parametrize("even_shards", [True, False], ids=["even", "water-filled"])
def test_the_dps_fewest_round_trips_match_brute_force(even_shards: bool) -> None:
    # The DP's search (``FewestRounds.rounds_at``: closed-form bounds, then bisection over
    # every range at once) against trying every rho from Little's round trips up.
    rng = random.Random(11 + even_shards)
    size = 200
    shrunk_somewhere = 0
    for _ in range(20):
        kinds, littles = _random_kinds(rng, size=size)
        num_ranks = sum(int(kind.count) for kind in kinds)
        fits_little = _fits(kinds, littles, None, even_shards=even_shards)
        positions = np.flatnonzero(~fits_little)
        little = stage_round_trips([k.micro_batches for k in kinds], littles)
        fewest = FewestRounds(kinds, even_shards=even_shards, num_ranks=num_ranks)
        rounds = fewest.rounds_at(positions, little[positions])
        assert np.all(fewest.low_at(positions, little[positions]) <= rounds)
        most = np.maximum.reduce([k.micro_batches for k in kinds])
        for i, found in zip(positions, rounds, strict=True):
            expected = next(
                (
                    rho
                    for rho in range(int(little[i]), int(most[i]) + 1)
                    if _fits(kinds, littles, rho, even_shards=even_shards)[i]
                ),
                None,
            )
            if expected is None:
                assert math.isinf(found)
            else:
                assert found == expected
                shrunk_somewhere += 1
    assert shrunk_somewhere > 50
