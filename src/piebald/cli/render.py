"""Rich tables for the CLI: clusters, catalogs, models and plans. Only the CLI imports this."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table

from piebald.cost.plan_estimate import PlanEstimate, model_flops_utilization
from piebald.report.explain import Explanation
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan
from piebald.specs.recompute import Recompute
from piebald.specs.units import format_bytes, format_rate

if TYPE_CHECKING:
    from piebald.api import Comparison

__all__ = [
    "catalog_table",
    "cluster_table",
    "comparison_table",
    "explanation_tables",
    "models_table",
    "plan_summary",
    "plan_table",
]

# The plan table's recompute column.
_RECOMPUTE_CELL = {Recompute.NONE: "no", Recompute.SELECTIVE: "sel", Recompute.FULL: "yes"}


def _tflops(flops: float) -> str:
    return f"{flops / 1e12:,.1f}" if flops else "-"


def _efficiencies(device: DeviceType, dtype: Dtype) -> str:
    """A device's GEMM and attention fractions in ``dtype``, '*' after an assumed one."""
    matmul = device.measured_matmul_efficiency(dtype)
    attention = device.measured_attention_efficiency(dtype)
    return (
        f"{device.sustained_matmul_efficiency(dtype):.2f}{'*' if matmul is None else ''} / "
        f"{device.sustained_attention_efficiency(dtype):.2f}{'*' if attention is None else ''}"
    )


def cluster_table(cluster: ClusterSpec) -> Table:
    table = Table(
        title=f"cluster {cluster.name}: {cluster.num_gpus} GPUs, {len(cluster.nodes)} nodes, "
        f"sites {', '.join(cluster.sites)}"
    )
    for column in (
        "group",
        "nodes x GPUs",
        "GPU",
        "ranks",
        "intra link",
        "NIC",
        "site",
        "bf16 TFLOP/s",
        "memory",
    ):
        left = column in ("group", "GPU", "NIC", "site")
        table.add_column(column, no_wrap=True, justify="left" if left else "right")
    rank = 0
    for group in cluster.node_groups:
        num = group.count * group.gpus_per_node
        nic = f"{group.nic.kind.value} {format_rate(group.nic.bandwidth_bytes_per_s)}"
        table.add_row(
            group.name,
            f"{group.count} x {group.gpus_per_node}",
            group.device.name,
            f"{rank}-{rank + num - 1}",
            f"{group.intra_link_bytes_per_s / 1e9:g} GB/s",
            nic,
            group.site,
            _tflops(num * group.device.training_peak_flops(Dtype.BF16)),
            format_bytes(num * group.device.memory_bytes),
        )
        rank += num
    table.add_section()
    table.add_row(
        "total",
        str(len(cluster.nodes)),
        "",
        f"0-{cluster.num_gpus - 1}",
        "",
        "",
        "",
        _tflops(cluster.total_peak_flops()),
        format_bytes(cluster.total_memory_bytes),
    )
    return table


def catalog_table(devices: list[DeviceType]) -> Table:
    table = Table(
        title="GPU catalog (dense peaks; GEMM / attention: the fractions of the 16-bit and the "
        "fp32 peak a transformer block's kernels sustain, * where assumed, not measured)"
    )
    for column in (
        "name",
        "memory",
        "bf16 TFLOP/s",
        "fp16 TFLOP/s",
        "fp32 TFLOP/s",
        "memory bandwidth",
        "16-bit GEMM / attention",
        "fp32 GEMM / attention",
    ):
        table.add_column(column, justify="left" if column == "name" else "right")
    for device in devices:
        table.add_row(
            device.name,
            format_bytes(device.memory_bytes),
            _tflops(device.bf16_flops),
            _tflops(device.fp16_flops),
            _tflops(device.fp32_flops),
            f"{device.memory_bandwidth_bytes_per_s / 1e9:,.0f} GB/s",
            *(_efficiencies(device, dtype) for dtype in (Dtype.BF16, Dtype.FP32)),
        )
    return table


