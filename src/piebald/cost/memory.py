"""Memory of one rank: weights, gradients, optimizer state, activations, working buffers.

Bytes per parameter follow Megatron-LM's distributed-optimizer accounting (docs,
"Distributed Optimizer"): with 16-bit compute, 2 for weights, 4 for the fp32 gradient
accumulator, 12 for AdamW's fp32 master copy, m and v (4 for SGD's master copy); with fp32
compute, 4 + 4 + 8 (m, v; the weights are the master). ZeRO (Rajbhandari et al. 2020)
divides a state by the rank's shard fraction once it is sharded. Activations are the
model's per-token bytes (Korthikanti et al. 2022, see ``piebald.specs.model``) times the
tokens of every micro-batch the schedule keeps in flight.

Measured activations. With ``--profiles`` the curve passed here
(``piebald.cost.profiled_curve.ProfiledCurve``, the one that prices compute) holds what
``piebald profile compute`` measured per (device type, layer, dtype, sequence length,
micro-batch size): ``activation_bytes``, the storages a layer's forward saves for its
backward (saved-tensor hooks, each storage once, parameters excluded), and for blocks
``activation_recompute_bytes`` and ``activation_selective_bytes``, what a fully and a
selectively recomputed block keep (profiles from before the latter was measured leave it
to the formula). That is this
model's activation term for one layer and one micro-batch, in the dtype the device trains
in, so where measured it replaces ``tokens x per-token bytes x dtype scale`` of that layer
(interpolated between measured micro-batch sizes, extrapolated linearly beyond); a block's
measured ``activation_bytes`` also replaces the recompute working buffer (one block's full
activations while it is recomputed). Layers add up as the per-token bytes do: a layer's
input is saved by that layer only, once. The profile's ``peak_memory_bytes`` is not used:
on a GPU it is the allocator's peak over one layer alone -- its weights and gradients, its
input, output and their gradients, and transient backward buffers, which do not add up
across layers or micro-batches -- and on a CPU it is weights + gradients +
``activation_bytes``, nothing more. Weights, gradients, optimizer state, the other working
buffers and the reserve stay analytic.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from piebald.cost import elementwise
from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.data_parallel import data_parallel_shares
from piebald.cost.pass_shape import PassShape
from piebald.cost.precision import stage_wire_dtype
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import Optimizer
from piebald.specs.model import Family, LayerKind, LayerSpec, ModelSpec, kept_bytes
from piebald.specs.plan import Plan, ZeroMode
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

__all__ = [
    "RECEIVES_POSTED",
    "STEP_CHUNK_ELEMENTS",
    "MemoryBreakdown",
    "adamw_temporary_elements",
    "framework_reserve_bytes",
    "layer_activation_bytes",
    "plan_rank_memory",
    "prefix_sums",
    "rank_memory",
    "stage_memory_bytes",
    "stage_params_matrix",
]

GIB = 2.0**30
# Receives a rank keeps posted from each neighbouring stage (``schedule.build``),
# each holding a buffer. Two, not one: a receive is a rendezvous, so a transfer waits for
# it, and where a hop outlasts a pass (eight ranks to a 10 GbE NIC) one pass of notice
# leaves the next input late (benchmarks/simulate_scenarios.py, flashflex).
RECEIVES_POSTED = 2
# The once-per-step reduce-scatter and all-gather of a stage bucket (ZeRO none/optimizer)
# move at most one layer, and at most this many elements, at a time, so their wire buffers
# stay small whatever the stage holds (DDP's gradient buckets serve the same end).
STEP_CHUNK_ELEMENTS = 2**24


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    # During the passes: gathered parameters, per-layer gradient buffers, the block being
    # recomputed, point-to-point buffers.
    pass_working_bytes: float
    # At the step's end, after the passes: the step's reduce-scatter buffers and the
    # optimizer's temporaries (beside no activations, so only the larger of the two counts).
    step_end_bytes: float
    reserve_bytes: float  # CUDA context, allocator fragmentation

    @property
    def working_bytes(self) -> float:
        """The working buffers at the peak: the passes' or the step end's, whichever is
        larger (kept independent of the activations, so memory stays affine in the
        micro-batches in flight, which the planner relies on)."""
        return max(self.pass_working_bytes, self.step_end_bytes)

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.working_bytes
            + self.reserve_bytes
        )

    @property
    def peak_bytes(self) -> float:
        """The peak itself: the training state beside the passes (activations and their
        working buffers) or beside the step end, whichever holds more (at the step's end
        no activations are left). ``total_bytes`` adds the activations to the larger of
        the two buffers instead: an upper bound that stays affine in the micro-batches in
        flight, which the planner, the simulator and the plan's memory figure use."""
        passes = self.activations_bytes + self.pass_working_bytes
        return self.state_bytes + max(passes, self.step_end_bytes) + self.reserve_bytes

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes


