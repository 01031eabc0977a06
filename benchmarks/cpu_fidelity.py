"""Time fidelity that is not circular: this CPU profiled as a device, a cluster of CPU
"GPUs" planned and simulated from that profile, and the plan trained unpaced on gloo.

Emulation (``piebald train --emulate``) sleeps every operation to the simulator's prices,
so its agreement with the simulator checks the schedule's dependencies, not the prices.
Here nothing sleeps: the measured step is what this machine really takes, and the
simulated step is priced from what the profiler really measured.

1. Profile: each model's embedding, one block and head on one torch thread
   (``piebald profile compute --device cpu --threads 1``: thread CPU time, cold caches),
   in rounds keeping each layer's fastest, and the gloo loopback link (``piebald profile
   network --emulate``), into one profile DB.
2. Cluster: one node of 2 CPU "GPUs" (one process, one torch thread each: as many ranks as
   this machine has cores) of a custom GPU type whose peaks are what the profiler measured
   (the ``gpu_types`` line ``profile compute`` suggests).
3. Plans of a forced structure -- a 2-stage pipeline (one rank per stage, 1F1B), one
   data-parallel stage of 2 ranks, and one rank alone (the control: it needs one core) --
   recording the DB's prices (``plan --profiles``), and ``simulate --profiles``: the step
   and where it goes (compute, communication, bubble).
4. Training unpaced (``emulate`` with ``time_scale=None``, no memory meter), cases run
   alternately, each run once other work on the machine is quiet (or the waiting budget is
   spent: the run is then marked); per run the median step after the warm-up steps, and
   the median over runs.
5. Where the step goes in the runtime: an instrumented run of each plan after each
   measured one (the runtime's own ``run_rank``, every operation wrapped in a timer: wall
   clock and the thread's CPU time), the cleanest (fastest) kept, beside the simulator's
   terms; the data-parallel gradient sync as priced, as the DB
   measured gloo's collectives and as spent; and one micro-batch's passes as priced (cold
   caches), profiled with warm caches and as training ran them. ``--breakdown`` prints
   every operation per rank.

    .venv/bin/python benchmarks/cpu_fidelity.py [--runs 3] [--steps 8] [--warmup-steps 2]
        [--cases tiny-pp,tiny-dp,tiny-single,llama-256x4-pp,...] [--profile-rounds 3]
        [--max-wait 120 (seconds to wait for a quiet machine, in all)]
        [--out DIR (keep the profile DB)] [--profiles DIR (reuse a DB, measure nothing)]
        [--breakdown]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cpu_fidelity_terms import (
    SimulatedTerms,
    dominant_terms,
    simulated_terms,
)
from piebald import api
from piebald.profiler.db import load_profile_db, write_profile
from piebald.profiler.pricing import load_profiles, plan_with_cost_inputs
from piebald.profiler.records import ComputeProfile, LayerTiming
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.devices import Dtype
from piebald.specs.job import JobSpec
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.plan import Plan, Stage
from piebald.specs.presets import load_model
from runtime_overhead import MODEL as RUNTIME_OVERHEAD_MODEL

TARGET = 0.15
QUIET_CORES = 0.3  # other work under this many busy cores: a quiet machine
DEVICE = "cpu-1t"  # the custom GPU type: one core, one torch thread
NUM_RANKS = 2  # as many ranks as this machine has cores (``os.cpu_count()``)
MIB = 2**20
# The cases' micro-batch (2) and the sizes the planner may choose instead.
PROFILED_MICRO_BATCHES = (1, 2, 4)
# 16 KiB .. 16 MiB: the activation messages (32 KiB .. 1 MiB) and gradient all-reduces.
MESSAGE_BYTES = (2**14, 2**16, 2**18, MIB, 4 * MIB, 16 * MIB)

# The runtime-overhead benchmark's model: 4 blocks of width 256, seconds a step on a core.
LLAMA_256 = RUNTIME_OVERHEAD_MODEL


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    model: ModelSpec
    seq_len: int
    global_batch: int
    micro_batch: int


class Structure(StrEnum):
    PIPELINE = "pp"  # 2 stages of one rank each, 1F1B
    DATA_PARALLEL = "dp"  # one stage of NUM_RANKS ranks
    SINGLE = "single"  # one rank trains alone (the other idles): the control, one core
    PLANNED = "planned"  # what ``plan --profiles`` chooses


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    name: str
    workload: Workload
    structure: Structure

    @property
    def description(self) -> str:
        w = self.workload
        m = w.global_batch // w.micro_batch
        if self.structure is Structure.PIPELINE:
            return f"2 stages x 1 rank, 1F1B, {m} micro-batches of {w.micro_batch}"
        if self.structure is Structure.DATA_PARALLEL:
            each = m // NUM_RANKS
            return f"1 stage x {NUM_RANKS} ranks (DP), {each} micro-batches of {w.micro_batch} each"
        if self.structure is Structure.SINGLE:
            return f"1 stage x 1 rank, {m} micro-batches of {w.micro_batch}"
        return "the planner's choice"


def describe(plan: Plan) -> str:
    """A plan's structure in a few words: per stage its layers, ranks, micro-batches."""
    parts = []
    for stage in plan.stages:
        sizes = "/".join(
            f"{n}x{b}" for n, b in zip(stage.num_micro_batches, stage.micro_batch_size, strict=True)
        )
        extras = ("" if stage.zero.value == "none" else f", ZeRO {stage.zero.value}") + (
            f", recompute {stage.recompute.value}" if stage.recompute.checkpoints else ""
        )
        parts.append(
            f"layers {stage.layer_start}-{stage.layer_end} on ranks "
            f"{','.join(map(str, stage.ranks))} ({sizes}{extras})"
        )
    return "; ".join(parts)


