"""specs/layer_ops.py against what the runtime's model code really dispatches.

A TorchDispatchMode sees every aten op a layer's forward runs: GEMMs (mm/addmm/bmm), the
fused attention kernel, views (no kernel, no traffic) and the rest -- the memory-bound
kernels. Summing each memory-bound op's input and output bytes and counting every op
that is not a view gives the oracle for the formulas' per-token traffic and kernels.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from piebald.runtime.models.loss import token_loss_sum
from piebald.runtime.models.rope import Rope, rope_tables
from piebald.runtime.models.stage_part import build_layer_module, build_stage_part
from piebald.specs.model import Family, ModelArch, build_model_spec
from piebald.specs.recompute import Recompute

_VIEWS = {
    "view", "_unsafe_view", "transpose", "t", "permute", "expand", "split", "slice",
    "select", "unsqueeze", "squeeze", "as_strided", "detach", "alias", "reshape",
    "split_with_sizes", "unbind", "arange",
}  # fmt: skip
_GEMMS = {"mm", "addmm", "bmm"}
_GATHERS = {"embedding": 1, "nll_loss_forward": 1}  # op: which argument holds the indices


def _bytes(value: object) -> int:
    tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


class _Counter(TorchDispatchMode):
    """Kernels and memory-bound bytes of everything run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.stream_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _VIEWS:
            return out
        self.kernels += 1
        if name in _GEMMS or "scaled_dot_product" in name:
            return out
        if name in _GATHERS:  # reads the rows it gathers, not the whole table
            self.stream_bytes += 2 * _bytes(out) + _bytes(args[_GATHERS[name]])
            return out
        self.stream_bytes += _bytes((args, kwargs, out))
        return out


def _arch(family: Family) -> ModelArch:
    llama = family is Family.LLAMA
    return ModelArch(
        family=family,
        num_blocks=2,
        hidden_size=256,
        num_heads=8,
        num_kv_heads=2 if llama else 8,
        ffn_hidden_size=704 if llama else 1024,
        vocab_size=1000,
        max_seq_len=64,
        tie_embeddings=not llama,
    )


def _rope(arch: ModelArch, *, seq_len: int) -> Rope | None:
    """The rotary tables a Llama block takes (GPT-2 blocks take none)."""
    if arch.family is not Family.LLAMA:
        return None
    return rope_tables(
        seq_len=seq_len,
        head_dim=arch.resolved_head_dim,
        theta=arch.rope_theta,
        device=torch.device("cpu"),
    )


@pytest.mark.parametrize("family", [Family.LLAMA, Family.GPT2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("index", [0, 1, 3])  # embedding, a block, the head (with its loss)
def test_forward_traffic_and_kernels_match_the_runtime(
    family: Family, dtype: torch.dtype, index: int
) -> None:
    arch = _arch(family)
    spec = build_model_spec("t", arch)
    layer = spec.layers[index]
    batch, seq = 2, 32
    tokens = batch * seq
    torch.manual_seed(0)
    module = build_layer_module(arch, index, head_owns_output=True).to(dtype)
    rope = _rope(arch, seq_len=seq)
    if index == 0:
        x: torch.Tensor = torch.randint(0, arch.vocab_size, (batch, seq))
    else:
        x = torch.randn(batch, seq, arch.hidden_size, dtype=dtype)
    labels = torch.randint(0, arch.vocab_size, (batch, seq))
    counter = _Counter()
    with counter, torch.no_grad():
        if index == spec.num_layers - 1:
            token_loss_sum(module(x), labels)
        elif index == 0:
            module(x)
        else:
            module(x, rope)
    dtype_bytes = torch.finfo(dtype).bits // 8
    predicted = layer.ops.stream_bytes_per_token(dtype_bytes=dtype_bytes) * tokens
    if index == 0 and family is Family.GPT2:  # learned positions: gathered once per position
        predicted += 3 * seq * arch.hidden_size * dtype_bytes  # gathered, then read by the add
    # Per-call constants (norm weights, rotary tables, the loss's scalar) are not per token.
    assert counter.stream_bytes == pytest.approx(predicted, rel=0.05)
    assert counter.kernels == layer.ops.forward_kernels(dtype_bytes=dtype_bytes)


@pytest.mark.parametrize("family", [Family.LLAMA, Family.GPT2])
def test_a_block_backward_moves_about_twice_its_forward(family: Family) -> None:
    """``cost.compute`` prices a backward as twice its forward's traffic and kernels: the
    runtime's block backward dispatches 1.6-2.6x the forward's memory-bound bytes and
    kernels (2.2x the bytes measured when this was written)."""
    arch = _arch(family)
    module = build_layer_module(arch, 1, head_owns_output=True).to(torch.bfloat16)
    rope = _rope(arch, seq_len=32)
    x = torch.randn(2, 32, arch.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    forward = _Counter()
    with forward:
        y = module(x, rope)
    upstream = torch.randn_like(y)
    backward = _Counter()
    with backward:
        y.backward(upstream)
    assert 1.6 <= backward.stream_bytes / forward.stream_bytes <= 2.6
    assert 1.6 <= backward.kernels / forward.kernels <= 2.6


class _Recomputed(_Counter):
    """:class:`_Counter`, plus the matmul FLOPs of what it sees (2 x m x n x k each)."""

    def __init__(self) -> None:
        super().__init__()
        self.matmul_flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm"):
            a, b = args[-2], args[-1]
            self.matmul_flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.mark.parametrize("family", [Family.LLAMA, Family.GPT2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("recompute", [Recompute.FULL, Recompute.SELECTIVE])
def test_a_recomputed_block_reruns_what_the_layer_says(
    family: Family, dtype: torch.dtype, recompute: Recompute
) -> None:
    """A block's backward under recompute dispatches what the same backward without it
    does plus what ``LayerSpec.rerun`` says it runs again: its kernels and matmul FLOPs
    exactly, its memory-bound bytes within 5%."""
    arch = _arch(family)
    spec = build_model_spec("t", arch)
    batch, seq = 2, 32
    counted = {}
    for mode in (Recompute.NONE, recompute):
        part = build_stage_part(spec, layer_start=1, layer_end=2, dtype=dtype)
        part.recompute = mode
        x = torch.randn(batch, seq, arch.hidden_size, dtype=dtype, requires_grad=True)
        y = part(x)
        counter = _Recomputed()
        with counter:
            y.backward(torch.ones_like(y))
        counted[mode] = counter
    plain, recomputed = counted[Recompute.NONE], counted[recompute]
    dtype_bytes = torch.finfo(dtype).bits // 8
    rerun = spec.layers[1].rerun(recompute)
    tokens = batch * seq
    assert recomputed.kernels - plain.kernels == rerun.ops.forward_kernels(dtype_bytes=dtype_bytes)
    assert recomputed.matmul_flops - plain.matmul_flops == 2 * rerun.matmul_weights * tokens
    assert recomputed.stream_bytes - plain.stream_bytes == pytest.approx(
        rerun.ops.stream_bytes_per_token(dtype_bytes=dtype_bytes) * tokens, rel=0.05
    )