def framework_reserve_bytes(device: DeviceType) -> float:
    """What the framework keeps beyond tensors: ~1 GiB of CUDA context and workspaces, plus
    ~5% of capacity lost to allocator fragmentation."""
    return 1.0 * GIB + 0.05 * device.memory_bytes


def bytes_per_param(
    *, dtype: Dtype, optimizer: Optimizer, zero: ZeroMode = ZeroMode.NONE
) -> tuple[float, float, float]:
    """(weights, gradient accumulator, optimizer state) bytes per parameter a rank keeps
    between passes. Where the weights are sharded at rest (ZeRO-3) with 16-bit compute, no
    weights are kept: the fp32 master shard (optimizer state) is the only copy, and each
    layer's 16-bit weights exist only while gathered for a pass (a working buffer)."""
    if dtype is Dtype.FP32:
        return 4.0, 4.0, 8.0 if optimizer is Optimizer.ADAMW else 0.0
    weights = 0.0 if zero.shards_weights else 2.0
    return weights, 4.0, 12.0 if optimizer is Optimizer.ADAMW else 4.0


# A rank's share of the tied weight's optimizer state, per unit of its shard fraction: the
# tied group (first and last stage) splits it half and half (runtime group_layout).
TIED_SHARE = 0.5


def _tied_bytes_per_param(dtype: Dtype, optimizer: Optimizer) -> tuple[float, float, float]:
    """The tied weight's buffer is ZeRO-1 whatever its stages' modes: weights and gradient
    accumulator whole, optimizer state sharded."""
    return bytes_per_param(dtype=dtype, optimizer=optimizer, zero=ZeroMode.OPTIMIZER)


def adamw_temporary_elements(*, stepped_numel: Any, chunk_numel: Any) -> Any:
    """The most fp32 elements torch's single-tensor AdamW holds beyond its state while it
    steps ``stepped_numel`` elements in chunks of ``chunk_numel``
    (``runtime.distributed.optimizer``): a chunk's sqrt(v) and its quotient, beside the
    previous chunk's quotient, which the loop's local variable keeps until replaced."""
    first = elementwise.minimum(chunk_numel, stepped_numel)
    second = elementwise.clip(stepped_numel - chunk_numel, 0.0, chunk_numel)
    return elementwise.maximum(
        2.0 * first, elementwise.where(second > 0, first + 2.0 * second, 0.0)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _LayerRanges:
    """Per-model sums and maxima over every layer range [a, b), as (L+1) x (L+1) matrices
    indexed [a, b]: a range lookup is O(1), and the planner reads whole matrices."""

    num_layers: int
    params: npt.NDArray[np.float64]  # stored parameters, tied head replica included
    # Of those, the stage's own (not tied) that its tensor groups do not split
    # (``LayerSpec.num_whole_params``).
    whole_params: npt.NDArray[np.float64]
    largest_params: npt.NDArray[np.float64]  # the largest single layer (with tied weight)
    # Kept per token for the backward pass, without and with recompute: fp32/int64 bytes
    # and training-dtype values (``LayerSpec``).
    activation_fixed: npt.NDArray[np.float64]
    activation_values: npt.NDArray[np.float64]
    recompute_fixed: npt.NDArray[np.float64]
    recompute_values: npt.NDArray[np.float64]
    selective_fixed: npt.NDArray[np.float64]
    selective_values: npt.NDArray[np.float64]
    span: npt.NDArray[np.float64]  # layers in the range
    # The tied embedding/head weight where a range holds one of its two users but not both
    # (a multi-stage plan): the runtime keeps it in the tied group's own buffer
    # (``runtime.distributed.group_layout``), not in the stage's.
    tied_params: npt.NDArray[np.float64]
    has_embedding: npt.NDArray[np.bool_]
    has_block: npt.NDArray[np.bool_]
    has_head: npt.NDArray[np.bool_]
    block: LayerSpec | None
    hidden_size: int
    rope_bytes_per_position: float  # Llama's fp32 cos and sin tables (none in GPT-2)
    ffn_size: int
    vocab_size: int

    def kept_per_token(self, index: Any, *, dtype: Dtype, recompute: Recompute) -> Any:
        """Bytes per token a range keeps for its backward pass in ``dtype``."""
        if recompute is Recompute.FULL:
            fixed, values = self.recompute_fixed[index], self.recompute_values[index]
        elif recompute is Recompute.SELECTIVE:
            fixed, values = self.selective_fixed[index], self.selective_values[index]
        else:
            fixed, values = self.activation_fixed[index], self.activation_values[index]
        return kept_bytes(fixed=fixed, values=values, dtype_bytes=dtype.num_bytes)


def prefix_sums(values: list[float]) -> npt.NDArray[np.float64]:
    """0 followed by the running sums of ``values``, in float64."""
    # In float64, never int64: parameter counts are Python ints, and np.cumsum of ints
    # wraps silently past 2^63 (a negative memory figure). specs.limits keeps every sum far
    # below that; floats keep it from wrapping even past them.
    return np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=np.float64))])


