"""What each spawned rank runs in test_sequence_parallel.py: a tensor-parallel block in
miniature through ``models.tensor_ops``, sequence parallel and not, against the same block
computed whole in one process (every rank recomputes the reference locally from the same
seeded tensors), and the activation bytes a split block keeps against the whole block's."""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any

import torch
import torch.distributed as dist
from memory_cases import small_gpt2
from torch import nn
from torch.nn import functional

from piebald.cost.pass_shape import PassShape
from piebald.cost.tensor_comm import ALL_REDUCES_PER_BLOCK_PASS, rerun_share
from piebald.runtime.distributed.sequence_chunks import own_chunk
from piebald.runtime.models import tensor_ops
from piebald.runtime.models.norms import RMSNorm
from piebald.runtime.models.stage_part import StagePart, build_stage_part
from piebald.runtime.models.tensor_ops import (
    TensorGroup,
    column_parallel_linears,
    enter_sequence_chunks,
    leave_sequence_chunks,
    row_parallel_linear,
    sequence_parallel_norm,
)
from piebald.runtime.models.tensor_parallel import split_stage_part
from piebald.runtime.training.memory_meter import MemoryMeter
from piebald.specs.devices import Dtype, builtin_catalog
from piebald.specs.model import ModelSpec
from piebald.specs.presets import PRESETS
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

B, S, H, F = 2, 8, 6, 8  # batch, sequence, hidden, inner width (split over the group)


def _whole_modules(norm_kind: str) -> tuple[nn.Module, nn.Linear, nn.Linear, nn.Linear]:
    """The norm, two column-parallel layers (gate, up) and a row-parallel one (down), with
    biases and a non-trivial norm weight, the same on every rank."""
    torch.manual_seed(0)
    norm: nn.Module = RMSNorm(H, eps=1e-5) if norm_kind == "rms" else nn.LayerNorm(H)
    gate, up, down = nn.Linear(H, F), nn.Linear(H, F), nn.Linear(F, H)
    with torch.no_grad():
        for param in norm.parameters():
            param.uniform_(0.5, 1.5)
    return norm, gate, up, down


def _block(
    x: torch.Tensor,
    modules: tuple[nn.Module, nn.Linear, nn.Linear, nn.Linear],
    group: TensorGroup | None,
) -> torch.Tensor:
    """x + down(silu(gate(norm x)) * up(norm x)), split over ``group``."""
    norm, gate, up, down = modules
    chunk = enter_sequence_chunks(x, group)
    normed = sequence_parallel_norm(norm, chunk, group)
    g, u = column_parallel_linears(normed, (gate, up), group)
    assert g.shape[1] == S, "the column-parallel layers see the whole sequence"
    out = chunk + row_parallel_linear(functional.silu(g) * u, down, group)
    return leave_sequence_chunks(out, group)


def _keep_slice(linear: nn.Linear, *, dim: int, rank: int, degree: int) -> None:
    """Keep rank's 1/degree of ``linear``'s weight along ``dim`` (and of a column bias)."""
    with torch.no_grad():
        linear.weight = nn.Parameter(linear.weight.chunk(degree, dim=dim)[rank].clone())
        if dim == 0 and linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias.chunk(degree)[rank].clone())


def sequence_parallel_block(rank: int, world_size: int) -> None:
    process_group = dist.new_group(list(range(world_size)))
    for sequence_parallel in (True, False):
        group = TensorGroup(process_group=process_group, sequence_parallel=sequence_parallel)
        _split_block_equals_the_whole(rank, world_size, group)

    # A sequence that does not cut into equal chunks is refused.
    try:
        own_chunk(torch.zeros(1, world_size + 1, H), process_group)
    except ValueError as error:
        assert "multiple of the degree" in str(error)
    else:
        raise AssertionError("an uneven sequence was cut")


