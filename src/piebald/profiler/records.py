"""The measurements a ProfileDB file holds, typed, and their JSON form (version 1).

A compute profile is one (device type, layer signature, sequence length, dtype) with one
row per micro-batch size: forward, backward and backward-with-recompute times (median of
the repetitions after warm-up) and the memory the pass needed. A network profile is one
link or one collective: the median time per message size and the alpha-beta fit of it.
Both carry where and how they were measured (provenance), which the cost model ignores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from piebald.profiler.keys import ComputeKey, layer_signature, slug
from piebald.specs.devices import DeviceType, Dtype, builtin_catalog
from piebald.specs.fields import Fields
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.presets import model_from_dict, model_to_dict

__all__ = [
    "PROFILE_VERSION",
    "ComputeProfile",
    "DeviceInfo",
    "LayerTiming",
    "NetworkKey",
    "NetworkKind",
    "NetworkProfile",
    "Provenance",
    "compute_from_dict",
    "network_from_dict",
    "profile_to_dict",
]

PROFILE_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    host: str
    created: str  # ISO 8601, UTC
    torch_version: str
    timer: str  # "cuda-events", "thread_time" (CPU time, one thread) or "perf_counter"
    num_warmup: int
    num_repeats: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    """The device as it was found: its catalog name, or its reported name and measured
    numbers when the catalog does not know it (a CPU, a new GPU)."""

    name: str  # the device type the key uses (a catalog name when known)
    reported_name: str  # what the driver calls it
    in_catalog: bool
    memory_bytes: float
    matmul_flops: float | None = None  # measured large-GEMM rate, in the profiled dtype
    copy_bytes_per_s: float | None = None  # measured large-copy rate (read + write)

    def measured_device_type(self, dtype: Dtype) -> DeviceType | None:
        """A device type of the measured rates, its peak in ``dtype`` (the profiled one)
        the measured GEMM rate; None where the rates were not measured (a catalog GPU)."""
        if not (self.matmul_flops and self.copy_bytes_per_s):
            return None
        return DeviceType(
            name=self.name,
            memory_bytes=self.memory_bytes,
            bf16_flops=self.matmul_flops if dtype is Dtype.BF16 else 0.0,
            fp16_flops=self.matmul_flops if dtype is Dtype.FP16 else 0.0,
            fp32_flops=self.matmul_flops,
            memory_bandwidth_bytes_per_s=self.copy_bytes_per_s,
        )

    def device_type(self, dtype: Dtype) -> DeviceType:
        """The catalog entry of a known device, else :meth:`measured_device_type`."""
        if self.in_catalog:
            return builtin_catalog()[self.name]
        measured = self.measured_device_type(dtype)
        if measured is None:
            raise ValueError(f"device {self.name!r}: not in the catalog and no rates measured")
        return measured


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTiming:
    micro_batch_size: int
    forward_s: float
    backward_s: float
    backward_recompute_s: float | None  # blocks only: the forward again, then the backward
    activation_bytes: float  # bytes saved for the backward pass (saved-tensor hooks)
    activation_recompute_bytes: float | None
    peak_memory_bytes: float  # CUDA: allocator peak of forward + backward; CPU: see measure
    # Blocks under selective recompute (``runtime.models.selective_recompute``); None in
    # profiles measured before piebald timed it.
    backward_selective_s: float | None = None
    activation_selective_bytes: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeProfile:
    key: ComputeKey
    layer_kind: LayerKind
    model: ModelSpec  # the model it was measured on (its layer of ``layer_kind`` was timed)
    device_info: DeviceInfo
    timings: tuple[LayerTiming, ...]  # ascending micro-batch sizes, each once
    provenance: Provenance
    version: int = PROFILE_VERSION

    def __post_init__(self) -> None:
        sizes = [t.micro_batch_size for t in self.timings]
        assert sizes == sorted(set(sizes)) and sizes, f"micro-batch sizes {sizes}"


class NetworkKind(StrEnum):
    P2P = "p2p"
    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_GATHER = "all-gather"


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class NetworkKey:
    kind: NetworkKind
    scope: str  # "intra-node", "inter-node" (p2p), or "group" (collectives)
    groups: tuple[str, ...]  # p2p: the two ends' node groups; collectives: the members'
    num_ranks: int

    def file_stem(self) -> str:
        names = "+".join(slug(group) for group in self.groups)
        return f"network--{self.kind}--{self.scope}--{names}--n{self.num_ranks}"

    def describe(self) -> str:
        return f"{self.kind} {self.scope} {'/'.join(self.groups)} ({self.num_ranks} ranks)"


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkProfile:
    key: NetworkKey
    backend: str  # "nccl" or "gloo"
    message_bytes: tuple[float, ...]  # ascending
    time_s: tuple[float, ...]  # median per message size
    latency_s: float  # alpha of the least-squares fit t = alpha + bytes / bandwidth
    bandwidth_bytes_per_s: float
    provenance: Provenance
    version: int = PROFILE_VERSION


def _provenance_dict(p: Provenance) -> dict[str, Any]:
    return {
        "host": p.host,
        "created": p.created,
        "torch_version": p.torch_version,
        "timer": p.timer,
        "num_warmup": p.num_warmup,
        "num_repeats": p.num_repeats,
    }


def profile_to_dict(profile: ComputeProfile | NetworkProfile) -> dict[str, Any]:
    if isinstance(profile, NetworkProfile):
        key = profile.key
        return {
            "version": profile.version,
            "type": "network",
            "kind": key.kind.value,
            "scope": key.scope,
            "groups": list(key.groups),
            "num_ranks": key.num_ranks,
            "backend": profile.backend,
            "message_bytes": list(profile.message_bytes),
            "time_s": list(profile.time_s),
            "latency_s": profile.latency_s,
            "bandwidth_bytes_per_s": profile.bandwidth_bytes_per_s,
            "provenance": _provenance_dict(profile.provenance),
        }
    info = profile.device_info
    return {
        "version": profile.version,
        "type": "compute",
        "device": profile.key.device,
        "signature": profile.key.signature,
        "seq_len": profile.key.seq_len,
        "dtype": profile.key.dtype.value,
        "layer_kind": profile.layer_kind.value,
        "model": model_to_dict(profile.model),
        "device_info": {
            "name": info.name,
            "reported_name": info.reported_name,
            "in_catalog": info.in_catalog,
            "memory_bytes": info.memory_bytes,
            "matmul_flops": info.matmul_flops,
            "copy_bytes_per_s": info.copy_bytes_per_s,
        },
        "timings": [
            {
                "micro_batch_size": t.micro_batch_size,
                "forward_s": t.forward_s,
                "backward_s": t.backward_s,
                "backward_recompute_s": t.backward_recompute_s,
                "activation_bytes": t.activation_bytes,
                "activation_recompute_bytes": t.activation_recompute_bytes,
                "peak_memory_bytes": t.peak_memory_bytes,
                "backward_selective_s": t.backward_selective_s,
                "activation_selective_bytes": t.activation_selective_bytes,
            }
            for t in profile.timings
        ],
        "provenance": _provenance_dict(profile.provenance),
    }


def _provenance_from(fields: Fields) -> Provenance:
    fields.reject_unknown(
        ("host", "created", "torch_version", "timer", "num_warmup", "num_repeats")
    )
    return Provenance(
        host=fields.string("host"),
        created=fields.string("created"),
        torch_version=fields.string("torch_version"),
        timer=fields.string("timer"),
        num_warmup=fields.integer("num_warmup", minimum=0),
        num_repeats=fields.integer("num_repeats", minimum=1),
    )


def check_version(fields: Fields) -> None:
    version = fields.integer("version")
    if version != PROFILE_VERSION:
        raise fields.error(
            "version",
            version,
            f"profile format version {PROFILE_VERSION} (re-measure with this piebald: "
            "piebald profile compute / network)",
        )


def compute_from_dict(fields: Fields) -> ComputeProfile:
    """A compute profile from its JSON mapping; every problem is a SpecError."""
    fields.reject_unknown(
        (
            "version",
            "type",
            "device",
            "signature",
            "seq_len",
            "dtype",
            "layer_kind",
            "model",
            "device_info",
            "timings",
            "provenance",
        )
    )
    check_version(fields)
    info = fields.sub("device_info")
    info.reject_unknown(
        ("name", "reported_name", "in_catalog", "memory_bytes", "matmul_flops", "copy_bytes_per_s")
    )
    timings: list[LayerTiming] = []
    for entry in fields.sub_list("timings", non_empty=True):
        entry.reject_unknown(
            (
                "micro_batch_size",
                "forward_s",
                "backward_s",
                "backward_recompute_s",
                "activation_bytes",
                "activation_recompute_bytes",
                "peak_memory_bytes",
                "backward_selective_s",
                "activation_selective_bytes",
            )
        )
        timings.append(
            LayerTiming(
                micro_batch_size=entry.integer("micro_batch_size", minimum=1),
                forward_s=entry.number("forward_s", strictly_positive=True),
                backward_s=entry.number("backward_s", strictly_positive=True),
                backward_recompute_s=entry.optional_number("backward_recompute_s"),
                activation_bytes=entry.number("activation_bytes"),
                activation_recompute_bytes=entry.optional_number("activation_recompute_bytes"),
                peak_memory_bytes=entry.number("peak_memory_bytes"),
                backward_selective_s=entry.optional_number("backward_selective_s"),
                activation_selective_bytes=entry.optional_number("activation_selective_bytes"),
            )
        )
    sizes = [t.micro_batch_size for t in timings]
    if sizes != sorted(set(sizes)):
        raise fields.error("timings", sizes, "ascending micro-batch sizes, each once")
    key = ComputeKey(
        device=fields.string("device"),
        signature=fields.string("signature"),
        seq_len=fields.integer("seq_len", minimum=1),
        dtype=Dtype(fields.choice("dtype", [d.value for d in Dtype])),
    )
    if info.string("name") != key.device:
        raise info.error("name", info.string("name"), f"the profile's device {key.device!r}")
    layer_kind = LayerKind(fields.choice("layer_kind", [k.value for k in LayerKind]))
    model = model_from_dict(fields.raw("model"), source=fields.source)
    signature = layer_signature(model.arch, layer_kind)
    if signature != key.signature:
        raise fields.error(
            "signature",
            key.signature,
            f"{signature!r}, the signature of the {layer_kind} of the recorded model "
            "(the file mixes two layers; re-measure)",
        )
    return ComputeProfile(
        key=key,
        layer_kind=layer_kind,
        model=model,
        device_info=DeviceInfo(
            name=key.device,
            reported_name=info.string("reported_name"),
            in_catalog=info.boolean("in_catalog"),
            memory_bytes=info.number("memory_bytes", strictly_positive=True),
            matmul_flops=info.optional_number("matmul_flops"),
            copy_bytes_per_s=info.optional_number("copy_bytes_per_s"),
        ),
        timings=tuple(timings),
        provenance=_provenance_from(fields.sub("provenance")),
    )


def network_from_dict(fields: Fields) -> NetworkProfile:
    fields.reject_unknown(
        (
            "version",
            "type",
            "kind",
            "scope",
            "groups",
            "num_ranks",
            "backend",
            "message_bytes",
            "time_s",
            "latency_s",
            "bandwidth_bytes_per_s",
            "provenance",
        )
    )
    check_version(fields)
    groups = fields.items("groups", non_empty=True)
    if not all(isinstance(group, str) and group for group in groups):
        raise fields.error("groups", groups, "a list of node group names")
    sizes = fields.items("message_bytes", non_empty=True)
    times = fields.items("time_s", non_empty=True)
    numbers = [*sizes, *times]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in numbers):
        raise fields.error("message_bytes", sizes, "positive numbers, as many as time_s")
    if len(sizes) != len(times) or list(sizes) != sorted(sizes):
        raise fields.error("message_bytes", sizes, "ascending sizes, one per entry of time_s")
    kind = NetworkKind(fields.choice("kind", [k.value for k in NetworkKind]))
    scopes = ["intra-node", "inter-node"] if kind is NetworkKind.P2P else ["group"]
    key = NetworkKey(
        kind=kind,
        scope=fields.choice("scope", scopes),
        groups=tuple(groups),
        num_ranks=fields.integer("num_ranks", minimum=2),
    )
    if kind is NetworkKind.P2P and (len(key.groups) != 2 or key.num_ranks != 2):
        raise fields.error("groups", groups, "two node groups (one per end) and num_ranks 2")
    return NetworkProfile(
        key=key,
        backend=fields.string("backend"),
        message_bytes=tuple(float(v) for v in sizes),
        time_s=tuple(float(v) for v in times),
        latency_s=fields.number("latency_s"),
        bandwidth_bytes_per_s=fields.number("bandwidth_bytes_per_s", strictly_positive=True),
        provenance=_provenance_from(fields.sub("provenance")),
    )


def profile_type(data: Mapping[str, Any]) -> str | None:
    kind = data.get("type")
    return kind if isinstance(kind, str) else None