@functools.lru_cache(maxsize=64)
def _ranges(
    model: ModelSpec,
    tensor_parallel_degree: int = 1,
    layout: TensorLayout = TensorLayout.BLOCKS,
) -> _LayerRanges:
    """Sums over every range of ``model``'s layers as one rank of a tensor group of
    ``tensor_parallel_degree`` and ``layout`` holds them (``ModelSpec.layers_at``)."""
    layers = model.layers_at(tensor_parallel_degree, layout)
    size = len(layers) + 1
    start, end = np.arange(size)[:, None], np.arange(size)[None, :]
    block = next((layer for layer in layers if layer.kind is LayerKind.BLOCK), None)
    head = layers[-1]
    params = prefix_sums([x.num_params for x in layers])
    whole = prefix_sums([x.num_whole_params for x in layers])
    sums = {
        name: prefix_sums([getattr(x, name) for x in layers])
        for name in (
            "activation_fixed_bytes_per_token",
            "activation_values_per_token",
            "recompute_fixed_bytes_per_token",
            "recompute_values_per_token",
            "selective_fixed_bytes_per_token",
            "selective_values_per_token",
        )
    }
    last = len(layers)
    has_block = (start < last - 1) & (end > 1) & (block is not None)
    # A stage holding the tied head but not the embedding keeps a replica of the weight.
    tied = np.where((start > 0) & (end == last), float(head.num_tied_params), 0.0)
    # A stage holding the embedding but not the head keeps the tied weight in the tied
    # group's buffer (``tied_params``), not among the weights its tensor groups hold whole,
    # where the embedding counts it unless the vocabulary is split.
    embedding = layers[0]
    tied_in_whole = (
        float(head.num_tied_params) if embedding.num_whole_params == embedding.num_params else 0.0
    )
    whole_tied = np.where((start == 0) & (end < last), tied_in_whole, 0.0)
    largest = np.maximum(
        np.maximum(
            np.where(start == 0, float(layers[0].num_params), 0.0),
            np.where(has_block, float(block.num_params) if block else 0.0, 0.0),
        ),
        np.where(end == last, float(head.num_params + head.num_tied_params), 0.0),
    )

    def over_range(name: str) -> npt.NDArray[np.float64]:
        return sums[name][end] - sums[name][start]

    return _LayerRanges(
        num_layers=last,
        params=params[end] - params[start] + tied,
        whole_params=whole[end] - whole[start] - whole_tied,
        largest_params=largest,
        activation_fixed=over_range("activation_fixed_bytes_per_token"),
        activation_values=over_range("activation_values_per_token"),
        recompute_fixed=over_range("recompute_fixed_bytes_per_token"),
        recompute_values=over_range("recompute_values_per_token"),
        selective_fixed=over_range("selective_fixed_bytes_per_token"),
        selective_values=over_range("selective_values_per_token"),
        span=(end - start).astype(np.float64),
        tied_params=np.where(
            ((start == 0) & (end < last)) | ((start > 0) & (end == last)),
            float(head.num_tied_params),
            0.0,
        ),
        has_embedding=np.broadcast_to(start == 0, (size, size)),
        has_block=has_block,
        has_head=np.broadcast_to(end == last, (size, size)),
        block=block,
        hidden_size=model.arch.hidden_size,
        rope_bytes_per_position=(
            2 * 4.0 * model.arch.resolved_head_dim if model.arch.family is Family.LLAMA else 0.0
        ),
        ffn_size=model.arch.ffn_hidden_size // tensor_parallel_degree,
        vocab_size=layout.vocabulary_rows(  # a rank's logits
            vocab_size=model.arch.vocab_size, degree=tensor_parallel_degree
        ),
    )


def layer_activation_bytes(
    layer: LayerSpec, *, shape: PassShape, curve: EfficiencyCurve = DEFAULT_CURVE
) -> float:
    """Bytes one micro-batch of ``shape`` keeps through ``layer`` until its backward:
    measured where ``curve`` has it, else tokens x per-token bytes, scaled from 16-bit to
    the shape's dtype."""
    return _activation_bytes(layer, shape=shape, curve=curve)[0]


