"""Runtime overhead: piebald's executor against plain DistributedDataParallel.

Two CPU processes (gloo), one homogeneous data-parallel stage, the same model, batch,
micro-batches, optimizer (torch AdamW), clipping and per-step loss all-reduce. piebald
runs its schedule (``piebald.runtime.training.emulate`` without pacing: as fast as this
machine goes); DDP overlaps its bucketed gradient all-reduce with the last micro-batch's
backward (``no_sync`` on the others). Runs alternate, REPEATS times each, so both see
the same machine; the table reports the median step time of each run (steps after the
first) and the ratio of the medians. Target: piebald under 10% slower. piebald
runs without its CPU memory meter (a dispatch mode over every operator, which DDP does not
pay; on GPUs the meter reads allocator statistics for free); the last columns run it with
the meter, to show what it costs.

    .venv/bin/python benchmarks/runtime_overhead.py [--steps 12] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import start_processes
from torch.nn.parallel import DistributedDataParallel

from piebald.runtime.data.batches import batch_for_step
from piebald.runtime.data.corpus import corpus_tokens
from piebald.runtime.distributed.optimizer import OptimizerConfig, build_reference_optimizer
from piebald.runtime.models.loss import token_loss_sum
from piebald.runtime.models.stage_part import build_stage_part
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.plan import Plan, Stage, ZeroMode

GLOBAL_BATCH, SEQ_LEN, MICRO_BATCH = 8, 256, 2
MODEL = ModelSpec(
    name="llama-256x4",
    arch=ModelArch(
        family=Family.LLAMA,
        num_blocks=4,
        hidden_size=256,
        num_heads=4,
        num_kv_heads=4,
        ffn_hidden_size=688,
        vocab_size=256,
        max_seq_len=SEQ_LEN,
        tie_embeddings=False,
    ),
)


def _plan() -> Plan:
    cluster = parse_cluster(
        {
            "name": "two-cpus",
            "nodes": [
                {"name": "n", "gpu": "A100-80GB", "gpus_per_node": 2, "intra_link": "600GB/s"}
            ],
        },
        source="benchmark",
    )
    per_rank = GLOBAL_BATCH // MICRO_BATCH // 2
    stage = Stage(
        layer_start=0,
        layer_end=MODEL.num_layers,
        ranks=(0, 1),
        micro_batch_size=(MICRO_BATCH, MICRO_BATCH),
        num_micro_batches=(per_rank, per_rank),
        shard_fraction=(0.5, 0.5),
        zero=ZeroMode.NONE,
    )
    # Rank 0 takes the first half of the rows, rank 1 the second, as DDP below does.
    routes = tuple(((0,),) * per_rank + ((1,),) * per_rank)
    return Plan(
        cluster=cluster,
        model=MODEL,
        job=JobSpec(global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN),
        stages=(stage,),
        routes=routes,
    )


def _ddp_rank(rank: int, world_size: int, init_method: str, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=120),
    )  # fmt: skip
    model = build_stage_part(MODEL, layer_start=0, layer_end=MODEL.num_layers, seed=0)
    ddp = DistributedDataParallel(model)
    config = OptimizerConfig()
    optimizer = build_reference_optimizer(list(model.named_parameters()), config)
    tokens = corpus_tokens()
    rows = GLOBAL_BATCH // world_size
    tokens_in_batch = GLOBAL_BATCH * SEQ_LEN
    times = []
    started = time.perf_counter()
    for step in range(steps):
        inputs, labels = batch_for_step(
            tokens, seed=0, step=step, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN
        )
        mine = slice(rank * rows, (rank + 1) * rows)
        x, y = inputs[mine], labels[mine]
        loss_sum = torch.zeros((), dtype=torch.float64)
        for start in range(0, rows, MICRO_BATCH):
            last = start + MICRO_BATCH >= rows
            with ddp.no_sync() if not last else contextlib.nullcontext():
                logits = ddp(x[start : start + MICRO_BATCH])
                # x world size: DDP averages gradients, the loss is a share of the batch's.
                loss = token_loss_sum(logits, y[start : start + MICRO_BATCH]) / tokens_in_batch
                (loss * world_size).backward()
            loss_sum += loss.detach().double()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm or 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        dist.all_reduce(loss_sum)
        now = time.perf_counter()
        times.append(now - started)
        started = now
    if rank == 0:
        Path(out).write_text(" ".join(str(t) for t in times))
    dist.destroy_process_group()


def ddp_step_s(steps: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        out = str(Path(scratch) / "times")
        start_processes(
            _ddp_rank,
            args=(2, f"file://{Path(scratch) / 'store'}", steps, out),
            nprocs=2,
            start_method="forkserver",
            join=True,
        )
        times = [float(t) for t in Path(out).read_text().split()]
    return statistics.median(times[1:])


def piebald_step_s(steps: int, *, measure_memory: bool) -> float:
    config = TrainConfig(steps=steps, seed=0, measure_memory=measure_memory)
    summary = emulate(_plan(), config, max_params=10**9, lines_to_stderr=True)
    return GLOBAL_BATCH * SEQ_LEN / summary.tokens_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    multiprocessing.set_forkserver_preload(["torch"])
    print(
        f"model {MODEL.name} ({MODEL.num_params / 1e6:.1f}M parameters), 2 gloo processes, "
        f"global batch {GLOBAL_BATCH} x {SEQ_LEN}, micro-batches of {MICRO_BATCH}, "
        f"{args.steps} steps per run, median of steps 2..{args.steps}"
    )
    print(
        "| run | DDP step (s) | piebald step (s) | piebald / DDP | with CPU memory meter (s) "
        "| metered / DDP |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    ratios, metered_ratios = [], []
    for repeat in range(args.repeats):
        ddp = ddp_step_s(args.steps)
        ours = piebald_step_s(args.steps, measure_memory=False)
        metered = piebald_step_s(args.steps, measure_memory=True)
        ratios.append(ours / ddp)
        metered_ratios.append(metered / ddp)
        print(
            f"| {repeat + 1} | {ddp:.3f} | {ours:.3f} | {ours / ddp:.3f} | {metered:.3f} | "
            f"{metered / ddp:.3f} |",
            flush=True,
        )
    print(
        f"| median | | | {statistics.median(ratios):.3f} | | "
        f"{statistics.median(metered_ratios):.3f} |"
    )


if __name__ == "__main__":
    main()