def _split_block_equals_the_whole(rank: int, world_size: int, group: TensorGroup) -> None:
    generator = torch.Generator().manual_seed(1)
    x_whole = torch.randn(B, S, H, generator=generator)
    weight_of_output = torch.randn(B, S, H, generator=generator)
    for norm_kind in ("rms", "layer"):
        reference = _whole_modules(norm_kind)
        x_ref = x_whole.clone().requires_grad_()
        out_ref = _block(x_ref, reference, None)
        (out_ref * weight_of_output).sum().backward()

        mine = _whole_modules(norm_kind)
        _, gate, up, down = mine
        for linear in (gate, up):
            _keep_slice(linear, dim=0, rank=rank, degree=world_size)
        _keep_slice(down, dim=1, rank=rank, degree=world_size)
        x = x_whole.clone().requires_grad_()
        out = _block(x, mine, group)
        (out * weight_of_output).sum().backward()

        # Forward: the whole output on every rank.
        torch.testing.assert_close(out, out_ref)
        # Backward: the whole input gradient on every rank, the replicated weights' (norm,
        # row bias) summed over the group, the split weights' the reference's slices.
        assert x.grad is not None and x_ref.grad is not None
        torch.testing.assert_close(x.grad, x_ref.grad)
        for (name, param), (_, whole) in zip(
            mine[0].named_parameters(), reference[0].named_parameters(), strict=True
        ):
            torch.testing.assert_close(param.grad, whole.grad, msg=f"{norm_kind} norm {name}")
        torch.testing.assert_close(down.bias.grad, reference[3].bias.grad)
        for linear, whole_linear, dim in ((gate, reference[1], 0), (up, reference[2], 0)):
            assert linear.weight.grad is not None and whole_linear.weight.grad is not None
            expected = whole_linear.weight.grad.chunk(world_size, dim=dim)[rank]
            torch.testing.assert_close(linear.weight.grad, expected)
            assert linear.bias.grad is not None and whole_linear.bias.grad is not None
            torch.testing.assert_close(
                linear.bias.grad, whole_linear.bias.grad.chunk(world_size)[rank]
            )
        assert down.weight.grad is not None and reference[3].weight.grad is not None
        expected = reference[3].weight.grad.chunk(world_size, dim=1)[rank]
        torch.testing.assert_close(down.weight.grad, expected)

    # Without gradients (evaluation) the same forward.
    with torch.no_grad():
        reference = _whole_modules("rms")
        mine = _whole_modules("rms")
        for linear in mine[1:3]:
            assert isinstance(linear, nn.Linear)
            _keep_slice(linear, dim=0, rank=rank, degree=world_size)
        _keep_slice(mine[3], dim=1, rank=rank, degree=world_size)
        torch.testing.assert_close(_block(x_whole, mine, group), _block(x_whole, reference, None))


# --- activation memory ------------------------------------------------------------------------

S_MEMORY = 32  # positions: the rotary tables and the chunks as small as they can be


def _saved_bytes_per_row(part: StagePart, dtype: torch.dtype) -> int:
    """Bytes of the storages one block's forward saves for its backward (each once,
    parameters excluded), per row of the micro-batch: the difference between 2 rows and
    1, so that what does not grow with the batch (the rotary tables) drops out."""
    params = {p.untyped_storage().data_ptr() for p in part.parameters()}
    saved = []
    for rows in (1, 2):
        storages: dict[int, int] = {}

        def pack(tensor: torch.Tensor, storages: dict[int, int] = storages) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in params:
                storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        x = torch.randn(rows, S_MEMORY, part.model.arch.hidden_size).to(dtype).requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = part(x)
        del out
        saved.append(sum(storages.values()))
    return saved[1] - saved[0]


def _memory_models() -> dict[str, ModelSpec]:
    llama = dataclasses.replace(PRESETS["tiny"], max_seq_len=S_MEMORY)
    return {
        "llama": ModelSpec(name="tiny", arch=llama),
        "gpt2": small_gpt2(max_seq_len=S_MEMORY, name="g"),
    }


def _split_part(
    model: ModelSpec,
    *,
    rank: int,
    world_size: int,
    group: Any,
    layout: TensorLayout,
    dtype: torch.dtype = torch.float32,
) -> StagePart:
    part = build_stage_part(model, layer_start=1, layer_end=2, dtype=dtype)
    split_stage_part(
        part,
        degree=world_size,
        position=rank,
        positions=tuple(range(world_size)),
        group=group,
        layout=layout,
    )
    return part


def block_keeps_its_share(rank: int, world_size: int) -> None:
    """Every activation a split block keeps is 1/t of the whole block's: the norms' on
    the member's sequence chunk, the column-parallel layers' input as that chunk, the
    rest on its share of the heads and width; under recompute its input chunk."""
    group = dist.new_group(list(range(world_size)))
    for name, model in _memory_models().items():
        for dtype in (torch.float32, torch.bfloat16):
            for recompute in (Recompute.NONE, Recompute.FULL):
                whole = build_stage_part(model, layer_start=1, layer_end=2, dtype=dtype)
                split = _split_part(
                    model,
                    rank=rank,
                    world_size=world_size,
                    group=group,
                    layout=TensorLayout.SEQUENCE,
                    dtype=dtype,
                )
                whole.recompute = split.recompute = recompute
                mine, theirs = (
                    _saved_bytes_per_row(split, dtype),
                    _saved_bytes_per_row(whole, dtype),
                )
                assert mine * world_size == theirs, (name, dtype, recompute, mine, theirs)