def _activation_bytes(
    layer: LayerSpec, *, shape: PassShape, curve: EfficiencyCurve
) -> tuple[float, bool]:
    """:func:`layer_activation_bytes` and whether it was measured."""
    measured = curve.measured_activation_bytes(layer, shape=shape)
    if measured is not None:
        return measured, True
    per_token = layer.activation_bytes_per_token(
        dtype_bytes=shape.dtype.num_bytes, recompute=shape.recompute
    )
    return shape.micro_batch_size * shape.seq_len * per_token, False


def _slice_activation_bytes(
    layer: LayerSpec, unsplit: LayerSpec, *, shape: PassShape, curve: EfficiencyCurve
) -> tuple[float, bool]:
    """:func:`_activation_bytes` of ``layer``, one rank's slice of ``unsplit`` at the
    shape's tensor-parallel degree: a profile measures whole layers, so a measured whole
    layer's bytes scale by the formula's slice over its whole (a tensor-parallel rank must
    not escape a measurement its layer's formula underestimates)."""
    if shape.tensor_parallel_degree == 1:
        return _activation_bytes(layer, shape=shape, curve=curve)
    whole_shape = replace(shape, tensor_parallel_degree=1, tensor_layout=TensorLayout.BLOCKS)
    measured, was_measured = _activation_bytes(unsplit, shape=whole_shape, curve=curve)
    if not was_measured:
        return _activation_bytes(layer, shape=shape, curve=curve)
    formula_whole = _activation_bytes(unsplit, shape=whole_shape, curve=DEFAULT_CURVE)[0]
    formula_slice = _activation_bytes(layer, shape=shape, curve=DEFAULT_CURVE)[0]
    return measured * (formula_slice / formula_whole if formula_whole > 0 else 1.0), True


@dataclass(frozen=True, slots=True, kw_only=True)
class _MeasuredActivations:
    """One micro-batch's activations where ``curve`` measured some of the model's layers."""

    kept: npt.NDArray[np.float64]  # bytes kept for layers [a, b), indexed [a, b]
    block_bytes: float  # one block's full activations (held while it is recomputed)


@functools.lru_cache(maxsize=256)
def _measured_activations(
    model: ModelSpec, *, shape: PassShape, curve: EfficiencyCurve
) -> _MeasuredActivations | None:
    """Per range, measured bytes for the measured layers and the formula's for the others;
    None where nothing of ``model`` was measured on the shape's device (the formula alone,
    exactly)."""
    per_layer: dict[tuple[object, ...], tuple[float, bool]] = {}
    kept: list[float] = []
    any_measured = False
    layers = shape.layers(model)
    for layer, unsplit in zip(layers, model.layers, strict=True):
        key = (
            layer.kind,
            layer.num_params,
            layer.activation_fixed_bytes_per_token,
            layer.activation_values_per_token,
        )
        if key not in per_layer:
            per_layer[key] = _slice_activation_bytes(layer, unsplit, shape=shape, curve=curve)
        value, measured_here = per_layer[key]
        kept.append(value)
        any_measured |= measured_here
    block_index = next((i for i, layer in enumerate(layers) if layer.kind is LayerKind.BLOCK), None)
    block_bytes = 0.0
    if block_index is not None:
        # Its full activations (held while it is recomputed): those without recompute.
        whole = replace(shape, recompute=Recompute.NONE)
        block_bytes, measured_block = _slice_activation_bytes(
            layers[block_index], model.layers[block_index], shape=whole, curve=curve
        )
        any_measured |= measured_block
    if not any_measured:
        return None
    prefix = prefix_sums(kept)
    matrix = prefix[None, :] - prefix[:, None]
    matrix.setflags(write=False)
    return _MeasuredActivations(kept=matrix, block_bytes=block_bytes)


def stage_params_matrix(
    model: ModelSpec,
    *,
    tensor_parallel_degree: int = 1,
    layout: TensorLayout = TensorLayout.BLOCKS,
) -> npt.NDArray[np.float64]:
    """Parameters a stage stores for every layer range, indexed [a, b] (tied replica
    included), per rank of a tensor group of ``tensor_parallel_degree`` and ``layout``."""
    return _ranges(model, tensor_parallel_degree, layout).params


def _sharded(zero: ZeroMode) -> tuple[bool, bool, bool]:
    """Which of (weights, gradients, optimizer state) a ZeRO mode shards, in the order of
    :func:`bytes_per_param`."""
    return zero.shards_weights, zero.shards_gradients, zero.shards_optimizer


