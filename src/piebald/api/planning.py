"""Planning: the fastest plan (``piebald plan``), every strategy side by side (``piebald
compare``), where a plan's time goes (``piebald explain``), and the plans to fall back on
when a node is lost (``piebald plan --fallbacks``)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from piebald.api.arguments import (
    check_bool,
    check_callable,
    check_instance,
    check_int,
    check_path,
    check_str,
)
from piebald.api.inputs import (
    Profiles,
    Progress,
    as_cluster,
    as_model,
    as_plan,
    check_job,
    check_profiles,
    profiled,
)
from piebald.cost.failure import FailureModel, FailurePrice, price_failures
from piebald.cost.plan_estimate import PlanEstimate
from piebald.cost.recorded_curve import recorded_curve
from piebald.errors import ArgumentError
from piebald.outputs import check_output_directory
from piebald.planner.choices import (
    check_tensor_parallel_fits,
    recompute_modes,
    strategy_named,
    tensor_parallel_degree,
    zero_mode_named,
)
from piebald.planner.compare import Comparison, ComparisonRow, compare_strategies
from piebald.planner.fallback import FallbackPlans, write_fallback_plans
from piebald.planner.search import Infeasible, ScoredPlan, search
from piebald.planner.strategies import STRATEGIES
from piebald.profiler.pricing import plan_with_cost_inputs, planning_prices
from piebald.report.explain import Explanation, explain_plan
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec, check_job_fits_model
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan, ZeroMode

if TYPE_CHECKING:
    from piebald.planner.verify import Verification, VerifiedCandidate

__all__ = [
    "Comparison",
    "ComparisonRow",
    "Explanation",
    "FallbackPlans",
    "Infeasible",
    "PlanResult",
    "ScoredPlan",
    "Verification",
    "VerifiedCandidate",
    "compare",
    "explain",
    "fallback_plans",
    "plan",
    "search_plans",
]


def __getattr__(name: str) -> object:
    # PEP 562: the verification's types live with the simulator, loaded on first use.
    if name in ("Verification", "VerifiedCandidate"):
        return getattr(importlib.import_module("piebald.planner.verify"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """What a search found (:func:`search_plans`), everything ``piebald plan`` shows.

    ``plan``: the chosen plan (recording the measurements it was priced with, if any);
    ``estimate``: the cost model's estimate of its step; ``runners_up``: the next-best
    plans considered, best first (the plan file lists them); ``upper_bound_tokens_per_s``:
    no plan of this job on this cluster is faster; ``num_structures``: the coarse
    structures the search priced; ``elapsed_s``: its wall time; ``verification``: the
    candidates simulated with ``verify_by_simulation`` (None without); ``warnings``: what
    the profile DB holds that the cluster cannot use (each also a ``ProfileWarning``);
    ``checkpoint``: with ``failures``, what a failure costs and the checkpoint interval the
    plan records (``cost.failure.price_failures``; None without)."""

    plan: Plan
    estimate: PlanEstimate
    runners_up: tuple[ScoredPlan, ...]
    upper_bound_tokens_per_s: float
    num_structures: int
    elapsed_s: float
    verification: Verification | None
    warnings: tuple[str, ...]
    checkpoint: FailurePrice | None = None


def search_plans(
    cluster: str | Path | ClusterSpec,
    model: str | Path | ModelSpec,
    job: JobSpec,
    *,
    strategy: str = "piebald",
    zero: str | ZeroMode | None = None,
    tensor_parallel: int | None = None,
    recompute: str | Sequence[str] | None = None,
    profiles: Profiles | None = None,
    verify_by_simulation: bool = False,
    progress: Progress | None = None,
    workers: int | None = None,
    checkpoint_every: int | str | None = None,
    failures: FailureModel | None = None,
) -> PlanResult:
    """:func:`plan` with all that the search found: the chosen plan, its estimate, the
    runners-up, the search's statistics and, with ``verify_by_simulation``, the simulated
    candidates. The arguments are :func:`plan`'s.

    >>> from piebald.api import build_job
    >>> from piebald.examples import example_path
    >>> job = build_job(global_batch=8, seq_len=64)
    >>> found = search_plans(example_path(), "tiny", job)
    >>> found.plan.predicted.step_time_s == found.estimate.step_time_s
    True
    >>> found.num_structures > 0 and found.verification is None
    True
    """
    check_job(job)
    check_str("strategy", strategy)
    check_bool("verify_by_simulation", verify_by_simulation)
    _check_search(profiles=profiles, progress=progress, workers=workers)
    every = _checkpoint_every(checkpoint_every, failures)
    cluster_spec, model_spec = as_cluster(cluster), as_model(model)
    chosen = strategy_named(strategy)
    zero_mode = zero_mode_named(zero, strategy=chosen)
    degree = tensor_parallel_degree(tensor_parallel, strategy=chosen, seq_len=job.seq_len)
    modes = recompute_modes(recompute, strategy=chosen)
    check_job_fits_model(job, model_spec)  # before the profiles: the cheaper mistake first
    check_tensor_parallel_fits(degree, cluster=cluster_spec, model=model_spec)
    inputs, warnings = profiled(profiles, cluster=cluster_spec, model=model_spec, job=job)
    priced_cluster, curve = planning_prices(inputs, cluster=cluster_spec)
    result = search(
        priced_cluster,
        model=model_spec,
        job=job,
        strategy=chosen,
        curve=curve,
        progress=progress,
        zero=zero_mode,
        tensor_parallel=degree,
        recompute=modes,
        workers=workers,
    )
    verification = None
    if verify_by_simulation:
        # Here, not at the top: verifying runs the simulator, which planning without
        # ``verify_by_simulation`` (``piebald plan`` without --simulate) does not load.
        from piebald.planner.verify import verify_by_simulation as verify

        verification = verify(result, curve=curve)
    best = result.best if verification is None else verification.chosen
    found = plan_with_cost_inputs(best.plan, inputs)
    price = None
    if failures is not None:
        price = price_failures(
            found,
            model=failures,
            step_time_s=best.estimate.step_time_s,
            checkpoint_every=every if isinstance(every, int) else None,
        )
        every = price.checkpoint_every
    if isinstance(every, int):
        found = replace(found, checkpoint_every_steps=every)
    return PlanResult(
        plan=found,
        estimate=best.estimate,
        runners_up=result.runners_up,
        upper_bound_tokens_per_s=result.upper_bound_tokens_per_s,
        num_structures=result.num_structures,
        elapsed_s=result.elapsed_s,
        verification=verification,
        warnings=warnings,
        checkpoint=price,
    )


def _checkpoint_every(value: object, failures: object) -> int | str | None:
    """``checkpoint_every`` checked against ``failures``, before any search: a whole number
    of steps, or "auto" (the default where a failure model is given), which needs one."""
    if failures is not None:
        check_instance(
            "failures", failures, FailureModel, expected="a FailureModel (piebald.cost.failure)"
        )
    if value is None:
        return None if failures is None else "auto"
    if value == "auto":
        if failures is None:
            raise ArgumentError(
                argument="checkpoint_every",
                value=value,
                expected="a failure model (failures=FailureModel(mtbf_s=...)) with it: auto "
                "is Daly's interval for a failure rate",
            )
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(
            argument="checkpoint_every",
            value=value,
            expected="a whole number of steps >= 1, 'auto' or None",
        )
    return value


def _check_search(*, profiles: object, progress: object, workers: object) -> None:
    """The arguments every search takes, before any file is read or work started."""
    check_profiles(profiles)
    check_callable("progress", progress)
    check_int("workers", workers, minimum=1, optional=True)


def plan(
    cluster: str | Path | ClusterSpec,
    model: str | Path | ModelSpec,
    job: JobSpec,
    *,
    strategy: str = "piebald",
    zero: str | ZeroMode | None = None,
    tensor_parallel: int | None = None,
    recompute: str | Sequence[str] | None = None,
    profiles: Profiles | None = None,
    verify_by_simulation: bool = False,
    progress: Progress | None = None,
    workers: int | None = None,
    checkpoint_every: int | str | None = None,
    failures: FailureModel | None = None,
) -> Plan:
    """The fastest plan for ``model`` on ``cluster`` that fits every GPU's memory, as
    ``piebald plan`` makes it (the same plan for the same inputs).

    ``cluster``: a YAML path or a loaded ClusterSpec; ``model``: a preset name, a Hugging
    Face config path or a ModelSpec; ``strategy``: piebald, or a baseline to plan as;
    ``zero``: every stage in this ZeRO mode (none, optimizer, gradients, full);
    ``tensor_parallel``: every stage at this tensor-parallel degree (1, 2, 4, 8; default:
    searched per stage); ``recompute``: the recompute modes a stage may take, one or
    several of none, selective, full (a comma-separated string or a sequence; default:
    the strategy's, selective only on clusters up to 256 GPUs);
    ``profiles``: a profile DB directory (or a loaded ``ProfileDB``) to price compute,
    activation memory and links from its measurements (the plan records them);
    ``verify_by_simulation``: simulate the top candidates and keep the fastest simulated
    (``piebald plan --simulate``); ``progress(fraction, message)``: called as the search
    goes; ``workers``: processes the search of a large cluster may use (default: every
    core; the plan is the same); ``checkpoint_every``: the checkpoint interval the plan
    records (``checkpoint_every_steps``), a whole number of steps or "auto", Daly's
    interval for ``failures`` (a ``piebald.cost.failure.FailureModel``: the mean time
    between failures and what recovering costs; with it, "auto" is the default). The
    plan's ``predicted`` holds ``step_time_s``, ``tokens_per_s`` and peak memory per rank.
    Raises :class:`Infeasible` when no plan fits. :func:`search_plans` also returns the
    runners-up and the search's statistics (and with ``failures`` what a failure costs).

    >>> from piebald.api import build_job
    >>> from piebald.examples import example_path
    >>> best = plan(example_path(), "tiny", build_job(global_batch=8, seq_len=64))
    >>> best.predicted.step_time_s > 0
    True
    """
    return search_plans(
        cluster,
        model,
        job,
        strategy=strategy,
        zero=zero,
        tensor_parallel=tensor_parallel,
        recompute=recompute,
        profiles=profiles,
        verify_by_simulation=verify_by_simulation,
        progress=progress,
        workers=workers,
        checkpoint_every=checkpoint_every,
        failures=failures,
    ).plan


def compare(
    cluster: str | Path | ClusterSpec,
    model: str | Path | ModelSpec,
    job: JobSpec,
    *,
    profiles: Profiles | None = None,
    strategies: Sequence[str] | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
) -> Comparison:
    """piebald against every baseline (or the named ``strategies``), each planned under
    the same cost model, and the upper bound, as ``piebald compare`` reports them. Each
    row has ``strategy``, ``feasible``, ``tokens_per_s``, ``step_time_s``, ``reason`` and
    its ``plan`` (None where nothing fits). ``progress(fraction, strategy)``: called as
    each strategy starts; ``workers``: as in :func:`plan`.

    >>> from piebald.api import build_job
    >>> from piebald.examples import example_path
    >>> job = build_job(global_batch=8, seq_len=64)
    >>> compare(example_path(), "tiny", job, strategies=["piebald", "megatron"]).rows[0].strategy
    'piebald'
    """
    check_job(job)
    if strategies is not None and (
        isinstance(strategies, str) or not all(isinstance(name, str) for name in strategies)
    ):
        raise ArgumentError(
            argument="strategies",
            value=strategies,
            expected="a sequence of strategy names (a list of str) or None",
        )
    _check_search(profiles=profiles, progress=progress, workers=workers)
    cluster_spec, model_spec = as_cluster(cluster), as_model(model)
    chosen = (
        tuple(STRATEGIES.values())
        if strategies is None
        else tuple(strategy_named(name) for name in strategies)
    )
    check_job_fits_model(job, model_spec)
    inputs, _ = profiled(profiles, cluster=cluster_spec, model=model_spec, job=job)
    priced_cluster, curve = planning_prices(inputs, cluster=cluster_spec)
    names = [strategy.name for strategy in chosen]

    def on_strategy(name: str) -> None:
        if progress is not None:
            progress(names.index(name) / len(names), name)

    return compare_strategies(
        priced_cluster,
        model=model_spec,
        job=job,
        strategies=chosen,
        curve=curve,
        on_strategy=on_strategy,
        workers=workers,
    )


def explain(plan: Plan | str | Path) -> Explanation:
    """Where ``plan``'s step time goes (``piebald explain``): per stage its compute, its
    traffic and what limits it, per GPU its busy share and memory; priced as the plan was
    made (from the measurements it records, if any).

    >>> from piebald.api import build_job
    >>> from piebald.examples import example_path
    >>> job = build_job(global_batch=8, seq_len=64)
    >>> best = plan(example_path(), "tiny", job, strategy="megatron")  # a quick one
    >>> len(explain(best).stages) == best.num_stages
    True
    """
    chosen = as_plan(plan)
    source = str(plan) if isinstance(plan, (str, Path)) else "plan"
    return explain_plan(chosen, curve=recorded_curve(chosen, source=source))


def fallback_plans(
    plan: Plan | str | Path,
    directory: str | Path,
    *,
    workers: int | None = None,
    progress: Progress | None = None,
) -> FallbackPlans:
    """The plans to fall back on when one node of ``plan``'s cluster is lost, made now so
    that recovery reads a file instead of searching (``piebald plan --fallbacks DIR``).

    Nodes of a group are identical, so the loss of any one node of a group leaves a
    cluster of one shape: one plan per node group (the search's answer for the nodes left,
    with ``plan``'s model, job and prices) stands for the loss of each of its nodes. Each
    is written to ``directory`` (created if need be) as ``fallback-<key>.json``, the key
    a hash of the remaining cluster's shape; ``piebald.planner.fallback.find_fallback_plan``
    finds the one for a membership of live nodes. A file already there is kept where it
    holds the same plan and refused (an ``OutputError``, nothing replaced) where it holds
    another. ``plan``: a Plan or a plan file's path; ``workers``: as in :func:`plan`;
    ``progress(fraction, message)``: called after each fallback plan. Returns the files
    written (``written``) and the nodes whose loss no plan fits (``infeasible``: one per
    group, skipped); a cluster of one node has no fallback plans.

    >>> import tempfile
    >>> from piebald.api import build_job
    >>> from piebald.examples import example_path
    >>> best = plan(example_path(), "tiny", build_job(global_batch=8, seq_len=64))
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     made = fallback_plans(best, folder)
    >>> len(made.written), made.infeasible  # lab-mix: three groups of one node
    (3, ())
    """
    chosen = as_plan(plan)
    folder = check_path("directory", directory)
    check_callable("progress", progress)
    check_int("workers", workers, minimum=1, optional=True)
    check_output_directory(folder, flag="directory")  # before any search
    return write_fallback_plans(
        chosen, folder, progress=progress, workers=workers, flag="directory"
    )