def models_table(models: list[ModelSpec], *, seq_len: int) -> Table:
    table = Table(title="model presets")
    for column in (
        "name",
        "family",
        "parameters",
        "blocks",
        "hidden",
        "heads",
        "kv heads",
        "vocab",
        f"GFLOP/token (fwd+bwd, seq {seq_len})",
    ):
        table.add_column(column, justify="left" if column in ("name", "family") else "right")
    for model in models:
        arch = model.arch
        table.add_row(
            model.name,
            arch.family.value,
            f"{model.num_params / 1e9:.3f} B",
            str(arch.num_blocks),
            str(arch.hidden_size),
            str(arch.num_heads),
            str(arch.num_kv_heads),
            str(arch.vocab_size),
            f"{model.training_flops_per_token(seq_len=seq_len) / 1e9:,.2f}",
        )
    return table


def _rank_cell(ranks: Sequence[int]) -> str:
    """Ranks as a row shows them: ``4``, ``4-7`` where consecutive, else listed."""
    if len(ranks) == 1:
        return str(ranks[0])
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def plan_table(plan: Plan, estimate: PlanEstimate) -> Table:
    """The plan stage by stage, a row per run of ranks alike in every other column (a
    tensor group's ranks together, its memory the group's peak): a few rows per stage
    however many GPUs it has."""
    tokens_per_s = estimate.tokens_per_s
    mfu = model_flops_utilization(plan, tokens_per_s=tokens_per_s)
    title = (
        f"{plan.model.name} on {plan.cluster.name}: step {estimate.step_time_s:.3f} s, "
        f"{tokens_per_s:,.0f} tokens/s, MFU {mfu:.1%} (dense peaks), "
        f"bottleneck {estimate.bottleneck}"
    )
    caption = (
        "rank: ranks alike in every column share a row; tp: tensor-parallel degree (a "
        "row's ranks form whole tensor groups, each its leader first; memory: a group's "
        "peak), mbs: micro-batch size, #mb: micro-batches per step, shard: fraction of the "
        "stage's training state, rc: recompute (sel: selective), busy: compute time / step "
        "time"
    )
    table = Table(title=title, caption=caption)
    for column in (
        "stage",
        "layers",
        "rank",
        "GPU",
        "tp",
        "mbs",
        "#mb",
        "shard",
        "zero",
        "rc",
        "busy",
        "memory (peak / capacity)",
    ):
        left = column in ("GPU", "zero")
        table.add_column(column, no_wrap=True, justify="left" if left else "right")
    for index, (stage, stage_estimate) in enumerate(zip(plan.stages, estimate.stages, strict=True)):
        t = stage.tensor_parallel_degree
        rows: list[tuple[list[int], tuple[str, ...]]] = []
        for start in range(0, len(stage.ranks), t):  # a tensor group (one rank at t = 1)
            group = stage.ranks[start : start + t]
            device = plan.cluster.device_of(group[0])
            memory = max(stage_estimate.memory[rank].total_bytes for rank in group)
            busy = max(stage_estimate.compute_s[rank] for rank in group) / estimate.step_time_s
            cells: tuple[str, ...] = (
                device.name,
                "-" if t == 1 else str(t),
                str(stage.micro_batch_size[start]),
                str(stage.num_micro_batches[start]),
                f"{stage.shard_fraction[start]:.3f}",
                stage.zero.value,
                _RECOMPUTE_CELL[stage.recompute],
                f"{busy:.0%}",
                f"{memory / 2**30:.1f} / {device.memory_bytes / 2**30:.1f} GiB",
            )
            if rows and rows[-1][1] == cells:
                rows[-1][0].extend(group)
            else:
                rows.append((list(group), cells))
        for row, (ranks, shown) in enumerate(rows):
            first = row == 0
            table.add_row(
                str(index) if first else "",
                f"{stage.layer_start}-{stage.layer_end - 1}" if first else "",
                _rank_cell(ranks),
                *shown,
            )
        table.add_section()
    return table


def plan_summary(
    plan: Plan, estimate: PlanEstimate, *, elapsed_s: float, num_structures: int
) -> list[str]:
    """Lines under the plan table: bound, efficiency, notes, how long the search took."""
    lines = []
    if plan.upper_bound_tokens_per_s:
        lines.append(
            f"upper bound {plan.upper_bound_tokens_per_s:,.0f} tokens/s (each GPU's "
            "best standalone throughput, summed); achievable efficiency "
            f"{estimate.tokens_per_s / plan.upper_bound_tokens_per_s:.1%}"
        )
    lines += [f"note: {note}" for note in plan.notes]
    lines.append(f"searched {num_structures:,} structures in {elapsed_s:.1f} s")
    return lines


