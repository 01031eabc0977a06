"""What each spawned rank runs in test_sequence_parallel.py: a tensor-parallel block in
miniature through ``models.tensor_ops``, sequence parallel and not, against the same block
computed whole in one process (every rank recomputes the reference locally from the same
seeded tensors), and the activation bytes a split block keeps against the whole block's."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from memory_cases import small_gpt2
from torch import nn
from torch.nn import functional

from piebald.runtime.distributed.sequence_chunks import own_chunk
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
from piebald.specs.model import ModelSpec
from piebald.specs.presets import PRESETS
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


def block_keeps_its_share(rank: int, world_size: int) -> None:
    """Every activation a split block keeps is 1/t of the whole block's: the norms' on
    the member's sequence chunk, the column-parallel layers' input as that chunk, the
    rest on its share of the heads and width; under recompute its input chunk."""
    group = dist.new_group(list(range(world_size)))
    for name, model in _memory_models().items():
        for dtype in (torch.float32, torch.bfloat16):
            for recompute in (False, True):
                whole = build_stage_part(model, layer_start=1, layer_end=2, dtype=dtype)
                split = build_stage_part(model, layer_start=1, layer_end=2, dtype=dtype)
                split_stage_part(
                    split,
                    degree=world_size,
                    position=rank,
                    positions=tuple(range(world_size)),
                    group=group,
                    layout=TensorLayout.SEQUENCE,
                )
                whole.recompute = split.recompute = recompute
                mine, theirs = (
                    _saved_bytes_per_row(split, dtype),
                    _saved_bytes_per_row(whole, dtype),
                )
                assert mine * world_size == theirs, (name, dtype, recompute, mine, theirs)
