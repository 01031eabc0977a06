"""``piebald profile``: measure compute and links into a ProfileDB, merge DBs, calibrate;
and ``--profiles DIR`` for the planning commands.

The work is ``piebald.api``'s (``profile_compute``, ``profile_network``, ``calibrate``...),
which imports torch inside the measuring functions only; loading a DB, calibrating and
planning with one stay torch-free.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from piebald.cli.common import (
    ModelOption,
    SeqOption,
    console,
    progress_bar,
    require_installed,
    user_errors,
)
from piebald.errors import SpecError
from piebald.outputs import check_output_directory
from piebald.specs.cluster_yaml import load_cluster
from piebald.specs.devices import BLOCK_SHARE_OF_BENCHMARK_GEMM, Dtype
from piebald.specs.presets import load_model
from piebald.specs.units import format_bytes

if TYPE_CHECKING:
    from piebald.api import Calibration

# Each command imports what it calls of piebald.api (the profiler) when it runs, not with
# every command: ``piebald plan`` and ``piebald --help`` do not load the profiler.

__all__ = ["ProfilesOption", "profile_app"]

profile_app = typer.Typer(
    no_args_is_help=True,
    help="Measure layer times, memory and links into a profile DB; merge DBs; calibrate.",
)

ProfilesOption = Annotated[
    Path | None,
    typer.Option(
        "--profiles",
        help="A profile DB directory: price compute, activation memory and links from its "
        "measurements.",
    ),
]
OutOption = Annotated[Path, typer.Option("--out", help="The profile DB directory to add to.")]


#: The largest ``--message-sizes`` entry: a buffer every rank allocates twice (16 GiB).
MAX_MESSAGE_MIB = 16_384


def _sizes(text: str, option: str, *, maximum: int | None = None) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    top = f" and <= {maximum:,}" if maximum is not None else ""
    if not sizes or any(size < 1 or (maximum is not None and size > maximum) for size in sizes):
        raise SpecError(
            source=option, field="", value=text, expected=f"comma-separated whole numbers >= 1{top}"
        )
    return sizes


@profile_app.command("compute")
@user_errors
def compute(
    model: ModelOption,
    seq_len: SeqOption,
    micro_batch_sizes: Annotated[
        str, typer.Option(help="Comma-separated micro-batch sizes to time.")
    ] = "1,2,4,8",
    dtype: Annotated[
        Dtype | None, typer.Option(help="Compute dtype (default: bf16 on GPUs, fp32 on CPUs).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda if any).")] = None,
    out: OutOption = Path("profiles"),
    warmup: Annotated[int, typer.Option(min=0, help="Untimed iterations first.")] = 2,
    repeats: Annotated[int, typer.Option(min=1, help="Timed iterations (median kept).")] = 5,
    device_name: Annotated[
        str | None,
        typer.Option(
            help="Record the measurements under this GPU type name instead of the detected "
            "one (a catalog type, or 'cpu'): a name of your own, to declare in the cluster "
            "file's gpu_types. A catalog name only for a GPU of that type.",
        ),
    ] = None,
    threads: Annotated[
        int | None, typer.Option(min=1, help="CPU threads torch may use (default: torch's).")
    ] = None,
) -> None:
    """Time forward and backward (with and without recompute) of the embedding, one block
    and the head of MODEL per micro-batch size, and record them with peak memory."""
    from piebald.api import profile_compute, write_profile

    check_output_directory(out, flag="--out")  # before measuring: results must not be lost
    require_installed("torch")
    spec = load_model(model)
    sizes = _sizes(micro_batch_sizes, "--micro-batch-sizes")
    if seq_len > spec.arch.max_seq_len:
        raise SpecError(
            source="--seq-len",
            field="",
            value=seq_len,
            expected=f"at most {spec.name}'s max_seq_len {spec.arch.max_seq_len}",
        )
    with progress_bar(f"profiling {spec.name}") as progress:
        profiles = profile_compute(
            spec,
            seq_len=seq_len,
            micro_batch_sizes=sizes,
            dtype=dtype,
            device=device,
            num_warmup=warmup,
            num_repeats=repeats,
            device_name=device_name,
            threads=threads,
            progress=progress,
        )
    compute_dtype = profiles[0].key.dtype
    table = Table(title=f"{spec.name} on {profiles[0].key.device}, seq {seq_len}, {compute_dtype}")
    columns = ("layer", "micro-batch", "forward", "backward", "bwd+recompute", "bwd+selective")
    for column in (*columns, "peak mem"):
        table.add_column(column, justify="left" if column == "layer" else "right")
    for profile in profiles:
        for t in profile.timings:
            table.add_row(
                profile.layer_kind.value,
                str(t.micro_batch_size),
                _ms(t.forward_s),
                _ms(t.backward_s),
                _ms(t.backward_recompute_s),
                _ms(t.backward_selective_s),
                format_bytes(t.peak_memory_bytes),
            )
    console.print(table)
    for profile in profiles:
        console.print(f"wrote {write_profile(profile, out)}", highlight=False)
    info = profiles[0].device_info
    if not info.in_catalog and info.matmul_flops and info.copy_bytes_per_s:
        tflops = info.matmul_flops / 1e12
        field = "fp32_tflops" if compute_dtype is Dtype.FP32 else f"{compute_dtype}_tflops"
        # The measured rate is a large GEMM's: a block's GEMMs reach the share of it the
        # catalog gives a benchmarked type.
        efficiency = (
            "fp32_matmul_efficiency" if compute_dtype is Dtype.FP32 else "matmul_efficiency"
        )
        console.print(
            f"{info.name!r} is not in the catalog; declare it in the cluster file's gpu_types:\n"
            f"  - {{name: {info.name}, memory: {info.memory_bytes / 2**30:.0f}GiB, "
            f"{field}: {tflops:.4g}"
            + ("" if field == "fp32_tflops" else f", fp32_tflops: {tflops:.4g}")
            + f", memory_bandwidth: {info.copy_bytes_per_s / 1e9:.3g}GB/s, "
            f"{efficiency}: {BLOCK_SHARE_OF_BENCHMARK_GEMM}}}",
            highlight=False,
        )


@profile_app.command("network")
@user_errors
def network(
    cluster: Annotated[Path, typer.Option(help="Cluster YAML file (names the node groups).")],
    emulate: Annotated[
        bool, typer.Option(help="Run gloo processes on this machine instead of torchrun ranks.")
    ] = False,
    message_sizes: Annotated[
        str, typer.Option(help="Comma-separated message sizes in MiB.")
    ] = "1,4,16,64,256,1024",
    out: OutOption = Path("profiles"),
    warmup: Annotated[int, typer.Option(min=0)] = 1,
    repeats: Annotated[int, typer.Option(min=1)] = 3,
) -> None:
    """Point-to-point links between and inside node groups and collectives over nodes,
    node groups and the cluster; fits latency + size/bandwidth per link."""
    from piebald.api import profile_network, write_profile

    check_output_directory(out, flag="--out")  # before measuring: results must not be lost
    require_installed("torch")
    spec = load_cluster(cluster)
    mib = _sizes(message_sizes, "--message-sizes", maximum=MAX_MESSAGE_MIB)
    sizes = tuple(size * 2**20 for size in mib)
    with contextlib.ExitStack() as stack:
        if emulate:
            progress = stack.enter_context(progress_bar("emulated network"))
            progress(0.0, "spawning gloo processes")
        profiles = profile_network(
            spec, emulate=emulate, message_bytes=sizes, num_warmup=warmup, num_repeats=repeats
        )
    if not profiles:  # not rank 0
        return
    table = Table(title=f"network of {spec.name}" + (" (emulated on loopback)" if emulate else ""))
    for column in ("measurement", "latency", "bandwidth", "largest message"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    for profile in profiles:
        table.add_row(
            profile.key.describe(),
            f"{profile.latency_s * 1e6:.1f} us",
            f"{profile.bandwidth_bytes_per_s / 1e9:.3g} GB/s",
            f"{profile.time_s[-1] * 1e3:.3f} ms",
        )
    console.print(table)
    for profile in profiles:
        console.print(f"wrote {write_profile(profile, out)}", highlight=False)


@profile_app.command("merge")
@user_errors
def merge(
    sources: Annotated[list[Path], typer.Argument(help="Profile DB directories to merge.")],
    into: Annotated[Path, typer.Option(help="The DB directory to merge into.")],
) -> None:
    """Copy every profile of SOURCES into INTO; runs of one key from different machines
    are all kept (the loader takes their median)."""
    from piebald.api import load_profile_db, merge_profile_dbs

    check_output_directory(into, flag="--into")
    copied = merge_profile_dbs(sources, into)
    db = load_profile_db(into)
    console.print(
        f"copied {len(copied)} files; {into} holds {db.num_files} files, "
        f"{len(db.compute_runs)} compute keys, {len(db.network_runs)} network keys",
        highlight=False,
    )


def _error_rows_table(calibration: Calibration) -> Table:
    table = Table(title=f"{calibration.device} ({calibration.dtype}): analytic vs measured")
    for column in ("layer", "pass", "points", "error before", "error after", "max after"):
        table.add_column(column, justify="left" if column in ("layer", "pass") else "right")
    for old, new in zip(calibration.before, calibration.after, strict=True):
        table.add_row(
            old.layer_kind.value,
            old.pass_kind.value,
            str(old.num_points),
            f"{old.mean_abs_error:.1%}",
            f"{new.mean_abs_error:.1%}",
            f"{new.max_abs_error:.1%}",
        )
    return table


@profile_app.command("calibrate")
@user_errors
def calibrate(
    profiles: Annotated[Path, typer.Option("--profiles", help="The profile DB directory.")],
    cluster: Annotated[
        Path | None,
        typer.Option(help="Cluster YAML declaring the device types that are not in the catalog."),
    ] = None,
) -> None:
    """Fit the analytic efficiency curve of each measured device type (per layer kind and
    pass) and print the analytic-versus-measured error before and after."""
    from piebald.api import calibrate as calibrate_profiles

    spec = load_cluster(cluster) if cluster is not None else None
    for calibration in calibrate_profiles(profiles, cluster=spec):
        _print_calibration(calibration)


def _print_calibration(calibration: Calibration) -> None:
    console.print(_error_rows_table(calibration))
    for kind_curve in calibration.kind_curves:
        c = kind_curve.curve
        if kind_curve.layer is not None:  # a measured layer: its own fixed time
            console.print(
                f"    {kind_curve.model}'s {kind_curve.layer_kind}: fixed "
                f"{c.half_saturation_s * 1e6:.1f} us",
                highlight=False,
            )
            continue
        console.print(
            f"  {kind_curve.layer_kind} {kind_curve.pass_kind}: max_fraction "
            f"{c.max_fraction:.3g}, bandwidth_fraction {c.bandwidth_fraction:.3g}, "
            f"overlap {c.overlap:.2f}, typical fixed time {c.half_saturation_s * 1e6:.1f} us"
            + (
                f", embedding table passes {c.embedding_table_passes:.2f}"
                if c.embedding_table_passes
                else ""
            ),
            highlight=False,
        )


def _ms(seconds: float | None) -> str:
    """A measured time in the profile table ("-": not measured)."""
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"
