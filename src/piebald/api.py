"""piebald from Python: describe a cluster, a model and a job; plan; estimate and simulate
a plan; compare strategies; save and load plans; emulate or train under a plan.

The same library calls the ``piebald`` command line makes, without its printing: what the
CLI shows as tables comes back as dataclasses. Planning, estimating and simulating never
import torch; :func:`emulate` and :func:`train` import it when called.

>>> import piebald
>>> cluster = piebald.load_cluster("src/piebald/examples/lab-mix.yaml")
>>> model = piebald.load_model("gpt2")
>>> job = piebald.build_job(global_batch=32, seq_len=1024)
>>> plan = piebald.plan(cluster, model, job)
>>> plan.predicted.tokens_per_s > 0
True
>>> piebald.simulate(plan).step_time_s > 0
True

Bad arguments raise :class:`~piebald.errors.ArgumentError` (a ``ValueError``) naming the
argument; bad files raise :class:`~piebald.errors.SpecError` naming the file and field;
no plan fitting memory raises :class:`Infeasible`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from piebald.cost.plan_estimate import PlanEstimate, estimate_plan
from piebald.errors import ArgumentError
from piebald.planner import verify
from piebald.planner.choices import (
    check_tensor_parallel_fits,
    recompute_modes,
    strategy_named,
    tensor_parallel_degree,
    zero_mode_named,
)
from piebald.planner.compare import Comparison, compare_strategies
from piebald.planner.search import Infeasible, search
from piebald.planner.strategies import STRATEGIES
from piebald.profiler.apply import ProfiledInputs
from piebald.profiler.db import ProfileDB
from piebald.profiler.pricing import (
    ProfileWarning,
    load_profiles,
    plan_prices,
    plan_with_cost_inputs,
    planning_prices,
    unmatched_profiles,
)
from piebald.schedule.prices import Prices
from piebald.simulator.engine import simulate as simulate_step
from piebald.simulator.result import SimulationResult
from piebald.specs import cluster_yaml, plan_io, presets
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import Dtype
from piebald.specs.job import JobSpec, Optimizer, check_job_fits_model, check_job_size
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan, ZeroMode

if TYPE_CHECKING:
    from piebald.runtime.training.config import TrainConfig
    from piebald.runtime.training.metrics import RunSummary

__all__ = [
    "ClusterSpec",
    "Comparison",
    "Dtype",
    "Infeasible",
    "JobSpec",
    "ModelSpec",
    "Plan",
    "PlanEstimate",
    "ProfileWarning",
    "SimulationResult",
    "ZeroMode",
    "build_job",
    "compare",
    "emulate",
    "estimate",
    "load_cluster",
    "load_model",
    "load_plan",
    "plan",
    "save_plan",
    "simulate",
    "train",
]

Profiles = str | Path | ProfileDB
Progress = Callable[[float, str], None]


def load_cluster(path: str | Path) -> ClusterSpec:
    """A cluster YAML file, validated (``piebald check-cluster`` shows one)."""
    return cluster_yaml.load_cluster(path)


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A preset by name (``piebald models`` lists them: ``"gpt2"``, ``"llama-3-8b"``, ...),
    or a Hugging Face ``config.json`` or the directory holding it."""
    return presets.load_model(str(name_or_path))


def build_job(
    *,
    global_batch: int,
    seq_len: int,
    precision: str | Dtype = Dtype.BF16,
    optimizer: str | Optimizer = Optimizer.ADAMW,
    seed: int = 0,
) -> JobSpec:
    """A :class:`JobSpec` from the CLI's words: ``global_batch`` sequences of ``seq_len``
    tokens per optimizer step (the dataclass calls it ``global_batch_size``), precision and
    optimizer by name; a value out of range is an ArgumentError naming the argument.

    >>> build_job(global_batch=8, seq_len=128, precision="fp16").global_batch_size
    8
    """
    check_job_size(global_batch=global_batch, seq_len=seq_len)
    return JobSpec(
        global_batch_size=global_batch,
        seq_len=seq_len,
        precision=Dtype(_choice("precision", precision, [d.value for d in Dtype])),
        optimizer=Optimizer(_choice("optimizer", optimizer, [o.value for o in Optimizer])),
        seed=seed,
    )


def _choice(argument: str, value: str, allowed: list[str]) -> str:
    if value not in allowed:
        raise ArgumentError(argument=argument, value=value, expected=f"one of {allowed}")
    return value


def _cluster(cluster: str | Path | ClusterSpec) -> ClusterSpec:
    return cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)


