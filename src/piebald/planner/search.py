"""One search over every heterogeneous strategy: coarse structure enumerated, the rest exact.

Enumerated: which node groups take part (leaving a whole group idle is tried and kept only
when faster), the order units line up in (``units.unit_orders``), the pipeline depth, the
micro-batch size, and where the stage cuts fall. Solved exactly for each structure: the
layer split (bottleneck DP over the stage cost matrices, ``partition.split_layers``); then,
for the few best structures, per-stage micro-batch counts (min-makespan), shard fractions
(water-filling), ZeRO mode and recompute (``stage_builder``), priced by the closed-form
plan estimate, which picks the winner.

Cuts are enumerated exhaustively while there are few; otherwise they start at the speed
quantiles and move by halving steps while the DP's bottleneck improves (a local search,
never Zorse's repeated min-cuts or Metis' full enumeration).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.layer_table import pass_times
from piebald.cost.memory import stage_memory_bytes
from piebald.cost.plan_estimate import PlanEstimate, estimate_plan
from piebald.cost.traffic import BoundaryTraffic
from piebald.planner.bounds import diagnose_infeasible, upper_bound_tokens_per_s
from piebald.planner.cuts import depths_to_try, quantile_cuts, required_cuts, stages_of
from piebald.planner.describe import describe_plan
from piebald.planner.partition import split_layers
from piebald.planner.proxy import (
    ShareTrips,
    pipeline_proxy,
    polish_bounds,
    share_round_trips,
    uniform_bounds,
)
from piebald.planner.stage_builder import StageChoice, build_stage
from piebald.planner.stage_costs import StageCost, stage_cost
from piebald.planner.strategies import BASELINES, PIEBALD, Strategy, with_zero_mode
from piebald.planner.structure_traffic import NodeSignatures, StructureTraffic
from piebald.planner.units import GPU_UNITS_UP_TO, Unit, build_units, node_classes, unit_orders
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import JobSpec, check_job_fits_model
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan, RunnerUp, Schedule, ZeroMode, weighted_round_robin

__all__ = ["Infeasible", "ScoredPlan", "SearchResult", "search", "uniform_bounds"]

MICRO_BATCH_SIZES = (1, 2, 4, 8, 16)
EXHAUSTIVE_CUTS_UP_TO = 64  # cut combinations per (order, depth) tried one by one, small
NUM_EXACT = 8  # best structures (by the DP's estimate) built and priced exactly
# Pricing a plan exactly takes time in its GPUs times its stages (every micro-batch's hop
# over every boundary): beyond this many GPUs, fewer structures are priced exactly, so
# that work stays about what it is here (at least MIN_EXACT).
EXACT_FULL_UP_TO_GPUS = 4096
MIN_EXACT = 2
DEPTH_PATIENCE = 3  # stop deepening after this many depths without improvement
TOP_REFINED = 2  # coarse results whose cuts get a local search
SIZE_PATIENCE = 1.1  # a micro-batch size this much slower than the best ends the scan
LOCAL_SEARCH_ROUNDS = 2
ALL_SIZES_UP_TO = GPU_UNITS_UP_TO  # GPUs; small clusters get the thorough treatment
ALL_NODE_SUBSETS_UP_TO = 4  # nodes; small clusters also try leaving any nodes idle

Progress = Callable[[float, str], None]


class Infeasible(Exception):  # noqa: N818 - a planning outcome, not a programming error
    """No plan fits memory; the message says what does not fit and the smallest fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoredPlan:
    plan: Plan
    estimate: PlanEstimate
    strategy: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    best: ScoredPlan
    runners_up: tuple[ScoredPlan, ...]
    upper_bound_tokens_per_s: float
    num_structures: int  # coarse structures priced by the DP
    elapsed_s: float


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class _Candidate:
    proxy_s: float
    stages: tuple[tuple[int, ...], ...] = field(compare=False)
    bounds: tuple[int, ...] = field(compare=False)
    micro_batch_size: int = field(compare=False)