def _workloads() -> dict[str, Workload]:
    return {
        "tiny": Workload(model=load_model("tiny"), seq_len=64, global_batch=16, micro_batch=2),
        "llama-256x4": Workload(model=LLAMA_256, seq_len=128, global_batch=16, micro_batch=2),
    }


def _cases() -> dict[str, Case]:
    workloads = _workloads()
    return {
        f"{name}-{structure}": Case(
            name=f"{name}-{structure}", workload=workload, structure=structure
        )
        for name, workload in workloads.items()
        for structure in (Structure.PIPELINE, Structure.DATA_PARALLEL, Structure.SINGLE)
    } | {
        "llama-256x4-planned": Case(
            name="llama-256x4-planned",
            workload=workloads["llama-256x4"],
            structure=Structure.PLANNED,
        )
    }


# --- 1. profile ----------------------------------------------------------------------------


def _nominal_cluster(*, matmul_flops: float, copy_bytes_per_s: float) -> ClusterSpec:
    """The cluster file a user writes from what ``profile compute`` suggests: one node of
    NUM_RANKS CPU "GPUs" (the link is replaced by the measured loopback one)."""
    return parse_cluster(
        {
            "name": "this-cpu",
            "gpu_types": [
                {
                    "name": DEVICE,
                    "memory": "4GiB",
                    "fp32_tflops": matmul_flops / 1e12,
                    "memory_bandwidth": f"{copy_bytes_per_s / 1e9:.4g}GB/s",
                }
            ],
            "nodes": [
                {"name": "n", "gpu": DEVICE, "gpus_per_node": NUM_RANKS, "intra_link": "5GB/s"}
            ],
        },
        source="cpu_fidelity",
    )