def _model(model: str | Path | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model)


def _check_job(job: JobSpec) -> None:
    """``job`` is a :class:`JobSpec` (a dict or the CLI's words are not)."""
    if not isinstance(job, JobSpec):
        raise ArgumentError(
            argument="job",
            value=type(job).__name__,
            expected="a JobSpec (piebald.build_job(global_batch=..., seq_len=...))",
        )


def _plan(plan: Plan | str | Path) -> Plan:
    """A plan, or the plan JSON file at a path (:func:`load_plan`)."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, Path)):
        return load_plan(plan)
    raise ArgumentError(
        argument="plan",
        value=type(plan).__name__,
        expected="a Plan (from piebald.plan or load_plan) or the path of a plan JSON file",
    )


def _profiled(
    profiles: Profiles | None, *, cluster: ClusterSpec, model: ModelSpec, job: JobSpec
) -> ProfiledInputs | None:
    """``profiles`` applied to ``cluster``; what the DB cannot price is a ProfileWarning
    (those parts are priced analytically), as the CLI warns on stderr."""
    if profiles is None:
        return None
    inputs = load_profiles(profiles, cluster=cluster, model=model, precision=job.precision)
    where = inputs.db.root if isinstance(profiles, ProfileDB) else str(profiles)
    for line in unmatched_profiles(inputs, cluster=cluster):
        warnings.warn(f"profile DB {where}: {line}", ProfileWarning, stacklevel=3)
    return inputs


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
    core; the plan is the same). The plan's ``predicted`` holds ``step_time_s``,
    ``tokens_per_s`` and peak memory per rank. Raises :class:`Infeasible` when no plan fits.

    >>> job = build_job(global_batch=32, seq_len=1024)
    >>> best = plan("src/piebald/examples/lab-mix.yaml", "gpt2", job)
    >>> best.predicted.step_time_s > 0
    True
    """
    _check_job(job)
    cluster_spec, model_spec = _cluster(cluster), _model(model)
    chosen = strategy_named(strategy)
    zero_mode = zero_mode_named(zero, strategy=chosen)
    degree = tensor_parallel_degree(tensor_parallel, strategy=chosen, seq_len=job.seq_len)
    modes = recompute_modes(recompute, strategy=chosen)
    check_job_fits_model(job, model_spec)  # before the profiles: the cheaper mistake first
    check_tensor_parallel_fits(degree, cluster=cluster_spec, model=model_spec)
    inputs = _profiled(profiles, cluster=cluster_spec, model=model_spec, job=job)
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
    best = (
        verify.verify_by_simulation(result, curve=curve).chosen
        if verify_by_simulation
        else result.best
    )
    return plan_with_cost_inputs(best.plan, inputs)


def compare(
    cluster: str | Path | ClusterSpec,
    model: str | Path | ModelSpec,
    job: JobSpec,
    *,
    profiles: Profiles | None = None,
    strategies: Sequence[str] | None = None,
    workers: int | None = None,
) -> Comparison:
    """piebald against every baseline (or the named ``strategies``), each planned under
    the same cost model, and the upper bound, as ``piebald compare`` reports them. Each
    row has ``strategy``, ``feasible``, ``tokens_per_s``, ``step_time_s``, ``reason`` and
    its ``plan`` (None where nothing fits). ``workers``: as in :func:`plan`.

    >>> job = build_job(global_batch=32, seq_len=1024)
    >>> compare("src/piebald/examples/lab-mix.yaml", "gpt2", job).rows[0].strategy
    'piebald'
    """
    _check_job(job)
    cluster_spec, model_spec = _cluster(cluster), _model(model)
    chosen = (
        tuple(STRATEGIES.values())
        if strategies is None
        else tuple(strategy_named(name) for name in strategies)
    )
    check_job_fits_model(job, model_spec)
    inputs = _profiled(profiles, cluster=cluster_spec, model=model_spec, job=job)
    priced_cluster, curve = planning_prices(inputs, cluster=cluster_spec)
    return compare_strategies(
        priced_cluster,
        model=model_spec,
        job=job,
        strategies=chosen,
        curve=curve,
        workers=workers,
    )


def estimate(plan: Plan | str | Path, *, profiles: Profiles | None = None) -> PlanEstimate:
    """The cost model's estimate of one step of ``plan`` (or of the plan file at that
    path): ``step_time_s``, ``tokens_per_s``, per-stage times and per-rank peak memory.
    Priced from ``profiles`` if given, else from the measurements the plan records (a plan
    made with a profile DB), else analytically -- as ``simulate`` prices it, so the two
    compare like for like.

    >>> estimate(best).step_time_s == best.predicted.step_time_s  # doctest: +SKIP
    True
    """
    prices = plan_prices(_plan(plan), profiles=profiles)
    return estimate_plan(prices.plan, curve=prices.curve)


