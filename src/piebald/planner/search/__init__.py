"""One search over every heterogeneous strategy: coarse structure enumerated, the rest exact.

``search`` runs these phases, one function each below:

1. ``seed_with_baselines``: where the strategy asks for it, the baselines' searches run
   first; their plans lie in this strategy's space and compete at the end.
2. ``scan_structures``: every order units line up in (``search_units.unit_orders``) and every
   micro-batch size, over pipeline depths and the cuts between stages
   (``structures.scan_depths``), each structure priced by the layer-split DP
   (``partition.split_layers`` over ``stage_costs``) and the step proxy (``proxy``).
   Megatron instead prices its p x d grids (``structures.grid_candidates``).
3. ``refine_best``: a local search of the cuts of the best few (order, size, depth).
4. ``try_idle_subsets``: the same, briefly, for each subset of nodes left idle
   (``idle.idle_subsets``), the promising ones refined; kept only when faster.
5. ``build_exactly``: the best structures by the proxy, their layer split polished, built
   stage by stage (micro-batch counts by min-makespan, water-filled shards, ZeRO mode and
   recompute, ``stage_builder``) and priced by the closed-form plan estimate.
6. ``finish``: the fastest of the built plans and the seeds, with its notes, bound and
   runners-up.

The work grows with the orders x micro-batch sizes x depths scanned and the cut
combinations of each (exhaustive while few, ``settings.SearchSettings``), not with the
GPUs: units merge nodes in large clusters. In a large cluster phases 2-5 spread their
independent tasks (orders, scans, subsets, candidates) over the cores (``parallel``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.planner.bounds import upper_bound_tokens_per_s
from piebald.planner.partition import uniform_bounds
from piebald.planner.search.exact import build_exactly
from piebald.planner.search.finish import distinct_runners_up, finished_plan, why_infeasible
from piebald.planner.search.idle import idle_subsets
from piebald.planner.search.parallel import available_workers, map_forked, run_tasks
from piebald.planner.search.records import Infeasible, Scan, ScoredPlan, SearchResult
from piebald.planner.search.settings import SearchSettings
from piebald.planner.search.state import SearchState
from piebald.planner.search.structures import grid_candidates, scan_depths
from piebald.planner.search_units import Unit, build_units, unit_orders
from piebald.planner.strategies import (
    BASELINES,
    PIEBALD,
    Strategy,
    with_recompute,
    with_tensor_parallel,
    with_zero_mode,
)
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec, check_job_fits_model
from piebald.specs.model import ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.recompute import Recompute

__all__ = ["Infeasible", "ScoredPlan", "SearchResult", "search", "uniform_bounds"]

Progress = Callable[[float, str], None]


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
    tensor_parallel: int | None = None,
    recompute: tuple[Recompute, ...] | None = None,
    workers: int | None = None,
) -> SearchResult:
    """The plan with the highest predicted tokens/s that fits every GPU's memory.

    ``seeds`` are plans found by restricted searches (the baselines), all inside this
    strategy's plan space: they compete with what the search finds, so the result is never
    worse than any of them. When none are given and the strategy asks for it (piebald, up
    to ``seed_with_baselines_up_to`` GPUs), the baseline searches run first.

    ``zero`` restricts every stage to that ZeRO mode (``plan --zero``), the baselines that
    seed the search too; a strategy that cannot express it is a ``ValueError``.
    ``tensor_parallel`` likewise restricts every stage to that tensor-parallel degree
    (``plan --tensor-parallel``), and ``recompute`` each stage's recompute to those modes
    (``plan --recompute``; otherwise the strategy's, without selective recompute on
    clusters beyond ``Strategy.selective_recompute_up_to``).

    ``workers``: processes phases 2-5 run their tasks on in a large cluster
    (``parallel``; the same plans with any number); default every core this process may
    use.
    """
    started = time.perf_counter()
    workers = available_workers() if workers is None else workers
    check_job_fits_model(job, model)
    strategy = _restricted(strategy, zero, tensor_parallel, recompute)
    if recompute is None:
        strategy = strategy.for_cluster_of(cluster.num_gpus)
    degrees = strategy.stage_rules.tensor_parallel_degrees
    if strategy.uniform_tensor_parallel and len(degrees) > 1:
        return _best_uniform_degree(
            cluster,
            model=model,
            job=job,
            strategy=strategy,
            curve=curve,
            progress=progress,
            workers=workers,
        )
    settings = SearchSettings.for_cluster(cluster.num_gpus, workers=workers)
    state = SearchState(
        cluster, model=model, job=job, strategy=strategy, curve=curve, settings=settings
    )
    built: list[ScoredPlan] = []

    def phases() -> None:
        if strategy.grid_drop:
            scan_grids(state, _Ticker(progress, state, steps=len(_sizes(state))))
        else:
            subsets = idle_subsets(cluster, strategy, job.precision, settings)
            orders = unit_orders(build_units(cluster, precision=job.precision, nodes=subsets[0]))
            steps = len(orders) * len(_sizes(state)) + len(subsets)
            ticker = _Ticker(progress, state, steps=steps)
            scans = scan_structures(state, orders, ticker)
            best = refine_best(state, orders, scans)
            # Also where nothing fits with every node: a subset may (a node whose GPUs
            # cannot all form tensor groups of the asked degree, say).
            try_idle_subsets(state, orders, best, subsets[1:], ticker)
        built.extend(build_exactly(state))

    if seeds is None:
        # The baselines' searches on other processes while this one runs its own.
        seeds = seed_with_baselines(
            cluster,
            model=model,
            job=job,
            strategy=strategy,
            curve=curve,
            zero=zero,
            tensor_parallel=tensor_parallel,
            recompute=recompute,
            workers=workers,
            meanwhile=phases,
        )
    else:
        phases()
    scored = built + _as_found_by(strategy, seeds)
    if not scored:
        raise Infeasible(why_infeasible(state))
    return finish(state, scored, started_s=started)


def _best_uniform_degree(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    strategy: Strategy,
    curve: EfficiencyCurve,
    progress: Progress | None,
    workers: int,
) -> SearchResult:
    """The best of one search per tensor-parallel degree, every stage at that degree
    (``Strategy.uniform_tensor_parallel``)."""
    degrees = strategy.stage_rules.tensor_parallel_degrees
    started = time.perf_counter()
    results: list[SearchResult] = []
    failures: list[Infeasible] = []
    for index, degree in enumerate(degrees):
        fixed = with_tensor_parallel(strategy, degree)
        assert fixed is not None  # one of its own degrees
        share = None if progress is None else _scaled(progress, index, len(degrees))
        try:
            results.append(
                search(
                    cluster,
                    model=model,
                    job=job,
                    strategy=fixed,
                    curve=curve,
                    progress=share,
                    workers=workers,
                )
            )
        except Infeasible as failure:
            failures.append(failure)
    if not results:
        raise failures[0]  # degree 1's: what does not fit, and the smallest fix
    best = max(results, key=lambda result: result.best.estimate.tokens_per_s)
    return SearchResult(
        best=best.best,
        runners_up=best.runners_up,
        upper_bound_tokens_per_s=best.upper_bound_tokens_per_s,
        num_structures=sum(result.num_structures for result in results),
        elapsed_s=time.perf_counter() - started,
    )


def _scaled(progress: Progress, index: int, count: int) -> Progress:
    """``progress`` for the ``index``-th of ``count`` searches run one after another."""
    return lambda fraction, text: progress((index + fraction) / count, text)


def _restricted(
    strategy: Strategy,
    zero: ZeroMode | None,
    tensor_parallel: int | None,
    recompute: tuple[Recompute, ...] | None,
) -> Strategy:
    restricted = with_zero_mode(strategy, zero)
    if restricted is None:
        raise ValueError(
            f"strategy {strategy.name} cannot use ZeRO mode {zero}; it allows "
            f"{', '.join(m.value for m in strategy.stage_rules.zero_modes)}"
        )
    with_degree = with_tensor_parallel(restricted, tensor_parallel)
    if with_degree is None:
        raise ValueError(
            f"strategy {strategy.name} cannot use tensor-parallel degree {tensor_parallel}; "
            f"it allows {list(strategy.stage_rules.tensor_parallel_degrees)}"
        )
    with_modes = with_recompute(with_degree, recompute)
    if with_modes is None:
        raise ValueError(
            f"strategy {strategy.name} cannot use recompute {[m.value for m in recompute or ()]}; "
            f"it allows {[m.value for m in strategy.stage_rules.recompute]}"
        )
    return with_modes


def seed_with_baselines(
    cluster: ClusterSpec,
    *,
    model: ModelSpec,
    job: JobSpec,
    strategy: Strategy,
    curve: EfficiencyCurve,
    zero: ZeroMode | None,
    tensor_parallel: int | None = None,
    recompute: tuple[Recompute, ...] | None = None,
    workers: int = 1,
    meanwhile: Callable[[], None] | None = None,
) -> list[ScoredPlan]:
    """Phase 1. The best plan of every baseline that can express ``zero``,
    ``tensor_parallel`` and ``recompute`` and finds one, where ``strategy`` seeds with
    baselines on this cluster; none otherwise. The baselines' searches run on up to
    ``workers`` processes (``parallel.map_forked``), this one running ``meanwhile`` (the
    strategy's own phases) first; the seeds come in the order of ``BASELINES`` however
    they ran."""
    baselines = []
    if strategy.seeds_with_baselines(cluster.num_gpus):
        for baseline in BASELINES:
            restricted = with_zero_mode(baseline, zero)
            if restricted is not None:
                restricted = with_tensor_parallel(restricted, tensor_parallel)
            if restricted is not None:
                restricted = with_recompute(restricted, recompute)
            if restricted is not None:
                baselines.append(restricted)

    def best_of(index: int) -> ScoredPlan | None:
        try:
            return search(
                cluster,
                model=model,
                job=job,
                strategy=baselines[index],
                curve=curve,
                seeds=(),
                workers=1,
            ).best
        except Infeasible:
            return None

    found = map_forked(len(baselines), best_of, workers=workers, meanwhile=meanwhile)
    return [seed for seed in found if seed is not None]


def scan_grids(state: SearchState, ticker: _Ticker) -> None:
    """Phase 2, Megatron: its p x d grids at every micro-batch size, priced."""
    for size in _sizes(state):
        grid_candidates(state, size)
        ticker.tick()


def scan_structures(
    state: SearchState, orders: Sequence[tuple[Unit, ...]], ticker: _Ticker
) -> list[Scan]:
    """Phase 2. Every order at micro-batch sizes from the smallest, over depths with
    speed-quantile cuts, priced, each order its own task (``parallel``); per order, the
    sizes stop at the first that fits nowhere (activations grow with the micro-batch:
    larger ones cannot fit either) or is ``size_patience`` slower than the best (past it,
    bubbles and memory only grow)."""

    def scan_order(state: SearchState, order_index: int) -> list[Scan]:
        scans: list[Scan] = []
        best_of_order = math.inf
        for size in _sizes(state):
            tried = scan_depths(state, orders[order_index], size, refine=False)
            scans += [
                Scan(
                    proxy_s=t.proxy_s, order_index=order_index, micro_batch_size=size, depth=t.depth
                )
                for t in tried
            ]
            best_of_size = min((t.proxy_s for t in tried), default=math.inf)
            if not math.isfinite(best_of_size):
                break
            if best_of_size > state.settings.size_patience * best_of_order:
                break
            best_of_order = min(best_of_order, best_of_size)
        return scans

    def scanned() -> None:
        # An order's sizes count as done together (a worker cannot report them one by one).
        for _ in _sizes(state):
            ticker.tick()

    per_order = run_tasks(
        state, range(len(orders)), scan_order, workers=state.settings.workers, done=scanned
    )
    return [scan for scans in per_order for scan in scans]


def refine_best(
    state: SearchState, orders: Sequence[tuple[Unit, ...]], scans: Sequence[Scan]
) -> Scan | None:
    """Phase 3. A local search of the cuts of the ``top_refined`` best scans (at their
    neighbouring depths too in small clusters), each its own task; returns the best scan
    (None where nothing fits)."""
    best = sorted((s for s in scans if math.isfinite(s.proxy_s)), key=Scan.key)
    best = best[: state.settings.top_refined]

    def refine(state: SearchState, scan: Scan) -> None:
        depths = state.settings.refined_depths(scan.depth)
        scan_depths(
            state, orders[scan.order_index], scan.micro_batch_size, refine=True, depths=depths
        )

    run_tasks(state, best, refine, workers=state.settings.workers)
    return best[0] if best else None


def try_idle_subsets(
    state: SearchState,
    orders: Sequence[tuple[Unit, ...]],
    best: Scan | None,
    subsets: Sequence[frozenset[int]],
    ticker: _Ticker,
) -> None:
    """Phase 4. For each subset of nodes that take part, its own task: the structures near
    the best one without the idle nodes, priced: every order of the subset's own units
    and, in a large cluster, the winning order less the idle nodes, at depths near the
    best (one stage always); in small clusters at every micro-batch size (fewer GPUs may
    favour larger micro-batches), else at the winning size. Where nothing fit with every
    node (``best`` None), every order, size and depth of the subset's own units. Then,
    each its own task again, the cuts of each subset's best get a local search where that
    best is within ``SearchSettings.subset_refine_margin`` of the best structure priced
    so far (most of a subset's time): the best few first (``subsets_refined_first``), the
    others against the bar those leave. In a large cluster, where another order's scan
    beats the winning order's, both get it: the better scan need not refine better (the
    six-type 1,024-GPU cluster gains 3.7% from another order, the 4,096-GPU scaling
    cluster loses 10% without the winning one's)."""
    small = state.settings.small_cluster

    def orders_of(nodes: frozenset[int]) -> list[tuple[Unit, ...]]:
        own = unit_orders(build_units(state.cluster, precision=state.job.precision, nodes=nodes))
        if small or best is None:
            return own
        winner = tuple(u for u in orders[best.order_index] if u.node_indices[0] in nodes)
        return [winner, *(order for order in own if order != winner)]

    def scan_subset(state: SearchState, nodes: frozenset[int]) -> tuple[Scan, ...]:
        subset_orders = orders_of(nodes)
        depths: list[int] | None = None  # every depth, where nothing fit with every node
        sizes = _sizes(state)
        if best is not None:
            # Depths near the best one, as deep as the subset's units allow; one stage always.
            depth = min(best.depth, len(subset_orders[0]))
            depths = sorted({1, *range(max(1, depth - 2), depth + 3)})
            sizes = sizes if small else [best.micro_batch_size]
        tried = [
            Scan(proxy_s=t.proxy_s, order_index=i, micro_batch_size=size, depth=t.depth)
            for i, order in enumerate(subset_orders)
            for size in sizes
            for t in scan_depths(state, order, size, refine=False, depths=depths)
        ]
        finite = [s for s in tried if math.isfinite(s.proxy_s)]
        found = _best_scans(finite)
        if found and found[0].order_index != 0 and not small and best is not None:
            # The winning order's best too: the best coarse scan need not refine best.
            found += _best_scans([s for s in finite if s.order_index == 0])
        return tuple(found)

    def refine_subset(state: SearchState, task: tuple[frozenset[int], tuple[Scan, ...]]) -> None:
        nodes, scans = task
        for scan in scans:
            scan_depths(
                state,
                orders_of(nodes)[scan.order_index],
                scan.micro_batch_size,
                refine=True,
                depths=(scan.depth,),
            )

    def refine_within_bar(tasks: list[tuple[frozenset[int], tuple[Scan, ...]]]) -> None:
        so_far = min((c.proxy_s for c in state.candidates.values()), default=math.inf)
        bar = state.settings.subset_refine_margin * so_far
        promising = [
            (nodes, near)
            for nodes, scans in tasks
            if (near := tuple(scan for scan in scans if scan.proxy_s <= bar))
        ]
        for _ in range(len(tasks) - len(promising)):
            ticker.tick()
        run_tasks(state, promising, refine_subset, workers=state.settings.workers, done=ticker.tick)

    won = run_tasks(state, subsets, scan_subset, workers=state.settings.workers)
    for _ in range(sum(not scans for scans in won)):
        ticker.tick()
    # Best scans first: the first few's refinement may lower the bar for the others.
    ranked = sorted(
        ((nodes, scans) for nodes, scans in zip(subsets, won, strict=True) if scans),
        key=lambda task: min(scan.proxy_s for scan in task[1]),
    )
    first = state.settings.subsets_refined_first
    refine_within_bar(ranked[:first])
    refine_within_bar(ranked[first:])


def _best_scans(scans: Sequence[Scan]) -> list[Scan]:
    """The best of ``scans`` (none of none); ties to the smaller size, the shallower
    depth, the earlier order."""
    if not scans:
        return []
    return [min(scans, key=lambda s: (s.proxy_s, s.micro_batch_size, s.depth, s.order_index))]


def finish(state: SearchState, scored: list[ScoredPlan], *, started_s: float) -> SearchResult:
    """Phase 6. The fastest plan, finished with its notes, the upper bound and its
    distinct runners-up."""
    ranked = sorted(scored, key=lambda s: s.estimate.step_time_s)
    bound = upper_bound_tokens_per_s(
        state.cluster, model=state.model, job=state.job, curve=state.curve
    )
    runners_up = distinct_runners_up(ranked, most=state.settings.num_runners_up)
    best = finished_plan(ranked[0], ranked=ranked, runners_up=runners_up, bound=bound)
    return SearchResult(
        best=best,
        runners_up=runners_up,
        upper_bound_tokens_per_s=bound,
        num_structures=state.num_structures,
        elapsed_s=time.perf_counter() - started_s,
    )


def _as_found_by(strategy: Strategy, seeds: Sequence[ScoredPlan]) -> list[ScoredPlan]:
    """The seeds, credited to ``strategy`` and the search that found each."""
    return [
        ScoredPlan(
            plan=seed.plan,
            estimate=seed.estimate,
            strategy=f"{strategy.name}, found by the {seed.strategy} search",
        )
        for seed in seeds
    ]


def _sizes(state: SearchState) -> list[int]:
    """The micro-batch sizes that divide the global batch."""
    batch = state.job.global_batch_size
    return [s for s in state.settings.micro_batch_sizes if batch % s == 0]


@dataclass(slots=True)
class _Ticker:
    """Reports the share of the scan's steps done, with the structures priced so far."""

    report: Progress | None
    state: SearchState
    steps: int
    done: int = 0

    def tick(self) -> None:
        self.done += 1
        if self.report is not None:
            message = f"{self.state.strategy.name}: {self.state.num_structures} structures"
            self.report(self.done / self.steps, message)
