"""The state of one search: its inputs, the DP's price of a structure (cached by node
signature), the candidates priced so far, and the exact build of a candidate into a plan."""

from __future__ import annotations

import itertools
import math

from piebald.cost.compute import EfficiencyCurve
from piebald.cost.plan_estimate import estimate_plan
from piebald.cost.traffic import BoundaryTraffic
from piebald.planner.layer_ranges import Positions
from piebald.planner.partition import split_layers, uniform_bounds
from piebald.planner.proxy import ShareTrips, pipeline_proxy, polish_bounds, share_round_trips
from piebald.planner.raised_in_flight import raise_in_flight
from piebald.planner.search.records import Candidate, ScoredPlan, Stages
from piebald.planner.search.settings import SearchSettings
from piebald.planner.stage_builder import StageChoice, build_stage
from piebald.planner.stage_costs import RangePrices, StageCost, price_ranges
from piebald.planner.stage_settings import StageSettings, stage_settings
from piebald.planner.strategies import Strategy
from piebald.planner.structure_traffic import NodeSignatures, Signature, StructureTraffic
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan, Schedule, round_robin_routes

__all__ = ["SearchState"]

# The DP prices the ranges whose lower bound is within this factor of its lower bounds'
# split's bottleneck first (a wider guess prices more ranges at once, a narrower one
# misses the split more often).
_GUESS = 1.5
_SETTINGS_KEPT = 256  # stages' settings kept for reuse (about 2 MB each for a 70B model)