def _profile(db_dir: Path, workloads: list[Workload], *, rounds: int, budget: list[float]) -> None:
    """Each model's layers ``rounds`` times, each round once the machine is quiet, keeping
    per layer the fastest round (other work on a shared machine only ever adds time, even
    to a thread's CPU time: it takes the caches and memory bandwidth); then the link."""
    from piebald.profiler.measure_compute import profile_compute
    from piebald.profiler.measure_network import emulate_network

    torch.set_num_threads(1)
    for w in workloads:
        runs: dict[LayerKind, list[ComputeProfile]] = defaultdict(list)
        for round_index in range(rounds):
            load = wait_for_quiet(budget=budget)
            print(
                f"profiling {w.model.name} at seq {w.seq_len}, micro-batches "
                f"{PROFILED_MICRO_BATCHES}, round {round_index + 1}/{rounds} "
                f"(other work: {load:.2f} cores) ..."
            )
            for profile in profile_compute(
                w.model,
                seq_len=w.seq_len,
                micro_batch_sizes=PROFILED_MICRO_BATCHES,
                dtype=Dtype.FP32,
                device="cpu",
                num_warmup=3,
                num_repeats=9,
                device_name=DEVICE,
            ):
                runs[profile.layer_kind].append(profile)
        for profiles in runs.values():
            write_profile(fastest_run(profiles), db_dir)
    load = wait_for_quiet(budget=budget)
    print(f"profiling the gloo loopback link (other work: {load:.2f} cores) ...")
    cluster = _cluster_from_db(db_dir)
    for profile in emulate_network(cluster, message_bytes=MESSAGE_BYTES, num_repeats=5):
        write_profile(profile, db_dir)


def fastest_run(runs: list[ComputeProfile]) -> ComputeProfile:
    """Per micro-batch size, the round with the shortest forward + backward."""
    best: dict[int, LayerTiming] = {}
    for run in runs:
        for timing in run.timings:
            kept = best.get(timing.micro_batch_size)
            if (
                kept is None
                or timing.forward_s + timing.backward_s < kept.forward_s + kept.backward_s
            ):
                best[timing.micro_batch_size] = timing
    return dataclasses.replace(runs[-1], timings=tuple(best[size] for size in sorted(best)))


def _cluster_from_db(db_dir: Path) -> ClusterSpec:
    db = load_profile_db(db_dir)
    infos = [
        profile.device_info
        for key in db.compute_runs
        if (profile := db.compute(key)) is not None
        and profile.device_info.matmul_flops
        and profile.device_info.copy_bytes_per_s
    ]
    assert infos, f"{db_dir} holds no CPU compute profile"
    return _nominal_cluster(
        matmul_flops=statistics.median(i.matmul_flops or 0.0 for i in infos),
        copy_bytes_per_s=statistics.median(i.copy_bytes_per_s or 0.0 for i in infos),
    )


# --- 2./3. plans and their simulation ---------------------------------------------------


def build_plan(case: Case, cluster: ClusterSpec, *, db_dir: Path) -> Plan:
    """The case's structure, built directly; or the planner's, priced by the DB."""
    w = case.workload
    job = JobSpec(global_batch_size=w.global_batch, seq_len=w.seq_len, precision=Dtype.FP32)
    if case.structure is Structure.PLANNED:
        return api.plan(cluster, w.model, job, profiles=db_dir)
    layers = w.model.num_layers
    count = w.global_batch // w.micro_batch
    if case.structure is Structure.PIPELINE:
        half = layers // 2
        stages = tuple(
            Stage(
                layer_start=start,
                layer_end=end,
                ranks=(rank,),
                micro_batch_size=(w.micro_batch,),
                num_micro_batches=(count,),
                shard_fraction=(1.0,),
            )
            for rank, (start, end) in enumerate(((0, half), (half, layers)))
        )
        routes = ((0, 1),) * count
    elif case.structure is Structure.SINGLE:
        stages = (
            Stage(
                layer_start=0,
                layer_end=layers,
                ranks=(0,),
                micro_batch_size=(w.micro_batch,),
                num_micro_batches=(count,),
                shard_fraction=(1.0,),
            ),
        )
        routes = ((0,),) * count
    else:
        each = count // NUM_RANKS
        stages = (
            Stage(
                layer_start=0,
                layer_end=layers,
                ranks=tuple(range(NUM_RANKS)),
                micro_batch_size=(w.micro_batch,) * NUM_RANKS,
                num_micro_batches=(each,) * NUM_RANKS,
                shard_fraction=(1.0 / NUM_RANKS,) * NUM_RANKS,
            ),
        )
        routes = tuple((rank,) for rank in range(NUM_RANKS) for _ in range(each))
    return Plan(cluster=cluster, model=w.model, job=job, stages=stages, routes=routes)


# --- 4. unpaced training -------------------------------------------------------------------