def _round_bytes(
    *, numel: Any, chunk: Any, group_size: int, largest_share: float, wire_bytes: int
) -> Any:
    """The most bytes one round of a bucket's step-end reduce-scatter holds
    (``FlatBucket._rounds``: round k moves the k-th chunk / group size elements of every
    owner's part): a wire buffer of the round where the fp32 accumulator cannot serve as
    one (a 16-bit wire, or more than one round), what the rank receives (as much as the
    round) and the sum of its part; a group of one exchanges nothing, so only the wire
    buffer remains where one is needed."""
    rounds_over_one = largest_share * numel > chunk / group_size
    packed = elementwise.where((wire_bytes != 4) | rounds_over_one, 1.0, 0.0)
    exchanged = 1.0 + 1.0 / group_size if group_size > 1 else 0.0
    return elementwise.where(numel > 0, (packed + exchanged) * chunk * wire_bytes, 0.0)


def _bucket_step_end_bytes(
    *, rounds_bytes: Any, stepped_numel: Any, chunk_numel: Any, adamw: bool
) -> Any:
    """One bucket at the step's end: its reduce-scatter rounds, then (not beside them)
    AdamW's fp32 temporaries over what the rank steps of it."""
    if not adamw:
        return rounds_bytes
    temporaries = adamw_temporary_elements(stepped_numel=stepped_numel, chunk_numel=chunk_numel)
    return elementwise.maximum(rounds_bytes, 4.0 * temporaries)


