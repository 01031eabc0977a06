"""Profile DBs (``piebald profile``): measure layer times, memory and links into one, merge
DBs, and calibrate the analytic curve against a DB's measurements.

Measuring imports torch, inside the functions; loading, merging and calibrating do not
(calibrating imports scipy when called).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from piebald.api.inputs import Progress
from piebald.cost.compute import DEFAULT_CURVE
from piebald.cost.profiled_curve import KindCurve
from piebald.errors import ArgumentError, SpecError
from piebald.profiler.db import ProfileDB, load_profile_db, merge_profile_dbs, write_profile
from piebald.profiler.records import ComputeProfile, NetworkProfile
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype, builtin_catalog
from piebald.specs.model import ModelSpec

if TYPE_CHECKING:
    from piebald.profiler.calibrate import ErrorRow

__all__ = [
    "Calibration",
    "ComputeProfile",
    "NetworkProfile",
    "ProfileDB",
    "calibrate",
    "load_profile_db",
    "merge_profile_dbs",
    "profile_compute",
    "profile_network",
    "write_profile",
]


def profile_compute(
    model: ModelSpec,
    *,
    seq_len: int,
    micro_batch_sizes: tuple[int, ...],
    dtype: Dtype | None = None,
    device: str | None = None,
    num_warmup: int = 2,
    num_repeats: int = 5,
    device_name: str | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
) -> tuple[ComputeProfile, ...]:
    """Time forward and backward (with and without recompute) of ``model``'s embedding,
    one block and head per micro-batch size on this machine, with peak memory, as
    ``piebald profile compute`` does (:func:`write_profile` records each in a DB).
    ``device``: cuda or cpu (default: cuda if there is one); ``dtype`` default: bf16 on a
    GPU, fp32 on a CPU; ``device_name``: record under this GPU type name instead of the
    detected one, never a catalog type this device is not; ``threads``: CPU threads torch
    may use. Imports torch.

    >>> tiny = load_model("tiny")  # doctest: +SKIP
    >>> profiles = profile_compute(tiny, seq_len=32, micro_batch_sizes=(1,))  # doctest: +SKIP
    """
    import torch

    from piebald.profiler.measure_compute import profile_compute as measure

    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if chosen not in ("cuda", "cpu") or (chosen == "cuda" and not torch.cuda.is_available()):
        raise ArgumentError(
            argument="device", value=chosen, expected="cpu, or cuda where there is one"
        )
    _check_device_name(device_name, on_cuda=chosen == "cuda")
    if threads is not None:
        torch.set_num_threads(threads)
    return measure(
        model,
        seq_len=seq_len,
        micro_batch_sizes=micro_batch_sizes,
        dtype=dtype or (Dtype.BF16 if chosen == "cuda" else Dtype.FP32),
        device=chosen,
        num_warmup=num_warmup,
        num_repeats=num_repeats,
        device_name=device_name,
        progress=progress,
    )


def _check_device_name(name: str | None, *, on_cuda: bool) -> None:
    """Refuse recording this machine's times under a catalog type it is not: plans would
    price every GPU of that type at this device's speed (a CPU as A100-80GB)."""
    if name is None or name not in builtin_catalog():
        return
    import torch

    from piebald.profiler.device_map import catalog_name

    if on_cuda:
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        found = catalog_name(properties.name, memory_bytes=float(properties.total_memory))
        if found is None or found == name:  # a GPU the name rules miss: the user knows
            return
        measured = f"this GPU is a {found} ({properties.name})"
    else:
        measured = "these are CPU timings"
    raise ArgumentError(
        argument="device_name",
        value=name,
        expected=f"a name of your own for the measured device (declared in the cluster "
        f"file's gpu_types), not the catalog type {name}: {measured}, and plans would "
        f"price every {name} at its speed",
    )


def profile_network(
    cluster: ClusterSpec,
    *,
    emulate: bool = False,
    message_bytes: tuple[int, ...],
    num_warmup: int = 1,
    num_repeats: int = 3,
) -> list[NetworkProfile]:
    """Point-to-point links between and inside ``cluster``'s node groups and collectives
    over nodes, node groups and the cluster, each fitted as latency + size / bandwidth
    (``piebald profile network``): under torchrun, one process per GPU (rank 0 returns the
    profiles, the others an empty list), or with ``emulate`` gloo processes on this
    machine's loopback. Imports torch."""
    from piebald.profiler.measure_network import emulate_network, torchrun_network

    measure = emulate_network if emulate else torchrun_network
    return measure(
        cluster, message_bytes=message_bytes, num_warmup=num_warmup, num_repeats=num_repeats
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """The analytic curve fitted to one measured device type and dtype (:func:`calibrate`):
    ``before`` and ``after``, the analytic-versus-measured error per (layer kind, pass) of
    the built-in and the fitted curve; ``kind_curves``, the fitted curves."""

    device: str
    dtype: Dtype
    before: tuple[ErrorRow, ...]
    after: tuple[ErrorRow, ...]
    kind_curves: tuple[KindCurve, ...]


def calibrate(
    profiles: str | Path | ProfileDB, *, cluster: ClusterSpec | None = None
) -> tuple[Calibration, ...]:
    """Fit the analytic efficiency curve of each device type the DB ``profiles`` measured,
    per layer kind and pass (``piebald profile calibrate``). A type not in the catalog is
    looked up in ``cluster``'s gpu_types, else taken as the DB recorded it."""
    from piebald.profiler.calibrate import (
        calibrate_device,
        calibrated_curve,
        error_table,
        observations_of,
    )

    db = profiles if isinstance(profiles, ProfileDB) else load_profile_db(profiles)
    groups: dict[tuple[str, Dtype], list[ComputeProfile]] = {}
    for key in db.compute_runs:
        profile = db.compute(key)
        assert profile is not None
        groups.setdefault((key.device, key.dtype), []).append(profile)
    if not groups:
        where = db.root if isinstance(profiles, ProfileDB) else str(profiles)
        raise SpecError(
            source=str(where), field="", has_value=False, expected="compute profiles to fit"
        )
    calibrations = []
    for (name, dtype), chosen in sorted(groups.items()):
        measured = chosen[0].device_info.measured_device_type(dtype)
        device = _device_type(name, cluster, measured)
        observations = observations_of(chosen)
        kind_curves = calibrate_device(observations, device=device, dtype=dtype)
        calibrations.append(
            Calibration(
                device=name,
                dtype=dtype,
                before=tuple(
                    error_table(observations, device=device, dtype=dtype, curve=DEFAULT_CURVE)
                ),
                after=tuple(
                    error_table(
                        observations,
                        device=device,
                        dtype=dtype,
                        curve=calibrated_curve(kind_curves),
                    )
                ),
                kind_curves=kind_curves,
            )
        )
    return tuple(calibrations)


def _device_type(name: str, cluster: ClusterSpec | None, db_info: DeviceType | None) -> DeviceType:
    if cluster is not None:
        for group in cluster.node_groups:
            if group.device.name == name:
                return group.device
    catalog = builtin_catalog()
    if name in catalog:
        return catalog[name]
    if db_info is not None:
        return db_info
    raise ArgumentError(
        argument="cluster",
        value=name,
        expected=f"a cluster whose gpu_types declare {name!r} (it is not in the catalog)",
    )