def measured_step_s(plan: Plan, *, steps: int, warmup_steps: int) -> float:
    """The median wall time of the steps after ``warmup_steps`` of one unpaced run."""
    from piebald.runtime.training.config import TrainConfig
    from piebald.runtime.training.emulate import emulate

    with tempfile.TemporaryDirectory(prefix="piebald-cpu-fidelity-") as scratch:
        metrics = Path(scratch) / "metrics.jsonl"
        config = TrainConfig(steps=steps, seed=0, measure_memory=False, metrics_path=metrics)
        emulate(plan, config, max_params=10**12, lines_to_stderr=True)
        times = [json.loads(line)["step_time_s"] for line in metrics.read_text().splitlines()]
    return statistics.median(times[warmup_steps:])


# --- 5. the breakdown: every operation timed inside the real runtime ---------------------

# (module, class, method, label): what the instrumented run times.
_TIMED = (
    ("piebald.runtime.pipeline.executor", "PipelineExecutor", "_forward", "forward"),
    ("piebald.runtime.pipeline.executor", "PipelineExecutor", "_backward", "backward"),
    ("piebald.runtime.pipeline.mailbox", "Mailbox", "take", "receive wait"),
    ("piebald.runtime.pipeline.mailbox", "Mailbox", "send", "send"),
    ("piebald.runtime.pipeline.mailbox", "Mailbox", "finish", "finish sends"),
    ("piebald.runtime.distributed.flat_bucket", "FlatBucket", "reduce_gradients", "grad reduce"),
    ("piebald.runtime.distributed.optimizer", "_ShardStepper", "step", "adamw"),
    ("piebald.runtime.distributed.optimizer", "ShardedOptimizer", "step", "optimizer step"),
    ("piebald.runtime.pipeline.executor", "PipelineExecutor", "run_step", "run_step"),
)


def _instrument(totals: dict[str, list[float]]) -> None:
    import importlib

    def wrap(owner: Any, method: str, label: str) -> None:
        original: Callable[..., Any] = getattr(owner, method)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                entry = totals[label]
                entry[0] += time.perf_counter() - wall
                entry[1] += time.thread_time() - cpu

        setattr(owner, method, timed)

    for module, cls, method, label in _TIMED:
        wrap(getattr(importlib.import_module(module), cls), method, label)


def _instrumented_rank(
    rank: int, init_method: str, plan_data: dict[str, Any], steps: int, out: str
) -> None:
    from piebald.runtime.training.config import TrainConfig
    from piebald.runtime.training.rank_worker import run_rank
    from piebald.specs.plan_io import plan_from_dict

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=NUM_RANKS,
        timeout=timedelta(seconds=120),
    )  # fmt: skip
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    _instrument(totals)
    per_step: list[dict[str, list[float]]] = []
    import piebald.runtime.pipeline.executor as executor

    timed_run_step = executor.PipelineExecutor.run_step

    def run_step(self: Any, **kwargs: Any) -> Any:
        before = {label: list(value) for label, value in totals.items()}
        process_cpu = time.process_time()
        result = timed_run_step(self, **kwargs)
        step = {
            label: [value[0] - before.get(label, [0.0, 0.0])[0],
                    value[1] - before.get(label, [0.0, 0.0])[1]]
            for label, value in totals.items()
        }  # fmt: skip
        step["process cpu"] = [time.process_time() - process_cpu, 0.0]
        per_step.append(step)
        return result

    executor.PipelineExecutor.run_step = run_step
    with tempfile.TemporaryDirectory() as scratch:
        metrics = Path(scratch) / "metrics.jsonl"
        config = TrainConfig(steps=steps, seed=0, measure_memory=False, metrics_path=metrics)
        run_rank(plan_from_dict(plan_data, source="plan"), config, print_line=lambda line: None)
        walls = (
            [json.loads(line)["step_time_s"] for line in metrics.read_text().splitlines()]
            if metrics.exists()
            else []
        )
    dist.barrier()
    Path(out, f"rank-{rank}.json").write_text(json.dumps({"steps": per_step, "walls": walls}))
    dist.destroy_process_group()


StepTimes = dict[str, tuple[float, float]]  # label: (wall s, thread CPU s) in one step


