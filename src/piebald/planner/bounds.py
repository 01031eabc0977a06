"""The physical upper bound a plan is judged against, and why nothing fits when nothing does.

Upper bound (docs/research/planners_survey.md section 10): the sum over GPUs of each GPU's best
standalone training throughput on the model's layers, T_i* = tokens of a micro-batch over
its forward plus backward time through every layer, at the best micro-batch size whose
activations for one layer fit the GPU. Training state is not charged (the cluster can shard
it away) and nothing is communicated, so no plan under the same cost model beats it:
``achievable_efficiency = tokens/s / bound``.
"""

from __future__ import annotations

from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.memory import bytes_per_param, framework_reserve_bytes, layer_activation_bytes
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.recompute import Recompute
from piebald.specs.units import format_bytes

__all__ = [
    "MICRO_BATCH_SIZES",
    "diagnose_infeasible",
    "gpu_upper_bound_tokens_per_s",
    "upper_bound_tokens_per_s",
]

MICRO_BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def gpu_upper_bound_tokens_per_s(
    device: DeviceType, *, model: ModelSpec, job: JobSpec, curve: EfficiencyCurve = DEFAULT_CURVE
) -> float:
    """T_i*: the best standalone throughput of one GPU of this type (0 if nothing fits)."""
    usable = device.memory_bytes - framework_reserve_bytes(device)
    best = 0.0
    for size in MICRO_BATCH_SIZES:
        if size > job.global_batch_size:
            break
        shape = PassShape.for_job(
            job, device=device, micro_batch_size=size, recompute=Recompute.NONE
        )
        largest_layer_bytes = max(  # measured where ``curve`` has it, as the planner's
            layer_activation_bytes(layer, shape=shape, curve=curve) for layer in model.layers
        )
        if largest_layer_bytes > usable:
            break
        times = pass_times(model, shape=shape, curve=curve)
        best = max(best, size * job.seq_len / times.pass_s(0, model.num_layers))
    return best


def upper_bound_tokens_per_s(
    cluster: ClusterSpec, *, model: ModelSpec, job: JobSpec, curve: EfficiencyCurve = DEFAULT_CURVE
) -> float:
    """Sum of T_i* over every GPU of the cluster."""
    per_type = {
        group.device: gpu_upper_bound_tokens_per_s(group.device, model=model, job=job, curve=curve)
        for group in cluster.node_groups
    }
    return sum(per_type[gpu.device] for gpu in cluster.gpus)


def diagnose_infeasible(cluster: ClusterSpec, *, model: ModelSpec, job: JobSpec) -> str:
    """One sentence on what does not fit and the smallest fix."""
    # The least a parameter holds anywhere: fully sharded (ZeRO-3), with no 16-bit copy.
    weights, grads, optimizer = bytes_per_param(
        dtype=job.precision, optimizer=job.optimizer, zero=ZeroMode.FULL
    )
    state = model.num_params * (weights + grads + optimizer)
    usable = sum(
        gpu.device.memory_bytes - framework_reserve_bytes(gpu.device) for gpu in cluster.gpus
    )
    if state > usable:
        biggest = max(
            (group.device for group in cluster.node_groups), key=lambda device: device.memory_bytes
        )
        per_gpu = biggest.memory_bytes - framework_reserve_bytes(biggest)
        missing = int(-(-(state - usable) // per_gpu))
        return (
            f"{model.name} needs {format_bytes(state)} of training state "
            f"({weights + grads + optimizer:g} bytes per parameter, fully sharded: gradients "
            f"and {job.optimizer.value} state with fp32 master weights); the cluster "
            f"{cluster.name} has "
            f"{format_bytes(usable)} usable; smallest fix: at least {missing} more "
            f"{biggest.name} GPUs, or a smaller model"
        )
    return (
        f"{model.name}'s training state ({format_bytes(state)}) fits the cluster's "
        f"{format_bytes(usable)} in aggregate, but no split of layers and activations of "
        f"{job.seq_len}-token sequences fits every GPU; smallest fix: a shorter --seq-len, "
        "or more memory on the smallest GPUs"
    )