class SearchState:
    """Inputs, caches and the candidates found so far."""

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        model: ModelSpec,
        job: JobSpec,
        strategy: Strategy,
        curve: EfficiencyCurve,
        settings: SearchSettings,
    ) -> None:
        self.cluster, self.model, self.job = cluster, model, job
        self.strategy, self.curve, self.settings = strategy, curve, settings
        self.costs: dict[tuple[Signature, int, int, int], StageCost] = {}
        self.settings_of: dict[tuple[Signature, bool, bool, int], StageSettings] = {}
        self.candidates: dict[tuple[Stages, int], Candidate] = {}
        self.num_structures = 0
        # Identical node groups price the same: keys use each stage's node signature.
        self.signature = NodeSignatures(cluster)
        self.traffic = StructureTraffic(cluster, model=model, job=job, signatures=self.signature)

    # -- pricing a structure with the DP ------------------------------------------------
    def stage_cost(
        self, ranks: tuple[int, ...], index: int, depth: int, size: int, downstream: int
    ) -> StageCost:
        # Stages with the same GPUs per node of the same groups, in the same ring order, with
        # as many ranks from them to the pipeline's end cost the same: price them once.
        signature = self.signature(ranks)
        neighbors = (index > 0) + (index < depth - 1)
        key = (signature, downstream, neighbors, size)
        if key not in self.costs:
            # Their settings are priced alike for any ranks to the pipeline's end: once,
            # kept for the most recently used (they take memory; stages of one structure
            # come together), priced again where a range is asked for after that.
            alike = (signature, index > 0, index < depth - 1, size)

            def price(ranges: Positions) -> RangePrices:
                settings = self._stage_settings(alike, ranks, index, depth, size)
                return price_ranges(settings, ranks_to_end=downstream, ranges=ranges)

            lower_s = self._stage_settings(alike, ranks, index, depth, size).lower_s
            self.costs[key] = StageCost(price, lower_s=lower_s)
        return self.costs[key]

    def _stage_settings(
        self, alike: tuple[Signature, bool, bool, int], ranks: tuple[int, ...], *shape: int
    ) -> StageSettings:
        """The settings of a stage of ``ranks`` at (index, depth, micro-batch size)
        ``shape``, alike for every stage with the key ``alike``."""
        settings = self.settings_of.pop(alike, None)
        if settings is None:
            index, depth, size = shape
            settings = stage_settings(
                self.cluster,
                model=self.model,
                job=self.job,
                ranks=ranks,
                micro_batch_size=size,
                stage_index=index,
                num_stages=depth,
                rules=self.strategy.stage_rules,
                curve=self.curve,
            )
            if len(self.settings_of) >= _SETTINGS_KEPT:
                del self.settings_of[next(iter(self.settings_of))]
        self.settings_of[alike] = settings
        return settings

    def stage_costs(self, stages: Stages, size: int) -> list[StageCost]:
        depth = len(stages)
        return [
            self.stage_cost(ranks, i, depth, size, sum(len(r) for r in stages[i:]))
            for i, ranks in enumerate(stages)
        ]

    def price(self, stages: Stages, size: int) -> float:
        """The DP's step-time estimate of a structure (inf if nothing fits); remembered."""
        self.num_structures += 1
        costs = self.stage_costs(stages, size)
        num_layers = self.model.num_layers
        if self.strategy.uniform_layers:
            for cost, (a, b) in zip(
                costs, itertools.pairwise(uniform_bounds(num_layers, len(stages))), strict=True
            ):
                cost.ensure_at(a, b)
            value, bounds = self.strategy.split_layers(
                [c.cost_s for c in costs], num_layers=num_layers
            )
        else:
            # The DP's split takes no range that costs more than its bottleneck: where the
            # ranges priced so far give a split whose bottleneck every stage has priced all
            # ranges below (by their lower bounds), it is the split. Otherwise price the
            # ranges below a guess a little above the lower bounds' split's bottleneck, and
            # where the split found then exceeds the guess, those below it
            # (docs/design.md, section 6).
            priced_below = min(c.priced_below for c in costs)
            value, bounds = (
                split_layers([c.cost_s for c in costs])
                if math.isfinite(priced_below)
                else (math.inf, ())
            )
            if not value <= priced_below:
                bound, _ = split_layers([c.lower_s for c in costs])
                if not math.isfinite(bound):
                    return math.inf  # nothing fits where even the bounds do not
                for cost in costs:
                    cost.ensure_below(bound * _GUESS)
                value, bounds = split_layers([c.cost_s for c in costs])
                if not value <= min(c.priced_below for c in costs):
                    for cost in costs:
                        cost.ensure_below(value)
                    value, bounds = split_layers([c.cost_s for c in costs])
        if not math.isfinite(value):
            return math.inf
        proxy = pipeline_proxy(costs, bounds, *self.shape(stages, size))
        key = (stages, size)
        if key not in self.candidates or proxy < self.candidates[key].proxy_s:
            self.candidates[key] = Candidate(
                proxy_s=proxy, stages=stages, bounds=bounds, micro_batch_size=size
            )
        return proxy

    def absorb(self, found: dict[tuple[Stages, int], Candidate], *, num_structures: int) -> None:
        """Candidates another process priced (``parallel.run_tasks``), and its count of
        structures priced: each kept where new or faster, as ``price`` keeps its own."""
        self.num_structures += num_structures
        for key, candidate in found.items():
            if key not in self.candidates or candidate.proxy_s < self.candidates[key].proxy_s:
                self.candidates[key] = candidate

    def polished(self, candidate: Candidate) -> Candidate:
        """The candidate with its layer split polished against the full step proxy."""
        if not self.strategy.moves_layer_bounds:
            return candidate
        stages, size = candidate.stages, candidate.micro_batch_size
        costs = self.stage_costs(stages, size)
        bounds, proxy = polish_bounds(
            costs,
            candidate.bounds,
            *self.shape(stages, size),
            candidate.proxy_s,
            coarse=self.settings.small_cluster,
        )
        return Candidate(proxy_s=proxy, stages=stages, bounds=bounds, micro_batch_size=size)

    def shape(
        self, stages: Stages, size: int
    ) -> tuple[tuple[BoundaryTraffic, ...], tuple[ShareTrips, ...], tuple[int, ...]]:
        """What the proxy needs of a structure beyond its stage prices: its boundaries'
        traffic, its stages' round trips and their widths."""
        widths = tuple(len(ranks) for ranks in stages)
        trips = share_round_trips(widths, self.job.global_batch_size // size)
        return self.traffic.boundaries(stages, size), trips, widths

    # -- exact construction -------------------------------------------------------------
    def assemble(
        self, candidate: Candidate, sizes_of: dict[int, int] | None = None
    ) -> ScoredPlan | None:
        """The candidate built stage by stage (``stage_builder``), routed, its in-flight
        budgets raised where memory allows (``raised_in_flight``), and priced by the exact
        estimate; None where a stage or a rank does not fit. ``sizes_of``: a
        micro-batch size per rank (default: the candidate's)."""
        depth = len(candidate.stages)
        choices: list[StageChoice] = []
        for index, ranks in enumerate(candidate.stages):
            sizes = tuple((sizes_of or {}).get(r, candidate.micro_batch_size) for r in ranks)
            choice = build_stage(
                self.cluster,
                model=self.model,
                job=self.job,
                ranks=ranks,
                layer_start=candidate.bounds[index],
                layer_end=candidate.bounds[index + 1],
                micro_batch_sizes=sizes,
                stage_index=index,
                num_stages=depth,
                widths=tuple(len(r) for r in candidate.stages[index:]),
                rules=self.strategy.stage_rules,
                curve=self.curve,
            )
            if choice is None:
                return None
            choices.append(choice)
        stages = tuple(choice.stage for choice in choices)
        routes = round_robin_routes(stages)
        plan = Plan(
            cluster=self.cluster,
            model=self.model,
            job=self.job,
            stages=stages,
            routes=routes,
            schedule=Schedule.ONE_F_ONE_B,
        )
        plan = raise_in_flight(plan, curve=self.curve)
        estimate = estimate_plan(plan, curve=self.curve)
        for stage_estimate in estimate.stages:
            for rank, memory in stage_estimate.memory.items():
                if memory.total_bytes > self.cluster.device_of(rank).memory_bytes:
                    return None
        return ScoredPlan(plan=plan, estimate=estimate, strategy=self.strategy.name)