def instrumented(plan: Plan, *, steps: int, warmup_steps: int) -> list[list[StepTimes]]:
    """Per used rank, each step after the warm-up: every timed operation's (wall, thread
    CPU) seconds, the rank's process CPU seconds (its gloo threads too) and, on the leader,
    the step's wall time as the runtime reports it (``step wall``)."""
    from torch.multiprocessing.spawn import start_processes

    from piebald.specs.plan_io import plan_to_dict

    with tempfile.TemporaryDirectory(prefix="piebald-cpu-fidelity-") as scratch:
        start_processes(
            _instrumented_rank,
            args=(f"file://{Path(scratch) / 'store'}", plan_to_dict(plan), steps, scratch),
            nprocs=NUM_RANKS,
            start_method="forkserver",
            join=True,
        )
        data = [json.loads(Path(scratch, f"rank-{r}.json").read_text()) for r in range(NUM_RANKS)]
    out = []
    for rank_data in data:
        if not rank_data["steps"]:
            continue  # idle under this plan
        kept = []
        for index, step in enumerate(rank_data["steps"]):
            if index < warmup_steps:
                continue
            times = {label: (value[0], value[1]) for label, value in step.items()}
            if rank_data["walls"]:
                times["step wall"] = (rank_data["walls"][index], 0.0)
            kept.append(times)
        out.append(kept)
    return out


def _median(steps: list[StepTimes], label: str, *, cpu: bool = False) -> float:
    return statistics.median(step.get(label, (0.0, 0.0))[1 if cpu else 0] for step in steps)


@dataclass(frozen=True, slots=True, kw_only=True)
class InSitu:
    """What the cleanest instrumented run of one case measured, medians over its steps."""

    step_s: float  # the leader's step, as the runtime reports it
    cores_used: float  # the used ranks' process CPU per step over the step: cores they got
    ranks: list[list[StepTimes]]


def in_situ(runs: list[list[list[StepTimes]]]) -> InSitu:
    """Of the instrumented runs of one case, the one with the shortest median step: other
    work on a shared machine only ever adds time, so it is the cleanest."""
    ranks = min(runs, key=lambda run: _median(run[0], "step wall"))
    step_s = _median(ranks[0], "step wall")
    return InSitu(
        step_s=step_s,
        cores_used=sum(_median(steps, "process cpu") for steps in ranks) / step_s,
        ranks=ranks,
    )


def _print_breakdown(case: Case, sim: SimulatedTerms, measured: InSitu) -> None:
    print(f"\n{case.name}: per rank, ms per step (median over the cleanest instrumented run)")
    print("| rank | operation | simulated | measured wall | measured thread CPU |")
    print("|---:|---|---:|---:|---:|")
    for rank, steps in enumerate(measured.ranks):
        simulated = {
            "forward": sim.forward_s[rank],
            "backward": sim.backward_s[rank],
            "optimizer step": sim.optimizer_s[rank] + sim.comm_s[rank],
        }
        labels = sorted({label for step in steps for label in step})
        for label in labels:
            priced = simulated.get(label)
            cpu = (
                ""
                if label in ("process cpu", "step wall")
                else f"{_median(steps, label, cpu=True) * 1e3:.2f}"
            )
            print(
                f"| {rank} | {label} | {'' if priced is None else f'{priced * 1e3:.2f}'} | "
                f"{_median(steps, label) * 1e3:.2f} | {cpu} |"
            )


def _mean(values: list[float] | tuple[float, ...]) -> float:
    return sum(values) / len(values)