def explanation_tables(plan: Plan, explanation: Explanation) -> list[Table | str]:
    estimate = explanation.estimate
    step = estimate.step_time_s
    time_table = Table(
        title=f"where the {step:.3f} s step goes (bottleneck: {estimate.bottleneck}; "
        "tp: tensor-parallel degree x tensor groups)"
    )
    for column in (
        "stage",
        "layers",
        "tp",
        "compute",
        "bubble",
        "p2p to next",
        "DP sync",
        "sync exposed",
    ):
        time_table.add_column(column, justify="right", no_wrap=True)
    for stage in explanation.stages:
        time_table.add_row(
            str(stage.index),
            f"{stage.layers[0]}-{stage.layers[1] - 1}",
            (
                f"{stage.tensor_parallel_degree} x {stage.num_tensor_groups}"
                if stage.tensor_parallel_degree > 1
                else "-"
            ),
            f"{stage.compute_s:.3f} s ({stage.compute_s / step:.0%})",
            f"{stage.bubble_s:.3f} s ({stage.bubble_s / step:.0%})",
            f"{stage.p2p_s:.3f} s",
            f"{stage.sync_s:.3f} s",
            f"{stage.exposed_sync_s:.3f} s",
        )
    time_table.caption = (
        f"pipeline {estimate.pipeline_s:.3f} s + exposed sync "
        f"{estimate.exposed_sync_s:.3f} s + optimizer step "
        f"{explanation.optimizer_s:.3f} s = {step:.3f} s"
    )
    gpu_table = Table(title="what limits each GPU")
    for column in ("rank", "GPU", "stage", "busy", "memory (peak / capacity)", "verdict"):
        gpu_table.add_column(
            column, justify="left" if column in ("GPU", "verdict") else "right", no_wrap=True
        )
    for gpu in explanation.gpus:
        gpu_table.add_row(
            str(gpu.rank),
            gpu.device,
            str(gpu.stage),
            f"{gpu.busy_fraction:.0%}",
            f"{gpu.memory_bytes / 2**30:.1f} / {gpu.capacity_bytes / 2**30:.1f} GiB",
            gpu.verdict,
        )
    out: list[Table | str] = [time_table, gpu_table]
    if plan.idle_ranks:
        out.append(f"idle GPUs: {list(plan.idle_ranks)}")
    if plan.runners_up:
        runners = Table(title="runner-up plans")
        runners.add_column("tokens/s", justify="right", no_wrap=True)
        runners.add_column("vs chosen", justify="right", no_wrap=True)
        runners.add_column("structure")
        for runner in plan.runners_up:
            runners.add_row(
                f"{runner.tokens_per_s:,.0f}",
                f"{runner.tokens_per_s / estimate.tokens_per_s - 1:+.1%}",
                runner.description,
            )
        out.append(runners)
    return out


def comparison_table(comparison: Comparison, *, title: str) -> Table:
    bound = comparison.upper_bound_tokens_per_s
    table = Table(
        title=title,
        caption=f"upper bound {bound:,.0f} tokens/s; baselines are the "
        "same search restricted to what each system can express (as modelled)",
    )
    for column in ("strategy", "tokens/s", "of bound", "step", "GPUs used", "plan or reason"):
        table.add_column(
            column,
            justify="left" if column in ("strategy", "plan or reason") else "right",
            no_wrap=column != "plan or reason",
        )
    for row in comparison.rows:
        if row.feasible:
            table.add_row(
                row.strategy,
                f"{row.tokens_per_s:,.0f}",
                f"{row.tokens_per_s / bound:.0%}",
                f"{row.step_time_s:.3f} s",
                str(row.num_gpus_used),
                row.reason,
            )
        else:
            table.add_row(row.strategy, "-", "-", "-", "-", f"does not fit: {row.reason}")
    return table