def _activations_and_working(
    r: _LayerRanges,
    index: Any,
    *,
    measured: _MeasuredActivations | None,
    shape: PassShape,
    zero: ZeroMode,
    num_in_flight: Any,
    num_neighbor_stages: int,
    wire: Dtype,
    adamw: bool,
    shard_fraction: Any,
    group_shares: Sequence[float] | None,
    receive_share: float | None,
    tied_group: tuple[int, int, float] | None,
    replica: bool = False,
) -> tuple[Any, Any, Any]:
    """(activations, working buffers during the passes, buffers at the step's end);
    ``shard_fraction``: the rank's (1.0 gives the largest buffers, which is how the
    planner's matrices bound every fraction); ``replica``: as :func:`rank_memory` says."""
    dtype, seq_len, recompute = shape.dtype, shape.seq_len, shape.recompute
    tokens = float(shape.num_tokens)  # a float: products with it never wrap
    if measured is None:
        kept = r.kept_per_token(index, dtype=dtype, recompute=recompute)
        activations = num_in_flight * tokens * kept
        block = r.block
        block_bytes = (
            tokens * block.activation_bytes_per_token(dtype_bytes=dtype.num_bytes) if block else 0.0
        )
    else:  # the profile's bytes per micro-batch, already in the device's dtype
        activations = num_in_flight * measured.kept[index]
        block_bytes = measured.block_bytes
    if zero.per_pass and dtype is not Dtype.FP32:
        # Layer-by-layer passes (runtime LayerStream) keep each layer's 16-bit output for
        # its backward, which in one graph only its fp32 copy in the next norm outlives.
        activations = activations + num_in_flight * tokens * (r.span[index] - 1) * (
            r.hidden_size * dtype.num_bytes
        )
    # Kept per micro-batch in flight beyond what its layers keep: the stage's input on
    # every stage but the first (the received buffer, a leaf whose gradient is sent back
    # after the backward) and its output on every stage but the last (the root of its
    # backward, and the payload of its send); under recompute, the fp32 RoPE tables
    # ([s, head_dim] each) the checkpointed blocks keep as inputs (without recompute each
    # block keeps its own cast, counted in its bytes per token).
    boundary = tokens * r.hidden_size * dtype.num_bytes
    ends = elementwise.where(r.has_embedding[index], 0.0, boundary)
    ends = ends + elementwise.where(r.has_head[index], 0.0, boundary)
    rope = elementwise.where(r.has_block[index], seq_len * r.rope_bytes_per_position, 0.0)
    activations = activations + num_in_flight * (ends + (rope if recompute.checkpoints else 0.0))
    # The group's reduce-scatter buffers (``runtime.distributed.collectives``): the wire
    # buffer, what the rank receives (every rank's copy of its part) and the sum of its
    # part; nothing is exchanged in a group of one. Unknown group (the planner's
    # matrices): an even pair, which bounds every even group. Per layer during the passes
    # (ZeRO-2/3), in units of the layer: with ``receive_share`` s, group size x s
    # received and s summed (gloo: the rank's own share; NCCL pads every part to the
    # largest); without, even shares, which is how plans are priced so far (the planner
    # would have to know the shares it is choosing). At the step's end in rounds of one
    # chunk, each owner's part of a round even.
    shares = (0.5, 0.5) if group_shares is None else tuple(group_shares)
    size = len(shares)
    received = 1.0 / size if receive_share is None else receive_share
    pass_reduce = 1.0 + (size + 1) * received if size > 1 else 1.0
    largest = r.largest_params[index]
    chunk = elementwise.minimum(largest, STEP_CHUNK_ELEMENTS)
    # At the step's end, after the passes (so beside no activations and no pass buffers),
    # bucket after bucket: the reduce-scatter of the stage's bucket, round by round, then
    # AdamW's fp32 temporaries (:func:`adamw_temporary_elements`) over what the rank
    # steps: its part of the stage (sharded optimizer state) or all of it, one bucket per
    # layer under ZeRO-2/3.
    optimizer_share = shard_fraction if zero.shards_optimizer else 1.0
    own = r.params[index] - r.tied_params[index]
    # A replica steps none of the weights its group holds whole where the state is sharded.
    stepped_own = own - r.whole_params[index] if replica and zero.shards_optimizer else own
    rounds = 0.0 * largest
    if not zero.per_pass:  # streamed layer buckets reduce in the passes
        rounds = _round_bytes(
            numel=own,
            chunk=chunk,
            group_size=size,
            largest_share=max(shares),
            wire_bytes=wire.num_bytes,
        )
    stage_end = _bucket_step_end_bytes(
        rounds_bytes=rounds,
        stepped_numel=(largest if zero.per_pass else stepped_own) * optimizer_share,
        chunk_numel=chunk,
        adamw=adamw,
    )
    # The tied weight's own bucket (a multi-stage plan): its group's rounds in its own
    # chunks (unknown group: an uneven pair on an fp32 wire, whose rounds hold the most),
    # then AdamW over a TIED_SHARE of it.
    tied = r.tied_params[index]
    tied_chunk = elementwise.minimum(tied, STEP_CHUNK_ELEMENTS)
    tied_size, tied_wire_bytes, tied_share = tied_group or (2, 4, 1.0)
    tied_end = _bucket_step_end_bytes(
        rounds_bytes=_round_bytes(
            numel=tied,
            chunk=tied_chunk,
            group_size=tied_size,
            largest_share=tied_share,
            wire_bytes=tied_wire_bytes,
        ),
        stepped_numel=tied * TIED_SHARE * (0.0 if replica else shard_fraction),
        chunk_numel=tied_chunk,
        adamw=adamw,
    )
    step_end = elementwise.maximum(stage_end, tied_end)
    # During the passes, the largest of two moments (not their sum: they do not coexist).
    # Computing a layer: under ZeRO-3 it and the next layer gathered (in the compute dtype;
    # a group whose wire is wider gathers through one wire buffer), and the backward's
    # largest transient: on the stage with the loss, the gradients of the fp32 log-softmax
    # and of the logits ([tokens, V] fp32 each) while every activation is alive; in a block,
    # its MLP's gradients (two [tokens, f] in the training dtype), beside the block's full
    # activations while it is recomputed, and sequence parallel the column-parallel
    # layers' input gathered whole again for their weight gradients ([tokens, h]: the
    # activations keep only the member's chunk of it, ``runtime.models.tensor_ops``).
    # Measured on a TP 2 block (width 256, 512 tokens, bf16, CPU meter): the sequence-
    # parallel backward peaks 0.8 (Llama) and 1.5 (GPT-2) [tokens, h] above the same
    # block's without sequence parallelism, 0.8 and 0.5 above the MLP term alone.
    # Reducing a layer's gradients (ZeRO-2/3), right after its backward: the
    # reduce-scatter buffers, while the next layer is gathered (ZeRO-3).
    gathered = 0.0 * largest
    if zero.gathers_per_pass:
        gathered = largest * dtype.num_bytes
        if wire.num_bytes != dtype.num_bytes:
            gathered = gathered + largest * wire.num_bytes
    loss_backward = elementwise.where(r.has_head[index], 8.0 * r.vocab_size * tokens, 0.0)
    mlp_backward = 2.0 * r.ffn_size * tokens * dtype.num_bytes
    if shape.tensor_parallel_degree > 1 and shape.tensor_layout.splits_sequence:
        mlp_backward += tokens * r.hidden_size * dtype.num_bytes  # the input gathered again
    # Selective recompute rebuilds all but the kept outputs: bounded by the whole block.
    recomputed = block_bytes if recompute.checkpoints else 0.0
    block_backward = elementwise.where(r.has_block[index], mlp_backward + recomputed, 0.0)
    computing = 2 * gathered + elementwise.maximum(loss_backward, block_backward)
    reducing = (
        gathered + pass_reduce * largest * wire.num_bytes
        if zero.reduces_per_pass
        else 0.0 * largest
    )
    working = elementwise.maximum(computing, reducing)
    # Point-to-point buffers of activations and their gradients (``schedule.build``):
    # per neighbouring stage, the receives posted from it, and on every stage but the
    # first a gradient on its way back (an activation sent on is the held output above).
    buffers = RECEIVES_POSTED * num_neighbor_stages + elementwise.where(
        r.has_embedding[index], 0.0, 1.0
    )
    working = working + buffers * tokens * r.hidden_size * dtype.num_bytes
    return activations, working, step_end