def _print_terms(case: Case, sim: SimulatedTerms, found: InSitu) -> None:
    """The simulator's terms beside what the runtime spent on each, mean over the used
    ranks, ms per step: where the gap between the two steps comes from."""

    def each(label: str, *, cpu: bool = False) -> list[float]:
        return [_median(steps, label, cpu=cpu) for steps in found.ranks]

    def minus(a: list[float], b: list[float]) -> list[float]:
        return [x - y for x, y in zip(a, b, strict=True)]

    compute_cpu = [
        f + b for f, b in zip(each("forward", cpu=True), each("backward", cpu=True), strict=True)
    ]
    compute_wall = [f + b for f, b in zip(each("forward"), each("backward"), strict=True)]
    optimizer_cpu = minus(each("optimizer step", cpu=True), each("grad reduce", cpu=True))
    waits = [
        r + s + f
        for r, s, f in zip(each("receive wait"), each("send"), each("finish sends"), strict=True)
    ]
    leader = found.ranks[0]
    outside = _median(leader, "step wall") - _median(leader, "run_step")
    gloo_cpu = minus(each("process cpu"), each("run_step", cpu=True))
    rows = (
        ("forward + backward", _mean(sim.forward_s) + _mean(sim.backward_s),
         f"{_mean(compute_cpu) * 1e3:.1f} CPU, {_mean(compute_wall) * 1e3:.1f} wall"),
        ("optimizer (without the all-reduce)", _mean(sim.optimizer_s),
         f"{_mean(optimizer_cpu) * 1e3:.1f} CPU"),
        ("data-parallel all-reduce", _mean(sim.comm_s),
         f"{_mean(each('grad reduce')) * 1e3:.1f} wall"),
        ("pipeline waits (bubble, messages)", _mean(sim.bubble_s),
         f"{_mean(waits) * 1e3:.1f} wall"),
        ("outside the schedule (batch, metrics)", 0.0, f"{outside * 1e3:.1f} wall"),
        ("gloo's threads", 0.0, f"{_mean(gloo_cpu) * 1e3:.1f} CPU"),
        ("step", sim.step_s, f"{found.step_s * 1e3:.1f} wall"),
        ("cores the ranks got (process CPU / step)", None, f"{found.cores_used:.2f}"),
    )  # fmt: skip
    print(f"\n{case.name}: terms, ms per step, mean over the used ranks")
    print("| term | simulated | measured in the runtime |")
    print("|---|---:|---:|")
    for name, simulated, measured in rows:
        priced = "" if simulated is None else f"{simulated * 1e3:.1f}"
        print(f"| {name} | {priced} | {measured} |")


def measured_collective_s(db_dir: Path, kind: str, *, num_bytes: float) -> float | None:
    """The profile DB's gloo collective ``kind`` (all-reduce, reduce-scatter, all-gather)
    over the node's ranks at ``num_bytes`` (the whole buffer): its alpha-beta fit. The
    simulator derives collectives from the point-to-point link instead
    (``profiler.network_model``)."""
    db = load_profile_db(db_dir)
    for key in db.network_runs:
        if key.kind.value == kind and (profile := db.network(key)) is not None:
            return profile.latency_s + num_bytes / profile.bandwidth_bytes_per_s
    return None


def warm_pass_s(workload: Workload, *, budget: list[float]) -> float:
    """Forward + backward of one micro-batch through the whole model, every layer timed as
    ``profile compute`` times it but without its cache flush before each pass: the pass
    as it runs when the stage's weights and activations stay in the cache."""
    from piebald.profiler import measure_compute

    torch.set_num_threads(1)
    wait_for_quiet(budget=budget)
    timer = measure_compute._Timer
    flush = timer.flush
    timer.flush = lambda self: None  # type: ignore[method-assign]
    try:
        profiles = measure_compute.profile_compute(
            workload.model,
            seq_len=workload.seq_len,
            micro_batch_sizes=(workload.micro_batch,),
            dtype=Dtype.FP32,
            num_warmup=3,
            num_repeats=9,
        )
    finally:
        timer.flush = flush  # type: ignore[method-assign]
    counts = {kind: 0 for kind in LayerKind}
    for layer in workload.model.layers:
        counts[layer.kind] += 1
    return sum(
        (p.timings[0].forward_s + p.timings[0].backward_s) * counts[p.layer_kind] for p in profiles
    )


