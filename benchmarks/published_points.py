"""Published training-throughput measurements (benchmarks/published.yaml) as piebald inputs.

Each point of the file is one measured run: N identical GPUs, a model, a global batch and
sequence length, how it was parallelised and the tokens/s per GPU it reached. This module
reads the points and builds what piebald plans from -- the cluster, the model, the job, and
the strategy and ZeRO mode closest to what was run -- so benchmarks/published.py can set
predicted beside measured, and tests/unit/test_published_points.py can check that every
point still builds (the file and the catalog drift apart silently otherwise).

The file's free-text fields (``nic``, ``parallelism``) are read with a few patterns; what
they do not state is filled with a documented assumption, returned as a note so the report
says it. A tensor-parallel point's ``tensor_layout`` (what its tensor groups split besides
the blocks, ``piebald.specs.tensor_layout``) is a field of its own, with its source in the
point's notes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import device_to_dict, parse_cluster, read_yaml
from piebald.specs.devices import DeviceType, builtin_catalog
from piebald.specs.fields import Fields
from piebald.specs.job import JobSpec
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.presets import PRESETS, load_model
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

__all__ = [
    "PUBLISHED_YAML",
    "PlanChoice",
    "PublishedPoint",
    "build_cluster",
    "build_job",
    "build_model",
    "catalog_gpu_name",
    "load_points",
    "nic_gbit_per_node",
    "plan_choice",
    "recompute_as_run",
    "tensor_layout_as_run",
    "tensor_parallel_degree",
]

PUBLISHED_YAML = Path(__file__).with_name("published.yaml")

# Names the file may use for a GPU that the catalog spells differently. The torchtitan H100
# runs used a 96 GB HBM2e, 500 W variant; the nearest catalog entry is the 80 GiB SXM part.
_GPU_ALIASES = {"H100": "H100-SXM", "H100-80GB": "H100-SXM", "A100": "A100-80GB"}

# Intra-node link per GPU, as the project's scenarios give it: the datasheet NVLink
# bandwidth per GPU (NVLink 4: 900 GB/s on H100 SXM; NVLink 3: 600 GB/s on A100 SXM).
# NVLink per GPU and direction (a ring sends and receives at once): NVIDIA's 900 and
# 600 GB/s are both directions together (H100 and A100 datasheets).
_NVLINK = {
    "H100-SXM": "450GB/s",
    "H100-SXM-96GB": "450GB/s",
    "A100-80GB": "300GB/s",
    "A100-40GB": "300GB/s",
}

# Where the source does not state the network: one 400 Gb/s NDR rail per H100 and one
# 200 Gb/s HDR rail per A100, the DGX H100 / DGX A100 reference designs (8 rails a node).
_ASSUMED_GBIT_PER_GPU = {"H100-SXM": 400, "H100-SXM-96GB": 400, "A100-80GB": 200, "A100-40GB": 200}

# Megatron's GPT models use 128-wide heads; the file gives no head count for some of them.
_ASSUMED_HEAD_DIM = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedPoint:
    """One measured run, as benchmarks/published.yaml records it."""

    point_id: str
    gpu_name: str  # as the source names it
    num_gpus: int
    gpus_per_node: int
    nic: str  # free text: "RDMA backend 400 Gb/s per GPU", "not stated", ...
    model: str  # a preset name, or free text when model_arch gives the shape
    model_arch: dict[str, Any] | None  # GPT-2-shaped models (MPT, Megatron GPT)
    seq_len: int
    global_batch: int
    parallelism: str  # free text: "FSDP2 64, selective op AC, eager", "FSDP 8 x TP 8", ...
    micro_batch: int | None  # sequences per GPU per micro-batch, when the source states it
    tensor_layout: TensorLayout | None  # what its tensor groups split, where it has them
    measured_tokens_per_s_per_gpu: float
    system: str  # free text: "torchtitan (Apr 2024)", "Megatron-Core r0.8.0", ...

    @property
    def framework(self) -> str:
        """The training framework that ran the point: ``system``'s first word (before a
        space or a slash), so a framework's releases and dates share it."""
        return re.split(r"[ /]", self.system.strip(), maxsplit=1)[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanChoice:
    """The strategy (and ZeRO mode every stage is held to) closest to what a point ran."""

    strategy: str
    zero: ZeroMode | None


def load_points(path: Path = PUBLISHED_YAML) -> tuple[PublishedPoint, ...]:
    """Every point of ``path``; a malformed field is a SpecError naming it."""
    top = Fields(read_yaml(path), source=str(path))
    points: list[PublishedPoint] = []
    for entry in top.sub_list("points", non_empty=True):
        gpus = entry.sub_list("gpus", non_empty=True)
        if len(gpus) != 1:
            raise entry.error("gpus", entry.raw("gpus"), "one GPU type (identical GPUs)")
        gpu = gpus[0]
        layout = (
            TensorLayout(entry.choice("tensor_layout", [value.value for value in TensorLayout]))
            if entry.has("tensor_layout")
            else None
        )
        point = PublishedPoint(
            point_id=entry.string("id"),
            gpu_name=gpu.string("type"),
            num_gpus=gpu.integer("count", minimum=1),
            gpus_per_node=gpu.integer("gpus_per_node", minimum=1),
            nic=entry.string("nic", default="not stated"),
            model=entry.string("model"),
            model_arch=dict(entry.sub("model_arch").data) if entry.has("model_arch") else None,
            seq_len=entry.integer("seq_len", minimum=1),
            global_batch=entry.integer("global_batch", minimum=1),
            parallelism=entry.string("parallelism"),
            micro_batch=(
                entry.integer("micro_batch", minimum=1)
                if entry.raw("micro_batch", default=None) is not None
                else None
            ),
            tensor_layout=layout,
            measured_tokens_per_s_per_gpu=entry.number(
                "tokens_per_s_per_gpu", strictly_positive=True
            ),
            system=entry.string("system"),
        )
        if layout is not None and tensor_parallel_degree(point) == 1:
            raise entry.error("tensor_layout", layout.value, "a point whose parallelism has TP")
        points.append(point)
    ids = [point.point_id for point in points]
    for point_id in ids:
        if ids.count(point_id) > 1:
            raise top.error("points", point_id, "ids used once each")
    return tuple(points)


def catalog_gpu_name(name: str) -> str | None:
    """The catalog's name for the GPU a source calls ``name``; None if it has none."""
    catalog = builtin_catalog()
    if name in catalog:
        return name
    alias = _GPU_ALIASES.get(name)
    return alias if alias in catalog else None


def nic_gbit_per_node(point: PublishedPoint) -> tuple[float, str | None]:
    """(the node's RDMA rate in Gb/s, a note when it is assumed rather than stated).

    piebald gives a node one NIC for all its GPUs (README "Cluster file"), so a per-GPU
    rate is multiplied by the GPUs of a node.
    """
    text = point.nic
    per_gpu = re.search(r"(\d+(?:\.\d+)?)\s*Gb/s per GPU", text)
    if per_gpu:
        return float(per_gpu.group(1)) * point.gpus_per_node, None
    rails = re.search(r"(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*Gb/s", text)
    if rails:
        return float(rails.group(1)) * float(rails.group(2)), None
    per_node = re.search(r"(\d+(?:\.\d+)?)\s*Gb/s", text)
    if per_node:
        return float(per_node.group(1)), None
    gpu = catalog_gpu_name(point.gpu_name) or point.gpu_name
    rate = _ASSUMED_GBIT_PER_GPU.get(gpu, 100) * point.gpus_per_node
    if point.num_gpus <= point.gpus_per_node:
        return rate, None  # one node: no traffic crosses the NIC, nothing to note
    return rate, f"NIC not stated ({text!r}); assumed {rate:g} Gb/s InfiniBand per node"


def build_cluster(
    point: PublishedPoint, *, device: DeviceType | None = None
) -> tuple[ClusterSpec, tuple[str, ...]]:
    """N identical GPUs, ``gpus_per_node`` a node, NVLink inside and InfiniBand between;
    with the assumptions made. A GPU the catalog lacks is a ValueError naming it.
    ``device``, when given, replaces the catalog's entry of the point's GPU (a fit tries
    other efficiencies so)."""
    gpu = catalog_gpu_name(point.gpu_name)
    if gpu is None:
        raise ValueError(f"GPU type {point.gpu_name!r} is not in piebald's catalog")
    if gpu not in _NVLINK:
        raise ValueError(f"no NVLink rate known for {gpu} (benchmarks/published_points.py)")
    if point.num_gpus % point.gpus_per_node:
        raise ValueError(f"{point.num_gpus} GPUs are not whole nodes of {point.gpus_per_node} GPUs")
    gbit, note = nic_gbit_per_node(point)
    group = {
        "name": "node",
        "gpu": gpu,
        "gpus_per_node": point.gpus_per_node,
        "count": point.num_gpus // point.gpus_per_node,
        "intra_link": _NVLINK[gpu],
        "nic": {"kind": "infiniband", "bandwidth": f"{gbit:g}Gb/s"},
    }
    spec: dict[str, Any] = {"name": point.point_id, "nodes": [group]}
    if device is not None:
        if device.name != gpu:
            raise ValueError(f"device {device.name!r} replaces {gpu!r}: expected the same name")
        spec["gpu_types"] = [device_to_dict(device)]
    cluster = parse_cluster(spec, source=f"published:{point.point_id}")
    return cluster, (() if note is None else (note,))


def build_model(point: PublishedPoint) -> tuple[ModelSpec, tuple[str, ...]]:
    """The point's model: a preset by name, or from ``model_arch`` a GPT-2-shaped model
    (GELU MLP, tied embeddings), as presets.py builds GPT-2; with the assumptions made.

    MPT has ALiBi and no biases where piebald's GPT-2 family has learned positions and
    biases: a few million parameters on billions, well under 1% of the FLOPs.
    """
    arch = point.model_arch
    if arch is None:
        return load_model(point.model), ()
    notes: list[str] = []
    fields = Fields(arch, source=str(PUBLISHED_YAML), path=f"{point.point_id}.model_arch")
    activation = fields.string("activation", default="gelu")
    if activation != "gelu":
        raise fields.error("activation", activation, "gelu (a GPT-2-shaped model)")
    hidden = fields.integer("hidden", minimum=1)
    if fields.has("heads"):
        heads = fields.integer("heads", minimum=1)
    else:
        heads = hidden // _ASSUMED_HEAD_DIM
        notes.append(f"heads not given; assumed {heads} ({_ASSUMED_HEAD_DIM}-wide)")
    ffn_raw = fields.raw("ffn", default=None)
    if isinstance(ffn_raw, int) and not isinstance(ffn_raw, bool):
        ffn = ffn_raw
    else:
        ffn = 4 * hidden  # "4h assumed (GELU GPT)" in the file, or absent
        notes.append(f"ffn {ffn_raw!r}; taken as 4h = {ffn}")
    model_arch = ModelArch(
        family=Family.GPT2,
        num_blocks=fields.integer("layers", minimum=1),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=ffn,
        vocab_size=fields.integer("vocab", minimum=1),
        # GPT-2's learned-position table is the one place the sequence length enters its
        # parameters; sized to the run's sequences (these models use ALiBi or none).
        max_seq_len=max(point.seq_len, PRESETS["gpt2"].max_seq_len),
        tie_embeddings=fields.boolean("tied_embeddings", default=True),
    )
    return ModelSpec(name=_model_name(point.model), arch=model_arch), tuple(notes)


def _model_name(text: str) -> str:
    """The model's own name from a field like 'MPT-7b -> piebald: llama-2-7b as ...'."""
    return re.split(r"\s*(?:->|\(|:)", text, maxsplit=1)[0].strip() or text


def build_job(point: PublishedPoint) -> JobSpec:
    """The point's global batch and sequence length, bf16 with AdamW."""
    return JobSpec(global_batch_size=point.global_batch, seq_len=point.seq_len)


def tensor_parallel_degree(point: PublishedPoint) -> int:
    """The TP degree ``parallelism`` names ("FSDP 8 x TP 8": 8); 1 when it names none
    ("no TP/PP" names no degree)."""
    match = re.search(r"\bTP\s*(\d+)", point.parallelism)
    return int(match.group(1)) if match else 1


def tensor_layout_as_run(point: PublishedPoint) -> tuple[TensorLayout, str | None]:
    """(the layout a tensor-parallel point's groups ran, a note when the file does not
    say it and piebald's own, ``sequence``, is assumed)."""
    if point.tensor_layout is not None:
        return point.tensor_layout, None
    return TensorLayout.SEQUENCE, "tensor layout not stated: priced as piebald's (sequence)"


def recompute_as_run(point: PublishedPoint) -> tuple[Recompute | None, str | None]:
    """(the recomputation the run used, a note when piebald cannot say it exactly); None
    when the source does not say.

    Selective checkpointing is torchtitan's per-op policy (attention outputs and every
    other matmul's kept), which is piebald's selective recompute (``specs.recompute``);
    torchtitan also keeps the outputs of its tensor groups' reduce-scatters, which
    piebald's runtime runs again."""
    text = point.parallelism
    if re.search(r"selective|SAC", text, flags=re.IGNORECASE):
        note = None
        if tensor_parallel_degree(point) > 1:
            note = "selective recompute: its reduce-scatters priced as run again (piebald's)"
        return Recompute.SELECTIVE, note
    if re.search(r"no recompute|-r 0|(checkpointing|recomputation) off", text, re.IGNORECASE):
        return Recompute.NONE, None
    if re.search(r"full AC|(checkpointing|recomputation)( on)?\b", text, flags=re.IGNORECASE):
        return Recompute.FULL, None
    return None, None


def plan_choice(point: PublishedPoint) -> PlanChoice:
    """zero-even for fully sharded or plain data-parallel runs (ZeRO-1 where the run used
    it, else full sharding for FSDP); otherwise piebald with its own choices."""
    text = point.parallelism
    if re.search(r"ZeRO-1|-z 1\b", text):
        return PlanChoice(strategy="zero-even", zero=ZeroMode.OPTIMIZER)
    if re.search(r"FSDP|FULL_SHARD|fully sharded", text, flags=re.IGNORECASE):
        return PlanChoice(strategy="zero-even", zero=ZeroMode.FULL)
    if re.search(r"data parallel", text, flags=re.IGNORECASE):
        return PlanChoice(strategy="zero-even", zero=ZeroMode.NONE)
    return PlanChoice(strategy="piebald", zero=None)
