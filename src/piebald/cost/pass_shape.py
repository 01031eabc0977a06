"""What one micro-batch's pass through a model's layers is priced by, besides the layers
and the pricing curve: the device, the dtype it computes in, the micro-batch's shape,
how much of their forward blocks recompute, and the tensor-parallel degree and layout its
layers are split by (the pass is one rank's share, ``ModelSpec.layers_at``).

Compute time (``cost.compute``, ``cost.pass_times``), activation memory
(``cost.memory``) and the profile's measurements (``cost.profiled_curve``) all take one
of these instead of the five values one by one. It is hashable (frozen, its hash
computed once), so the caches on the planner's hot path key on it directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import JobSpec
from piebald.specs.model import LayerSpec, ModelSpec
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

__all__ = ["PassShape"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PassShape:
    device: DeviceType
    dtype: Dtype  # what ``device`` computes in (``DeviceType.training_dtype``)
    micro_batch_size: int  # sequences
    seq_len: int  # tokens per sequence
    # How much of their forward blocks run again in the backward pass
    # (``specs.recompute``); a forward pass costs the same whatever it is.
    recompute: Recompute
    tensor_parallel_degree: int = 1
    # What else than the blocks' heads and MLP width the group splits (at degree > 1).
    tensor_layout: TensorLayout = TensorLayout.BLOCKS
    # Hashed once: the planner looks shapes up per rank, and a device type's hash walks
    # all its fields.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or self.seq_len < 1 or self.tensor_parallel_degree < 1:
            raise ValueError(
                f"pass of micro_batch_size = {self.micro_batch_size}, seq_len = "
                f"{self.seq_len}, tensor_parallel_degree = {self.tensor_parallel_degree}; "
                "expected all >= 1"
            )
        object.__setattr__(self, "_hash", hash(self._fields()))

    def _fields(self) -> tuple[DeviceType, Dtype, int, int, Recompute, int, TensorLayout]:
        return (
            self.device,
            self.dtype,
            self.micro_batch_size,
            self.seq_len,
            self.recompute,
            self.tensor_parallel_degree,
            self.tensor_layout,
        )

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its fields and rebuilt, never with its hash: string hashes differ
        # between processes.
        return _rebuild, self._fields()

    @classmethod
    def for_job(
        cls,
        job: JobSpec,
        *,
        device: DeviceType,
        micro_batch_size: int,
        recompute: Recompute,
        tensor_parallel_degree: int = 1,
        tensor_layout: TensorLayout = TensorLayout.BLOCKS,
    ) -> PassShape:
        """A pass of ``job``'s sequences on ``device``, in the dtype it trains ``job`` in."""
        return cls(
            device=device,
            dtype=device.training_dtype(job.precision),
            micro_batch_size=micro_batch_size,
            seq_len=job.seq_len,
            recompute=recompute,
            tensor_parallel_degree=tensor_parallel_degree,
            tensor_layout=tensor_layout,
        )

    def layers(self, model: ModelSpec) -> tuple[LayerSpec, ...]:
        """``model``'s layers as one rank of this shape's tensor group holds and runs them
        (``ModelSpec.layers_at``)."""
        return model.layers_at(self.tensor_parallel_degree, self.tensor_layout)

    @property
    def num_tokens(self) -> int:
        return self.micro_batch_size * self.seq_len


def _rebuild(
    device: DeviceType,
    dtype: Dtype,
    micro_batch_size: int,
    seq_len: int,
    recompute: Recompute,
    tensor_parallel_degree: int,
    tensor_layout: TensorLayout,
) -> PassShape:
    return PassShape(
        device=device,
        dtype=dtype,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        recompute=recompute,
        tensor_parallel_degree=tensor_parallel_degree,
        tensor_layout=tensor_layout,
    )