class _Search:
    """The state of one search: inputs, caches and the candidates found so far."""

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        model: ModelSpec,
        job: JobSpec,
        strategy: Strategy,
        curve: EfficiencyCurve,
    ) -> None:
        self.cluster, self.model, self.job = cluster, model, job
        self.strategy, self.curve = strategy, curve
        self.costs: dict[tuple[tuple[tuple[int, int], ...], int, int, int], StageCost] = {}
        self.candidates: dict[tuple[tuple[tuple[int, ...], ...], int], _Candidate] = {}
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
        neighbors = (index > 0) + (index < depth - 1)
        key = (self.signature(ranks), downstream, neighbors, size)
        if key not in self.costs:
            self.costs[key] = stage_cost(
                self.cluster,
                model=self.model,
                job=self.job,
                ranks=ranks,
                micro_batch_size=size,
                stage_index=index,
                num_stages=depth,
                rules=self.strategy.stage_rules,
                curve=self.curve,
                ranks_to_end=downstream,
            )
        return self.costs[key]

    def stage_costs(self, stages: tuple[tuple[int, ...], ...], size: int) -> list[StageCost]:
        depth = len(stages)
        return [
            self.stage_cost(ranks, i, depth, size, sum(len(r) for r in stages[i:]))
            for i, ranks in enumerate(stages)
        ]

    def price(self, stages: tuple[tuple[int, ...], ...], size: int) -> float:
        """The DP's step-time estimate of a structure (inf if nothing fits); remembered."""
        self.num_structures += 1
        depth = len(stages)
        costs = self.stage_costs(stages, size)
        if self.strategy.uniform_layers:
            bounds = uniform_bounds(self.model.num_layers, depth)
            value = max(
                float(c.cost_s[a, b]) for c, a, b in zip(costs, bounds, bounds[1:], strict=False)
            )
        else:
            value, bounds = split_layers([c.cost_s for c in costs])
        if not math.isfinite(value):
            return math.inf
        proxy = pipeline_proxy(costs, bounds, *self.shape(stages, size))
        key = (stages, size)
        if key not in self.candidates or proxy < self.candidates[key].proxy_s:
            self.candidates[key] = _Candidate(
                proxy_s=proxy, stages=stages, bounds=bounds, micro_batch_size=size
            )
        return proxy

    def polished(self, candidate: _Candidate) -> _Candidate:
        """The candidate with its layer split polished against the full step proxy."""
        if self.strategy.uniform_layers:
            return candidate
        stages, size = candidate.stages, candidate.micro_batch_size
        costs = self.stage_costs(stages, size)
        bounds, proxy = polish_bounds(
            costs, candidate.bounds, *self.shape(stages, size), candidate.proxy_s
        )
        return _Candidate(proxy_s=proxy, stages=stages, bounds=bounds, micro_batch_size=size)

    def shape(
        self, stages: tuple[tuple[int, ...], ...], size: int
    ) -> tuple[tuple[BoundaryTraffic, ...], list[ShareTrips], list[int]]:
        """What the proxy needs of a structure beyond its stage prices: its boundaries'
        traffic, its stages' round trips and their widths."""
        widths = [len(ranks) for ranks in stages]
        trips = share_round_trips(widths, self.job.global_batch_size // size)
        return self.traffic.boundaries(stages, size), trips, widths

    # -- exact construction -------------------------------------------------------------
    def assemble(
        self, candidate: _Candidate, sizes_of: dict[int, int] | None = None
    ) -> ScoredPlan | None:
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
        orders = [
            [stage.ranks[i] for i in weighted_round_robin(stage.num_micro_batches)]
            for stage in stages
        ]
        routes = tuple(zip(*orders, strict=True))
        plan = Plan(
            cluster=self.cluster,
            model=self.model,
            job=self.job,
            stages=stages,
            routes=routes,
            schedule=Schedule.ONE_F_ONE_B,
        )
        estimate = estimate_plan(plan, curve=self.curve)
        for stage_estimate in estimate.stages:
            for rank, memory in stage_estimate.memory.items():
                if memory.total_bytes > self.cluster.device_of(rank).memory_bytes:
                    return None
        return ScoredPlan(plan=plan, estimate=estimate, strategy=self.strategy.name)


def _scan_depths(
    state: _Search,
    units: tuple[Unit, ...],
    size: int,
    *,
    refine: bool,
    depths: Iterable[int] | None = None,
) -> list[tuple[float, int]]:
    """(estimate, depth) for every depth tried for one order and micro-batch size; stops
    deepening once DEPTH_PATIENCE depths that fit bring no improvement in a row."""
    required = required_cuts(units, state.strategy)
    limit = min(len(units), state.model.num_layers, state.strategy.max_stages)
    results: list[tuple[float, int]] = []
    best, patience = math.inf, 0
    for depth in depths if depths is not None else depths_to_try(limit):
        if depth - 1 < len(required) or depth > limit:
            continue
        value = _best_cuts(state, units, depth, size, required, refine=refine)
        results.append((value, depth))
        if value < best * (1 - 1e-9):
            best, patience = value, 0
        elif math.isfinite(value):
            # Only a depth that fits and is no faster counts: one that fits nowhere says
            # nothing about deeper ones (a one-stage ZeRO-3 plan can fit where shallow
            # pipelines, ZeRO-1 at most, do not; deeper ones hold fewer layers per rank).
            patience += 1
            if patience >= DEPTH_PATIENCE and depths is None:
                break
    return results


def _best_cuts(
    state: _Search,
    units: tuple[Unit, ...],
    depth: int,
    size: int,
    required: frozenset[int],
    *,
    refine: bool,
) -> float:
    positions = [p for p in range(1, len(units)) if p not in required]
    free = depth - 1 - len(required)
    small = state.cluster.num_gpus <= ALL_SIZES_UP_TO
    if math.comb(len(positions), free) <= (EXHAUSTIVE_CUTS_UP_TO if small else 2 * depth):
        best = math.inf
        for chosen in itertools.combinations(positions, free):
            cuts = tuple(sorted((*required, *chosen)))
            best = min(best, state.price(stages_of(units, cuts), size))
        return best
    start = quantile_cuts(units, depth, required)
    if start is None:
        return math.inf
    cuts = start
    value = state.price(stages_of(units, cuts), size)
    if refine:
        cuts, value = _local_search(state, units, size, cuts, value, required)
    return value


def _local_search(
    state: _Search,
    units: tuple[Unit, ...],
    size: int,
    cuts: tuple[int, ...],
    value: float,
    required: frozenset[int],
) -> tuple[tuple[int, ...], float]:
    """Move one cut at a time by halving steps while the estimate improves: one sweep per
    step size, the whole schedule at most LOCAL_SEARCH_ROUNDS times."""
    for _ in range(LOCAL_SEARCH_ROUNDS):
        start_value = value
        step = max(1, len(units) // (2 * (len(cuts) + 1)))
        while step >= 1:
            for index, cut in enumerate(cuts):
                if cut in required:
                    continue
                low = cuts[index - 1] if index else 0
                high = cuts[index + 1] if index + 1 < len(cuts) else len(units)
                for moved in (cut - step, cut + step):
                    if not low < moved < high:
                        continue
                    trial = (*cuts[:index], moved, *cuts[index + 1 :])
                    trial_value = state.price(stages_of(units, trial), size)
                    if trial_value < value * (1 - 1e-9):
                        cuts, value = trial, trial_value
                        break
            step //= 2
        if value >= start_value * (1 - 1e-9):
            break
    return cuts, value


def _grid_candidates(state: _Search, size: int) -> None:
    """Megatron's p x d grids over the fastest GPUs, layers split evenly."""
    gpus = sorted(
        state.cluster.gpus,
        key=lambda g: (-g.device.training_peak_flops(state.job.precision), g.rank),
    )
    total = len(gpus)
    # Useful grid sizes: the whole cluster, or exactly the fastest k types.
    sizes = {total}
    for k in range(1, total):
        if gpus[k].device != gpus[k - 1].device:
            sizes.add(k)
    for depth in depths_to_try(min(total, state.model.num_layers, state.strategy.max_stages)):
        for used in sizes:
            degree = used // depth
            if degree < 1:
                continue
            chosen = sorted(g.rank for g in gpus[: depth * degree])
            stages = tuple(tuple(chosen[i * degree : (i + 1) * degree]) for i in range(depth))
            state.price(stages, size)


def _idle_subsets(
    cluster: ClusterSpec, strategy: Strategy, precision: Dtype
) -> list[frozenset[int]]:
    """Nodes (by index) that take part: all of them first; then, where idle GPUs are
    allowed, all but one node class (identical groups are one), and the fastest k types
    alone (what dropping the slowest GPUs gives); in clusters of a few nodes, every subset
    of nodes (one node of a group alone may beat the whole group when the group's nodes
    share a slow network)."""
    everything = frozenset(node.index for node in cluster.nodes)
    subsets = [everything]
    if not strategy.allow_idle_groups:
        return subsets
    class_of = node_classes(cluster)
    members: dict[int, set[int]] = {}
    for node in cluster.nodes:
        members.setdefault(class_of[node.group_index], set()).add(node.index)
    nodes_of = {c: frozenset(nodes) for c, nodes in members.items()}
    groups = list(nodes_of)
    if len(groups) > 1:
        subsets += [everything - nodes_of[g] for g in groups]
        speed = {g: cluster.node_groups[g].device.training_peak_flops(precision) for g in groups}
        fastest = sorted(groups, key=lambda g: -speed[g])
        for k in range(1, len(fastest) - 1):
            subsets.append(
                frozenset().union(
                    *(nodes_of[g] for g in fastest if speed[g] >= speed[fastest[k - 1]])
                )
            )
    if len(everything) <= ALL_NODE_SUBSETS_UP_TO and cluster.num_gpus <= ALL_SIZES_UP_TO:
        subsets += [
            frozenset(chosen)
            for size in range(len(everything) - 1, 0, -1)
            for chosen in itertools.combinations(sorted(everything), size)
        ]
    return [subset for subset in dict.fromkeys(subsets) if subset]


def _per_rank_sizes(state: _Search, ranks: tuple[int, ...]) -> dict[int, int]:
    """Cephalo: each GPU type at the micro-batch size where it is fastest per token and its
    activations for one micro-batch leave room for an even share of the state."""
    sizes: dict[int, int] = {}
    best_of: dict[DeviceType, int] = {}
    for rank in ranks:
        device = state.cluster.device_of(rank)
        if device not in best_of:
            best_of[device] = _fastest_size(state, device, len(ranks))
        sizes[rank] = best_of[device]
    return sizes


def _fastest_size(state: _Search, device: DeviceType, num_ranks: int) -> int:
    best_size, best_rate = 1, 0.0
    last = state.model.num_layers
    for size in MICRO_BATCH_SIZES:
        if state.job.global_batch_size % size:
            continue
        fixed, sharded = stage_memory_bytes(
            state.model,
            layers=(0, last),
            device=device,
            dtype=device.training_dtype(state.job.precision),
            optimizer=state.job.optimizer,
            zero=state.strategy.stage_rules.zero_modes[-1],
            micro_batch_size=size,
            seq_len=state.job.seq_len,
            num_in_flight=1,
            recompute=state.strategy.stage_rules.recompute[-1],
            num_neighbor_stages=0,
            curve=state.curve,
        )
        if float(fixed) + float(sharded) / num_ranks > device.memory_bytes:
            break
        times = pass_times(
            state.model,
            device=device,
            dtype=device.training_dtype(state.job.precision),
            micro_batch_size=size,
            seq_len=state.job.seq_len,
            recompute=False,
            curve=state.curve,
        )
        rate = size / times.pass_s(0, last)
        if rate > best_rate * 1.01:  # a bigger micro-batch must pay for its memory
            best_size, best_rate = size, rate
    return best_size


def _sizes(job: JobSpec) -> list[int]:
    return [s for s in MICRO_BATCH_SIZES if job.global_batch_size % s == 0]


def search(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    strategy: Strategy = PIEBALD,
    curve: EfficiencyCurve = DEFAULT_CURVE,
    progress: Progress | None = None,
    seeds: Sequence[ScoredPlan] | None = None,
    zero: ZeroMode | None = None,
) -> SearchResult:
    """The plan with the highest predicted tokens/s that fits every GPU's memory.

    ``seeds`` are plans found by restricted searches (the baselines), all inside this
    strategy's plan space: they compete with what the search finds, so the result is never
    worse than any of them. When none are given and the strategy asks for it (piebald, up
    to ``seed_with_baselines_up_to`` GPUs), the baseline searches run first.

    ``zero`` restricts every stage to that ZeRO mode (``plan --zero``), the baselines that
    seed the search too; a strategy that cannot express it is a ``ValueError``.
    """
    started = time.perf_counter()
    check_job_fits_model(job, model)
    restricted = with_zero_mode(strategy, zero)
    if restricted is None:
        raise ValueError(
            f"strategy {strategy.name} cannot use ZeRO mode {zero}; it allows "
            f"{', '.join(m.value for m in strategy.stage_rules.zero_modes)}"
        )
    strategy = restricted
    if seeds is None and cluster.num_gpus <= strategy.seed_with_baselines_up_to:
        seeds = _baseline_seeds(cluster, model=model, job=job, curve=curve, zero=zero)
    report = progress or (lambda fraction, message: None)
    state = _Search(cluster, model=model, job=job, strategy=strategy, curve=curve)
    if strategy.grid_drop:
        sizes = _sizes(job)
        for index, size in enumerate(sizes):
            _grid_candidates(state, size)
            report((index + 1) / len(sizes), f"{strategy.name}: {state.num_structures} structures")
    else:
        _search_structures(state, report)
    scored = _exact(state, strategy)
    scored += [
        ScoredPlan(
            plan=seed.plan,
            estimate=seed.estimate,
            strategy=f"{strategy.name}, found by the {seed.strategy} search",
        )
        for seed in seeds or ()
    ]
    if not scored:
        raise Infeasible(_why_infeasible(state))
    scored.sort(key=lambda s: s.estimate.step_time_s)
    bound = upper_bound_tokens_per_s(cluster, model=model, job=job, curve=curve)
    best = _finish(scored[0], scored, bound)
    runners = tuple(_distinct(scored[1:], best))[:4]
    return SearchResult(
        best=best,
        runners_up=runners,
        upper_bound_tokens_per_s=bound,
        num_structures=state.num_structures,
        elapsed_s=time.perf_counter() - started,
    )


def _baseline_seeds(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    curve: EfficiencyCurve,
    zero: ZeroMode | None,
) -> list[ScoredPlan]:
    seeds = []
    for baseline in BASELINES:
        restricted = with_zero_mode(baseline, zero)
        if restricted is None:
            continue
        try:
            seeds.append(
                search(
                    cluster, model=model, job=job, strategy=restricted, curve=curve, seeds=()
                ).best
            )
        except Infeasible:
            continue
    return seeds


def _search_structures(state: _Search, report: Progress) -> None:
    """Coarse scan of every (order, micro-batch size) over depths with speed-quantile cuts;
    local search of the cuts around the best few; then the same for each idle-group subset,
    in the orders and sizes that won with every group."""
    subsets = _idle_subsets(state.cluster, state.strategy, state.job.precision)
    full_units = build_units(state.cluster, precision=state.job.precision, nodes=subsets[0])
    orders = unit_orders(full_units)
    sizes = _sizes(state.job)
    scans: list[tuple[float, int, int, int]] = []  # (estimate, order, size, depth)
    steps = len(orders) * len(sizes) + len(subsets)
    done = 0
    for order_index, order in enumerate(orders):
        best_of_order = math.inf
        for size in sizes:
            done += 1
            tried = _scan_depths(state, order, size, refine=False)
            scans += [(value, order_index, size, depth) for value, depth in tried]
            report(done / steps, f"{state.strategy.name}: {state.num_structures} structures")
            best_of_size = min((value for value, _ in tried), default=math.inf)
            if not math.isfinite(best_of_size):
                break  # activations grow with the micro-batch: larger ones cannot fit either
            if best_of_size > SIZE_PATIENCE * best_of_order:
                break  # past the best micro-batch size, bubbles and memory only grow
            best_of_order = min(best_of_order, best_of_size)
    best = sorted(v for v in scans if math.isfinite(v[0]))[:TOP_REFINED]
    small = state.cluster.num_gpus <= ALL_SIZES_UP_TO
    for _, order_index, size, depth in best:
        # Neighbouring depths too where structures are cheap to price.
        around = (depth - 1, depth, depth + 1) if small else (depth,)
        _scan_depths(state, orders[order_index], size, refine=True, depths=around)
    for nodes in subsets[1:]:
        # Idle groups: the winning orders without the group, depths near the best, every
        # micro-batch size in small clusters (fewer GPUs may favour larger micro-batches).
        if not best:
            break
        _, order_index, best_size, depth = best[0]
        small = state.cluster.num_gpus <= ALL_SIZES_UP_TO
        if small:  # every order and size of the subset's own units
            subset_units = build_units(state.cluster, precision=state.job.precision, nodes=nodes)
            subset_orders = unit_orders(subset_units)
        else:  # the winning order without the idle groups, at the winning size
            subset_orders = [tuple(u for u in orders[order_index] if u.node_indices[0] in nodes)]
        # Depths near the best one, as deep as the subset's units allow; one stage always.
        depth = min(depth, len(subset_orders[0]))
        near = sorted({1, *range(max(1, depth - 2), depth + 3)})
        subset_tried = [
            (value, size, d, i)
            for i, order in enumerate(subset_orders)
            for size in (sizes if small else [best_size])
            for value, d in _scan_depths(state, order, size, refine=False, depths=near)
        ]
        finite = [t for t in subset_tried if math.isfinite(t[0])]
        if finite:
            _, size, depth, i = min(finite)
            _scan_depths(state, subset_orders[i], size, refine=True, depths=(depth,))
        done += 1
        report(done / steps, f"{state.strategy.name}: {state.num_structures} structures")


def _why_infeasible(state: _Search) -> str:
    if state.strategy.stage_rules.equal_micro_batches and any(
        math.isfinite(c.proxy_s) for c in state.candidates.values()
    ):
        return (
            f"{state.strategy.name} gives every GPU of a stage the same number of "
            "micro-batches, and no structure that fits memory has stages whose size "
            f"divides the micro-batches of a global batch of {state.job.global_batch_size}"
        )
    return diagnose_infeasible(state.cluster, model=state.model, job=state.job)


def _exact(state: _Search, strategy: Strategy) -> list[ScoredPlan]:
    ranked = sorted(c for c in state.candidates.values() if math.isfinite(c.proxy_s))
    # Small clusters can afford to price many more structures exactly, large ones fewer.
    num_gpus = state.cluster.num_gpus
    wanted = NUM_EXACT * (3 if num_gpus <= ALL_SIZES_UP_TO else 1)
    if num_gpus > EXACT_FULL_UP_TO_GPUS:
        wanted = max(MIN_EXACT, NUM_EXACT * EXACT_FULL_UP_TO_GPUS // num_gpus)
    scored: list[ScoredPlan] = []
    for candidate in (state.polished(c) for c in ranked[: wanted * 2]):
        plan = state.assemble(candidate)
        if plan is not None:
            scored.append(plan)
        if strategy.per_rank_micro_batch and len(candidate.stages) == 1:
            mixed = state.assemble(candidate, _per_rank_sizes(state, candidate.stages[0]))
            if mixed is not None:
                scored.append(mixed)
        if len(scored) >= wanted:
            break
    return scored


def _finish(best: ScoredPlan, scored: list[ScoredPlan], bound: float) -> ScoredPlan:
    """The winner with its prediction, bound, runner-ups and notes (idle GPUs say why)."""
    plan = best.plan
    notes = [f"strategy {best.strategy} (piebald {_version()})"]
    idle = plan.idle_ranks
    if idle:
        with_all = [s for s in scored if not s.plan.idle_ranks]
        if with_all:
            notes.append(
                f"ranks {list(idle)} idle on purpose: the best plan using every GPU "
                f"predicts {with_all[0].estimate.tokens_per_s:,.0f} tokens/s, fewer "
                f"than {best.estimate.tokens_per_s:,.0f}"
            )
        else:
            notes.append(f"ranks {list(idle)} idle: no plan using every GPU fits memory")
    runners = tuple(
        RunnerUp(
            description=describe_plan(s.plan),
            tokens_per_s=s.estimate.tokens_per_s,
            step_time_s=s.estimate.step_time_s,
        )
        for s in list(_distinct(scored[1:], best))[:4]
    )
    final = Plan(
        cluster=plan.cluster,
        model=plan.model,
        job=plan.job,
        stages=plan.stages,
        routes=plan.routes,
        schedule=plan.schedule,
        predicted=best.estimate.prediction(),
        upper_bound_tokens_per_s=bound,
        notes=tuple(notes),
        runners_up=runners,
    )
    return ScoredPlan(plan=final, estimate=best.estimate, strategy=best.strategy)


def _distinct(scored: Iterable[ScoredPlan], best: ScoredPlan) -> Iterable[ScoredPlan]:
    seen = {_shape(best.plan)}
    for candidate in scored:
        shape = _shape(candidate.plan)
        if shape not in seen:
            seen.add(shape)
            yield candidate


def _shape(plan: Plan) -> tuple[tuple[int, int, tuple[int, ...], int], ...]:
    return tuple((s.layer_start, s.layer_end, s.ranks, s.micro_batch_size[0]) for s in plan.stages)


def _version() -> str:
    from piebald import __version__

    return __version__