# --- recompute on a tensor group --------------------------------------------------------------


class _CountedCollectives:
    """Counts the tensor group's collectives a block runs, patched where
    ``models.tensor_ops`` calls them: all-reduces, and the sequence's gathers and
    reduce-scatters (blocking or started)."""

    NAMES = (
        "gather_sequence",
        "reduce_scatter_sequence",
        "start_gather_sequence",
        "start_reduce_scatter_sequence",
    )

    def __init__(self) -> None:
        self.count = 0
        self._originals: dict[tuple[object, str], object] = {}

    def __enter__(self) -> _CountedCollectives:
        targets = [(tensor_ops, name) for name in self.NAMES] + [(tensor_ops.dist, "all_reduce")]
        for module, name in targets:
            original = getattr(module, name)
            self._originals[(module, name)] = original

            def counted(*args: object, _original: Any = original, **kwargs: object) -> Any:
                self.count += 1
                return _original(*args, **kwargs)

            setattr(module, name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        for (module, name), original in self._originals.items():
            setattr(module, name, original)


def _backward_collectives(part: StagePart, recompute: Recompute) -> int:
    part.recompute = recompute
    x = torch.randn(2, S_MEMORY, part.model.arch.hidden_size).requires_grad_()
    out = part(x)
    with _CountedCollectives() as counted:
        out.backward(torch.ones_like(out))
    return counted.count


def _settle() -> None:
    """Let go of what is already dead: gloo's background work holds a collective's tensors
    a little after the call returns (seen as up to two [s, h] tensors more or fewer in the
    window), and cycles wait for the collector."""
    dist.barrier()
    gc.collect()
    time.sleep(0.05)


def _kept_per_row(part: StagePart, dtype: torch.dtype) -> int:
    """Bytes of live tensors one block's forward leaves for its backward per row of the
    micro-batch (2 rows less 1), its input and output aside, by the memory meter."""
    kept = []
    for rows in (1, 2):
        x = torch.randn(rows, S_MEMORY, part.model.arch.hidden_size).to(dtype).requires_grad_()
        rope = part.rope(x)
        meter = MemoryMeter(torch.device("cpu"))
        _settle()
        with meter:
            meter.track([x, *part.parameters(), *(rope or ())])
            before = meter.live_bytes()
            out = part(x)
            _settle()
            kept.append(meter.live_bytes() - before - out.numel() * out.element_size())
            out.backward(torch.ones_like(out))
    return kept[1] - kept[0]


def recomputed_block_on_a_tensor_group(rank: int, world_size: int) -> None:
    """Under full and selective recompute a split block's backward runs again all but the
    last of its forward's collectives (``cost.tensor_comm.rerun_share``), and under
    selective it keeps what ``ModelSpec.layers_at`` says a member keeps."""
    group = dist.new_group(list(range(world_size)))
    for name, model in _memory_models().items():
        for layout in (TensorLayout.BLOCKS, TensorLayout.SEQUENCE):
            per_pass = ALL_REDUCES_PER_BLOCK_PASS * (2 if layout.splits_sequence else 1)
            part = _split_part(model, rank=rank, world_size=world_size, group=group, layout=layout)
            plain = _backward_collectives(part, Recompute.NONE)
            for recompute in (Recompute.SELECTIVE, Recompute.FULL):
                shape = PassShape(
                    device=builtin_catalog()["H100-SXM"],
                    dtype=Dtype.FP32,
                    micro_batch_size=1,
                    seq_len=S_MEMORY,
                    recompute=recompute,
                    tensor_parallel_degree=world_size,
                    tensor_layout=layout,
                )
                again = _backward_collectives(part, recompute) - plain
                assert again == rerun_share(shape) * per_pass, (name, layout, recompute, again)
            for dtype in (torch.float32, torch.bfloat16):
                part = _split_part(
                    model, rank=rank, world_size=world_size, group=group, layout=layout, dtype=dtype
                )
                part.recompute = Recompute.SELECTIVE
                dtype_bytes = torch.finfo(dtype).bits // 8
                block = model.layers_at(world_size, layout)[1]
                per_token = block.activation_bytes_per_token(
                    dtype_bytes=dtype_bytes, recompute=Recompute.SELECTIVE
                )
                mine = _kept_per_row(part, dtype)
                # The block's input is the caller's, except sequence parallel: there the
                # part cuts the member's chunk from it, a tensor of its own.
                caller_input = 0 if layout.splits_sequence else model.arch.hidden_size
                expected = S_MEMORY * (per_token - caller_input * dtype_bytes)
                assert mine == expected, (name, layout, dtype, mine, expected)
