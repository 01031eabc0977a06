"""The DP's stage prices choose as the rule says, setting after setting.

``price_ranges`` runs over the pairs (setting, range) of a ``StageSettings`` all at once,
and takes in order only the settings near each range's cheapest; ``stage_cost`` prices a
range where first asked, some ranges at a time. Against brute force on
random settings, range by range in plain Python: Little's budget per rank, the memory
check, the tie rule (within 1e-9, the shorter optimizer step), and where no setting fits
with Little's budget the fewest round trips from Little's on that fit, by linear scan,
priced busy x rho / Little's + sync. Settings are drawn with equal costs and costs a hair,
a little and far apart, so that ties and the near settings' band are exercised.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np

from piebald.planner.range_memory import RankRoom
from piebald.planner.stage_costs import StageCost, stage_cost
from piebald.planner.stage_settings import Setting, StageSettings
from piebald.specs.devices import builtin_catalog

NUM_LAYERS = 12
NUM_RANGES = NUM_LAYERS * (NUM_LAYERS + 1) // 2
DEVICES = tuple(builtin_catalog().values())[:3]
TIE = 1e-9


def _random_settings(rng: random.Random, num_ranks: int) -> list[Setting]:
    num_kinds = rng.randint(1, 3)
    busy = np.array([rng.uniform(1.0, 10.0) for _ in range(NUM_RANGES)])
    sync = np.array([rng.choice([0.0, rng.uniform(0.0, 2.0)]) for _ in range(NUM_RANGES)])
    settings = []
    for _ in range(rng.randint(1, 8)):
        # Costs equal to another setting's, a hair, a little or far apart.
        factor = 1.0 + rng.choice([0.0, 0.0, 3e-10, 5e-7, 1.5e-6, 2.5e-6, 1e-3, 0.3])
        num_groups = rng.choice([d for d in (1, 2, 4) if num_ranks % d == 0 and d <= num_ranks])
        even_shards = rng.random() < 0.4
        kinds, shares = [], []
        for _ in range(num_kinds):
            kinds.append(
                RankRoom(
                    count=rng.randint(1, 3),
                    free_bytes=np.array([rng.uniform(-5.0, 60.0) for _ in range(NUM_RANGES)]),
                    per_in_flight_bytes=np.array(
                        [rng.uniform(0.0, 6.0) for _ in range(NUM_RANGES)]
                    ),
                    # Uneven shards of nothing (a range with no parameters) are left out:
                    # the closed-form bound on rho takes no capacity from them.
                    sharded_bytes=np.array(
                        [
                            rng.choice([0.0 if even_shards else 1.0, rng.uniform(1.0, 30.0)])
                            for _ in range(NUM_RANGES)
                        ]
                    ),
                    micro_batches=np.array([float(rng.randint(1, 30)) for _ in range(NUM_RANGES)]),
                )
            )
            lockstep = rng.random() < 0.2
            shares.append(
                rng.uniform(0.05, 1.0)
                if lockstep
                else np.array([rng.uniform(0.01, 1.0) for _ in range(NUM_RANGES)])
            )
        settings.append(
            Setting(
                busy=busy * factor if rng.random() < 0.7 else busy * rng.uniform(0.5, 2.0),
                sync=sync * factor,
                slowest=np.array([rng.uniform(0.1, 1.0) for _ in range(NUM_RANGES)]),
                optimizer=np.array(
                    [rng.choice([0.5, 1.0, rng.random()]) for _ in range(NUM_RANGES)]
                ),
                num_groups=num_groups,
                devices=DEVICES[:num_kinds],
                kinds=tuple(kinds),
                shares=tuple(shares),
                even_shards=even_shards,
            )
        )
    return settings


def _fits(setting: Setting, r: int, budgets: list[float]) -> bool:
    free = [
        k.free_bytes[r] - b * k.per_in_flight_bytes[r]
        for k, b in zip(setting.kinds, budgets, strict=True)
    ]
    if setting.even_shards:
        return all(
            f >= k.sharded_bytes[r] / setting.num_groups
            for f, k in zip(free, setting.kinds, strict=True)
        )
    capacity = sum(
        k.count * (f / k.sharded_bytes[r] if k.sharded_bytes[r] > 0 else math.inf)
        for f, k in zip(free, setting.kinds, strict=True)
    )
    return all(f >= 0 for f in free) and capacity >= 1.0


def _brute_force(
    settings: list[Setting], *, num_ranks: int, ranks_to_end: int, seen: Counter[str]
) -> list[tuple]:
    """Per range (cost, busy, pass, sync, optimizer, rounds), setting after setting;
    ``seen`` counts the ties and shrunk budgets met."""
    result = []
    for r in range(NUM_RANGES):
        littles = []
        for s in settings:
            groups_to_end = ranks_to_end - num_ranks + s.num_groups
            littles.append(
                [
                    max(1.0, min(k.micro_batches[r], math.ceil(groups_to_end * _at(share, r))))
                    for k, share in zip(s.kinds, s.shares, strict=True)
                ]
            )
        best, best_optimizer, chosen, rounds = math.inf, math.inf, None, 0.0
        for s, little in zip(settings, littles, strict=True):
            cost = s.busy[r] + s.sync[r] if _fits(s, r, little) else math.inf
            tie = math.isfinite(best) and abs(cost - best) <= TIE * best
            seen["tie"] += tie
            if (cost < best and not tie) or (tie and s.optimizer[r] < best_optimizer):
                best, best_optimizer, chosen = cost, s.optimizer[r], s
        if math.isinf(best):
            for s, little in zip(settings, littles, strict=True):
                if not math.isfinite(s.busy[r] + s.sync[r]):
                    continue
                counts = [k.micro_batches[r] for k in s.kinds]
                needed = max(math.ceil(n / w) for n, w in zip(counts, little, strict=True))
                for rho in range(int(needed), int(max(counts)) + 1):
                    budgets = [
                        max(1.0, min(w, math.ceil(n / rho)))
                        for n, w in zip(counts, little, strict=True)
                    ]
                    if _fits(s, r, budgets):
                        cost = s.busy[r] * (rho / needed) + s.sync[r]
                        if cost < best:
                            best, chosen, rounds = cost, s, float(rho)
                            seen["shrunk"] += rho > needed
                        break
        if chosen is None:
            result.append((math.inf, math.inf, math.inf, 0.0, 0.0, 0.0))
        else:
            result.append(
                (
                    best,
                    chosen.busy[r],
                    chosen.slowest[r],
                    chosen.sync[r],
                    chosen.optimizer[r],
                    rounds,
                )
            )
    return result


def _at(share: float | np.ndarray, r: int) -> float:
    return float(share[r]) if isinstance(share, np.ndarray) else share


def _entries(cost: StageCost) -> list[tuple]:
    valid = np.arange(NUM_LAYERS + 1)[:, None] < np.arange(NUM_LAYERS + 1)[None, :]
    fields = (cost.cost_s, cost.busy_s, cost.pass_s, cost.sync_s, cost.optimizer_s, cost.rounds)
    return list(zip(*(f[valid].tolist() for f in fields), strict=True))


def test_stage_cost_chooses_as_brute_force() -> None:
    seen: Counter[str] = Counter()
    for seed in range(40):
        rng = random.Random(seed)
        num_ranks = rng.choice([4, 8])
        settings = _random_settings(rng, num_ranks)
        stage = StageSettings.of(settings, num_ranks=num_ranks, num_layers=NUM_LAYERS)
        for ranks_to_end in (num_ranks, num_ranks + 3, 10 * num_ranks):
            cost = stage_cost(stage, ranks_to_end=ranks_to_end)
            # Priced a few ranges at a time, in any order, the unpriced inf.
            shape = cost.cost_s.shape
            for _ in range(3):
                some = np.array([rng.random() < 0.2 for _ in range(shape[0] * shape[1])])
                cost.ensure(some.reshape(shape))
            assert np.all(np.isinf(cost.cost_s[~cost.priced]))
            cost.ensure(np.ones(shape, dtype=bool))
            got = _entries(cost)
            expected = _brute_force(
                settings, num_ranks=num_ranks, ranks_to_end=ranks_to_end, seen=seen
            )
            assert got == expected, f"seed {seed}, {ranks_to_end} ranks to the end"
            assert np.all(cost.lower_s <= cost.cost_s)
    assert seen["tie"] > 100 and seen["shrunk"] > 100, seen