def stage_memory_bytes(
    model: ModelSpec,
    *,
    shape: PassShape,
    layers: tuple[int, int] | None,
    optimizer: Optimizer,
    zero: ZeroMode,
    num_in_flight: Any,
    num_neighbor_stages: int,
    wire_dtype: Dtype | None = None,
    curve: EfficiencyCurve = DEFAULT_CURVE,
) -> tuple[Any, Any]:
    """(bytes independent of the shard fraction, bytes per unit of shard fraction): a rank
    holding ``layers`` = [a, b) needs ``fixed + fraction * sharded``. With ``layers=None``
    both are (L+1) x (L+1) matrices over every range [a, b) (garbage where b <= a), which is
    how the planner prices every split at once; :func:`rank_memory` is the same formula,
    told more where it knows more: AdamW's step-end temporaries, which shrink with a shard
    smaller than two chunks (priced here at fraction 1, their most), and the stage's and
    the tied weight's groups (here an even pair, and the widest tied group), and a tensor
    group's members (here its leader, who holds the most: ``replica``).
    ``shape``: the rank's passes; ``wire_dtype``: the stage group's (``cost.precision``;
    default the shape's dtype). ``curve``: the measured activations, if any (see the module
    docstring)."""
    r = _ranges(model, shape.tensor_parallel_degree, shape.tensor_layout)
    dtype = shape.dtype
    index: Any = slice(None) if layers is None else layers
    tied = r.tied_params[index]
    params = r.params[index] - tied  # the stage's own buffers
    per_param = bytes_per_param(dtype=dtype, optimizer=optimizer, zero=zero)
    sharded_per_param = sum(b for b, s in zip(per_param, _sharded(zero), strict=True) if s)
    tied_weight_b, tied_grad_b, tied_optim_b = _tied_bytes_per_param(dtype, optimizer)
    activations, working, step_end = _activations_and_working(
        r,
        index,
        measured=_measured_activations(model, shape=shape, curve=curve),
        shape=shape,
        zero=zero,
        num_in_flight=num_in_flight,
        num_neighbor_stages=num_neighbor_stages,
        wire=wire_dtype or dtype,
        adamw=optimizer is Optimizer.ADAMW,
        shard_fraction=1.0,
        group_shares=None,
        receive_share=None,
        tied_group=None,
    )
    fixed = (
        params * (sum(per_param) - sharded_per_param)
        + tied * (tied_weight_b + tied_grad_b)
        + activations
        + elementwise.maximum(working, step_end)  # MemoryBreakdown.working_bytes
        + framework_reserve_bytes(shape.device)
    )
    return fixed, params * sharded_per_param + tied * tied_optim_b * TIED_SHARE


