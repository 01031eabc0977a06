"""The precision policy across GPU generations: which dtype each rank computes in, and which
dtype a group's traffic travels in. The cost model prices these widths and the runtime
(``piebald.runtime.training.precision``) executes them, so both read them from here.

* **Compute**: each rank in its GPU's training dtype (``DeviceType.training_dtype``: bf16,
  else fp16 with one global loss scaler, else fp32). Master weights, optimizer state and
  the gradient accumulator are fp32 on every rank (``cost.memory.bytes_per_param``).
* **A data-parallel group's traffic** (gradient reduce-scatter or all-reduce, parameter
  all-gather): in the dtype its ranks compute in when they all agree, so a bf16 group
  moves 2 bytes per value; in fp32 when they differ (an A100 beside a V100), because no
  16-bit format holds both bf16's range and fp16's precision. Each rank casts its fp32
  accumulator down to the wire dtype and keeps the sum it receives in fp32.
* **Activations and their gradients between stages**: in the sender's compute dtype. A
  receiver computing in fp16 clamps finite activation values beyond fp16's range to its
  largest finite value and counts them (the step line reports it); gradients are not
  clamped: a loss-scaled gradient beyond fp16's range becomes inf, the global loss scaler
  sees the overflow, skips the step and backs off, which is its job.
"""

from __future__ import annotations

from collections.abc import Iterable

from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType, Dtype

__all__ = [
    "activation_message_bytes",
    "group_wire_dtype",
    "stage_wire_dtype",
    "wire_dtype_of_devices",
]


def group_wire_dtype(dtypes: Iterable[Dtype]) -> Dtype:
    """The dtype a group's collectives move: the ranks' common compute dtype, else fp32."""
    distinct = set(dtypes)
    if len(distinct) == 1:
        return distinct.pop()
    if not distinct:
        raise ValueError("group_wire_dtype: expected the compute dtype of at least one rank")
    return Dtype.FP32


def wire_dtype_of_devices(devices: Iterable[DeviceType], *, precision: Dtype) -> Dtype:
    """:func:`group_wire_dtype` of the ranks' training dtypes for a job of ``precision``."""
    return group_wire_dtype(device.training_dtype(precision) for device in devices)


def stage_wire_dtype(cluster: ClusterSpec, ranks: Iterable[int], *, precision: Dtype) -> Dtype:
    """:func:`wire_dtype_of_devices` of the GPUs of ``ranks`` (a stage's data-parallel group)."""
    return wire_dtype_of_devices((cluster.device_of(rank) for rank in ranks), precision=precision)


def activation_message_bytes(
    sender: DeviceType, *, precision: Dtype, micro_batch_size: int, seq_len: int, hidden_size: int
) -> int:
    """One micro-batch's activation (or its gradient) on the wire, in the sender's dtype."""
    dtype = sender.training_dtype(precision)
    return micro_batch_size * seq_len * hidden_size * dtype.num_bytes