def busy_cores(*, seconds: float = 0.5) -> float:
    """How many cores the machine keeps busy over ``seconds`` (``/proc/stat``): measured
    while this benchmark runs nothing, it is the load of other work on a shared machine."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="utf-8") as stream:
            fields = [int(value) for value in stream.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle

    total_0, idle_0 = sample()
    time.sleep(seconds)
    total_1, idle_1 = sample()
    elapsed = total_1 - total_0
    return (os.cpu_count() or 1) * (elapsed - (idle_1 - idle_0)) / elapsed if elapsed else 0.0


def wait_for_quiet(*, budget: list[float], threshold: float = QUIET_CORES) -> float:
    """Sample other work's load until it is under ``threshold`` cores or ``budget[0]``
    seconds of waiting (shared by all calls) are spent; the last load sampled. A run
    started on a busy machine measures the other work, not piebald."""
    while True:
        started = time.perf_counter()
        load = busy_cores()
        if load < threshold or budget[0] <= 0:
            return load
        time.sleep(1.0)
        budget[0] -= time.perf_counter() - started


def _print_all_reduce(
    cases: list[Case],
    *,
    sims: dict[str, SimulatedTerms],
    details: dict[str, InSitu],
    db_dir: Path,
) -> None:
    """Per data-parallel case: the gradient sync as the simulator prices it (a ring
    all-reduce over the measured point-to-point link), as the DB measured gloo's
    collectives (the runtime syncs ZeRO-none gradients as a reduce-scatter and an
    all-gather, so every rank holds the owner's sum bit for bit) and as the runtime spent
    it."""
    print("\ndata-parallel gradient sync, ms per step")
    print(
        "| case | gradients (MB) | simulated (ring over the p2p link) | gloo all-reduce "
        "(DB) | gloo reduce-scatter + all-gather (DB) | in the runtime (wall) |"
    )
    print("|---|---:|---:|---:|---:|---:|")

    def text(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.1f}"

    for case in cases:
        if case.structure is not Structure.DATA_PARALLEL:
            continue
        num_bytes = 4.0 * case.workload.model.num_params  # fp32 gradients
        scatter = measured_collective_s(db_dir, "reduce-scatter", num_bytes=num_bytes)
        gather = measured_collective_s(db_dir, "all-gather", num_bytes=num_bytes)
        both = None if scatter is None or gather is None else scatter + gather
        runtime = _mean([_median(steps, "grad reduce") for steps in details[case.name].ranks])
        print(
            f"| {case.name} | {num_bytes / 1e6:.1f} | {_mean(sims[case.name].comm_s) * 1e3:.1f} "
            f"| {text(measured_collective_s(db_dir, 'all-reduce', num_bytes=num_bytes))} | "
            f"{text(both)} | {runtime * 1e3:.1f} |"
        )


def _print_cache_effect(
    cases: list[Case],
    *,
    sims: dict[str, SimulatedTerms],
    details: dict[str, InSitu],
    budget: list[float],
) -> None:
    """Per single-rank case: a micro-batch's passes as priced (the profile's cold caches),
    profiled with warm caches, and as training ran them."""
    print("\nforward + backward of one micro-batch, whole model, ms (one rank alone)")
    print(
        "| model | profiled, cold caches (priced) | profiled, warm caches | in training "
        "(thread CPU) |"
    )
    print("|---|---:|---:|---:|")
    for case in cases:
        if case.structure is not Structure.SINGLE:
            continue
        w = case.workload
        count = w.global_batch // w.micro_batch
        sim = sims[case.name]
        found = details[case.name].ranks[0]
        trained = _median(found, "forward", cpu=True) + _median(found, "backward", cpu=True)
        print(
            f"| {w.model.name} | {(sim.forward_s[0] + sim.backward_s[0]) / count * 1e3:.2f} | "
            f"{warm_pass_s(w, budget=budget) * 1e3:.2f} | {trained / count * 1e3:.2f} |"
        )


# --- the report ------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--cases", default=",".join(_cases()))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profiles", type=Path, default=None)
    parser.add_argument("--breakdown", action="store_true", help="Print every operation's times.")
    parser.add_argument("--profile-rounds", type=int, default=3)
    parser.add_argument(
        "--max-wait",
        type=float,
        default=120.0,
        help="Seconds, in all, to wait for other work to quiet down before a run.",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    budget = [args.max_wait]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cases = [_cases()[name] for name in args.cases.split(",")]
    if args.profiles is not None:
        db_dir = args.profiles
    else:
        db_dir = args.out or Path(tempfile.mkdtemp(prefix="piebald-cpu-profiles-"))
        db_dir.mkdir(parents=True, exist_ok=True)
        workloads = {case.workload.model.name: case.workload for case in cases}
        _profile(db_dir, list(workloads.values()), rounds=args.profile_rounds, budget=budget)
        print(f"profile DB: {db_dir}")
    cluster = _cluster_from_db(db_dir)
    device = cluster.node_groups[0].device
    print(
        f"device {DEVICE}: {device.fp32_flops / 1e9:.1f} GFLOP/s fp32 (measured GEMM), "
        f"{device.memory_bandwidth_bytes_per_s / 1e9:.2f} GB/s (measured copy); "
        f"{NUM_RANKS} ranks, one torch thread each, on {os.cpu_count()} cores"
    )
    plans: dict[str, Plan] = {}
    sims: dict[str, SimulatedTerms] = {}
    for case in cases:
        plan = build_plan(case, cluster, db_dir=db_dir)
        inputs = load_profiles(
            db_dir, cluster=cluster, model=plan.model, precision=plan.job.precision
        )
        plans[case.name] = plan_with_cost_inputs(plan, inputs)
        if case.structure is Structure.PLANNED:
            print(f"{case.name}: {describe(plan)}")
        sims[case.name] = simulated_terms(
            api.simulate(plans[case.name], profiles=db_dir, timeline=True)
        )
    measured: dict[str, list[float]] = defaultdict(list)
    loads: dict[str, list[float]] = defaultdict(list)  # other work around each run, cores
    runs: dict[str, list[list[list[StepTimes]]]] = defaultdict(list)
    for run in range(args.runs):  # cases alternate: each run sees the machine as the others
        for case in cases:
            before = wait_for_quiet(budget=budget)
            plan = plans[case.name]
            measured[case.name].append(
                measured_step_s(plan, steps=args.steps, warmup_steps=args.warmup_steps)
            )
            loads[case.name].append(max(before, busy_cores()))
            wait_for_quiet(budget=budget)
            runs[case.name].append(
                instrumented(plan, steps=args.steps, warmup_steps=args.warmup_steps)
            )
        print(f"run {run + 1}/{args.runs} done ({time.perf_counter() - started:.0f} s)", flush=True)
    print(
        f"\nother work on this machine: the busier of the samples before and after each run; "
        f"a run is quiet under {QUIET_CORES} busy cores (marked * when not)"
    )
    print(
        "\n| case | structure | simulated step (ms) | measured unpaced step (ms, median; runs) "
        "| measured / simulated | quiet runs: measured / simulated | simulated terms "
        "| other work (cores, median) |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|")
    details: dict[str, InSitu] = {}
    for case in cases:
        sim = sims[case.name]
        values, busy = measured[case.name], loads[case.name]
        step = statistics.median(values)
        each = ", ".join(
            f"{value * 1e3:.0f}{'' if load < QUIET_CORES else '*'}"
            for value, load in zip(values, busy, strict=True)
        )
        ratio = step / sim.step_s
        mark = "" if abs(ratio - 1) <= TARGET else " (outside 15%)"
        quiet = [value for value, load in zip(values, busy, strict=True) if load < QUIET_CORES]
        quiet_ratio = f"{statistics.median(quiet) / sim.step_s:.2f}" if quiet else "-"
        details[case.name] = in_situ(runs[case.name])
        print(
            f"| {case.name} | {case.description} | {sim.step_s * 1e3:.1f} | "
            f"{step * 1e3:.1f} ({each}) | {ratio:.2f}{mark} | {quiet_ratio} | "
            f"{dominant_terms(sim)} | {statistics.median(busy):.2f} |"
        )
    for case in cases:
        _print_terms(case, sims[case.name], details[case.name])
    _print_all_reduce(cases, sims=sims, details=details, db_dir=db_dir)
    _print_cache_effect(cases, sims=sims, details=details, budget=budget)
    if args.breakdown:
        for case in cases:
            _print_breakdown(case, sims[case.name], details[case.name])
    print(f"\ntook {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