def rank_memory(
    model: ModelSpec,
    *,
    shape: PassShape,
    layer_start: int,
    layer_end: int,
    optimizer: Optimizer,
    zero: ZeroMode,
    shard_fraction: float,
    num_in_flight: int,
    num_neighbor_stages: int,
    wire_dtype: Dtype | None = None,
    group_shares: Sequence[float] | None = None,
    receive_share: float | None = None,
    tied_group: tuple[int, int, float] | None = None,
    replica: bool = False,
    curve: EfficiencyCurve = DEFAULT_CURVE,
) -> MemoryBreakdown:
    """Peak memory of a rank holding layers [layer_start, layer_end) of ``model`` and
    running passes of ``shape``, its activations measured where ``curve`` has measurements
    (see the module docstring); ``wire_dtype``: its stage group's (default the shape's
    dtype); ``group_shares``: the shard
    fractions of its stage's ranks (default: an even pair); ``receive_share``: the share
    of a layer the per-layer reduce-scatter receives from each rank (default: even
    shares); ``tied_group``: the tied weight's group (its size, wire bytes per element and
    largest share) where the rank holds a part of it (default: the most it takes).

    At tensor-parallel degree t (``shape``) the rank holds its slice of the layers
    (``ModelSpec.layers_at``), and ``shard_fraction`` and ``group_shares`` are its and
    its data-parallel group's shares of that slice (summing to 1 over the group).
    ``replica``: a member of a tensor group other than its leader, which owns the weights
    the group holds whole (``runtime.distributed.group_layout``): of those (and of the
    tied weight) the rank keeps no sharded state -- no optimizer state under ZeRO-1, no
    gradient shard under ZeRO-2, no weights at rest under ZeRO-3 -- while whatever a mode
    does not shard it holds whole, as the leader does."""
    r = _ranges(model, shape.tensor_parallel_degree, shape.tensor_layout)
    dtype = shape.dtype
    index = (layer_start, layer_end)
    tied = float(r.tied_params[index])
    params = float(r.params[index]) - tied  # the stage's own buffers
    whole = float(r.whole_params[index]) if replica else 0.0  # of those, owned elsewhere
    weight_b, grad_b, optim_b = bytes_per_param(dtype=dtype, optimizer=optimizer, zero=zero)
    tied_weight_b, tied_grad_b, tied_optim_b = _tied_bytes_per_param(dtype, optimizer)
    weight_f, grad_f, optim_f = (shard_fraction if sharded else 1.0 for sharded in _sharded(zero))
    # A replica's share of what it does not own: nothing where sharded, all where not.
    whole_weight_f, whole_grad_f, whole_optim_f = (
        0.0 if sharded else 1.0 for sharded in _sharded(zero)
    )
    tied_share = 0.0 if replica else shard_fraction
    activations, working, step_end = _activations_and_working(
        r,
        index,
        measured=_measured_activations(model, shape=shape, curve=curve),
        shape=shape,
        zero=zero,
        num_in_flight=num_in_flight,
        num_neighbor_stages=num_neighbor_stages,
        wire=wire_dtype or dtype,
        adamw=optimizer is Optimizer.ADAMW,
        shard_fraction=shard_fraction,
        group_shares=group_shares,
        receive_share=receive_share,
        tied_group=tied_group,
        replica=replica,
    )
    split = params - whole
    return MemoryBreakdown(
        weights_bytes=(split * weight_f + whole * whole_weight_f) * weight_b + tied * tied_weight_b,
        gradients_bytes=(split * grad_f + whole * whole_grad_f) * grad_b + tied * tied_grad_b,
        optimizer_bytes=(split * optim_f + whole * whole_optim_f) * optim_b
        + tied * tied_optim_b * TIED_SHARE * tied_share,
        activations_bytes=float(activations),
        pass_working_bytes=float(working),
        step_end_bytes=float(step_end),
        reserve_bytes=framework_reserve_bytes(shape.device),
    )


def plan_rank_memory(
    plan: Plan,
    *,
    stage_index: int,
    position: int,
    num_in_flight: int,
    curve: EfficiencyCurve = DEFAULT_CURVE,
    receive_share: float | None = None,
) -> MemoryBreakdown:
    """:func:`rank_memory` of the rank at ``position`` of stage ``stage_index`` of
    ``plan`` holding ``num_in_flight`` micro-batches: what the plan estimate, the
    simulator's prices and the planner's final check all price a plan's rank with."""
    stage = plan.stages[stage_index]
    rank = stage.ranks[position]
    # A rank of a tensor group shares its slice with its data-parallel group; the plan's
    # fractions are of the whole stage (t of them per group), so each is t times its share.
    t = stage.tensor_parallel_degree
    shares = data_parallel_shares(stage, rank)
    return rank_memory(
        plan.model,
        shape=PassShape.for_job(
            plan.job,
            device=plan.cluster.device_of(rank),
            micro_batch_size=stage.micro_batch_size[position],
            recompute=stage.recompute,
            tensor_parallel_degree=t,
            tensor_layout=stage.tensor_layout,
        ),
        layer_start=stage.layer_start,
        layer_end=stage.layer_end,
        optimizer=plan.job.optimizer,
        zero=stage.zero,
        shard_fraction=stage.shard_fraction[position] * t,
        num_in_flight=num_in_flight,
        num_neighbor_stages=(stage_index > 0) + (stage_index < plan.num_stages - 1),
        wire_dtype=stage_wire_dtype(plan.cluster, stage.ranks, precision=plan.job.precision),
        group_shares=shares,
        receive_share=receive_share,
        tied_group=_tied_group(plan),
        replica=rank not in stage.leaders,
        curve=curve,
    )


def _tied_group(plan: Plan) -> tuple[int, int, float] | None:
    """The tied embedding/head weight's group in a multi-stage plan: (ranks, wire bytes
    per element, largest share: half a first or last stage rank's fraction, as
    ``runtime.distributed.group_layout`` shards it); None where it has no group."""
    if plan.num_stages < 2 or not plan.model.arch.tie_embeddings:
        return None
    first, last = plan.stages[0], plan.stages[-1]
    ranks = (*first.ranks, *last.ranks)
    wire = stage_wire_dtype(plan.cluster, ranks, precision=plan.job.precision)
    return len(ranks), wire.num_bytes, 0.5 * max(*first.shard_fraction, *last.shard_fraction)