def simulate(
    plan: Plan | str | Path, *, profiles: Profiles | None = None, timeline: bool = False
) -> SimulationResult:
    """Execute one step of ``plan`` (or of the plan file at that path) event by event
    (``piebald simulate``): ``step_time_s``, ``tokens_per_s``, ``bubble_fraction``, per-rank
    busy/blocked/idle time and peak memory, and ``deadlock`` (None when the step
    completes). Priced as :func:`estimate` prices it.
    ``timeline=True`` also keeps every operation's interval (``intervals``, for traces).

    >>> result = simulate(best)  # doctest: +SKIP
    >>> result.step_time_s / estimate(best).step_time_s  # within a few percent
    """
    prices = plan_prices(_plan(plan), profiles=profiles)
    return simulate_step(
        prices.plan, prices=Prices(prices.plan, curve=prices.curve), record=timeline
    )


def load_plan(path: str | Path) -> Plan:
    """A plan JSON file (``piebald plan --out``), validated against its embedded cluster
    and model."""
    return plan_io.load_plan(path)


def save_plan(plan: Plan, path: str | Path, *, overwrite: bool = False) -> None:
    """Write ``plan`` as JSON, atomically (a temporary file beside it, then a rename). An
    existing file is kept unless ``overwrite``; even then only a regular file is replaced."""
    plan_io.save_plan(
        plan,
        path,
        overwrite=overwrite,
        flag="save_plan",
        hint="pass overwrite=True to replace it",
    )


def emulate(
    plan: Plan | str | Path,
    *,
    steps: int = 2,
    seed: int = 0,
    time_scale: float | None = None,
    max_params: int = 50_000_000,
    config: TrainConfig | None = None,
) -> RunSummary:
    """Train ``steps`` steps under ``plan`` (or the plan file at that path) on this
    machine, one CPU process per GPU of the plan's cluster (gloo over loopback), as
    ``piebald train --emulate`` does; models above ``max_params`` parameters train at
    reduced width. ``time_scale`` paces every operation to the emulated GPU's time (wall
    seconds per emulated second; None: as fast as this machine goes). ``config`` (a
    ``TrainConfig``) gives every other setting (data, checkpoints, optimizer...) and then
    replaces ``steps``, ``seed`` and ``time_scale``. Imports torch; the workers print one
    line per step on stdout.

    >>> summary = emulate(load_plan("plan.json"), steps=2)  # doctest: +SKIP
    >>> summary.losses  # doctest: +SKIP
    """
    from piebald.runtime.training.config import TrainConfig
    from piebald.runtime.training.emulate import emulate as emulate_plan

    if config is None:
        config = TrainConfig(steps=steps, seed=seed, time_scale=time_scale)
    return emulate_plan(_plan(plan), config, max_params=max_params)


def train(
    plan: Plan | str | Path,
    *,
    steps: int = 10,
    seed: int = 0,
    device: str | None = None,
    config: TrainConfig | None = None,
) -> RunSummary | None:
    """Train this rank under ``plan`` (or the plan file at that path), in a script that
    ``torchrun`` runs once per GPU of the plan's cluster (``piebald launch --plan`` prints
    those commands); the leader (rank 0) returns the run's summary, the other ranks None.
    ``device``: cpu or cuda (default: cuda if there is one); GPUs compute in the dtype the
    plan priced. ``config`` (a ``TrainConfig``) gives every other setting and then replaces
    ``steps`` and ``seed``. Outside torchrun this is a RuntimeError: use :func:`emulate` to
    run the plan's cluster on this machine. Imports torch.

    >>> summary = train(load_plan("plan.json"), steps=100)  # doctest: +SKIP
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:  # before importing torch
        raise RuntimeError(
            "piebald.train runs one rank of a torchrun job (RANK and WORLD_SIZE are not "
            "set); start it with torchrun (see `piebald launch --plan`), or call "
            "piebald.emulate to run the plan's cluster on this machine"
        )
    if device not in (None, "cpu", "cuda"):
        raise ArgumentError(argument="device", value=device, expected="cpu or cuda")
    from piebald.runtime.training.config import TrainConfig
    from piebald.runtime.training.torchrun import train_rank

    return train_rank(_plan(plan), config or TrainConfig(steps=steps, seed=seed), device=device)
