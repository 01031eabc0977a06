"""What a layer's forward pass runs on a GPU, per token: GEMM traffic, memory-bound traffic
and kernel launches, so its time can be priced op by op (``piebald.cost.compute``).

A layer's matmuls (``LayerSpec.matmul_flops_per_token``) and its fused attention
(``attention_flops_per_token_per_position``) are compute-bound; around them the runtime's
eager PyTorch runs memory-bound kernels -- norms with fp32 statistics, rotary embeddings,
residual adds, the MLP's activation, the loss over the vocabulary -- each of which reads its
inputs from and writes its output to HBM. On a GPU whose FLOP/s grew faster than its memory
bandwidth (H100 against A100: 3.2x the FLOP/s, 1.6x the bandwidth) these kernels are what
keeps its speed-up well under its FLOP/s ratio. The counts below follow the runtime's
model code kernel by kernel (``piebald.runtime.models``: llama.py, gpt2.py, norms.py,
rope.py, loss.py) and are checked against the kernels and bytes that code really dispatches
(``tests/unit/specs/test_layer_ops.py``, a TorchDispatchMode counter).

Per token, with h hidden, q and kv the query and key/value widths, f the MLP width, V the
vocabulary and D the bytes of a training-dtype value, the forward moves
``stream_fixed_bytes + stream_values x D`` bytes in memory-bound kernels:

* RMSNorm (fp32 statistics, cast back, scale): 20h fixed + 2h values, 6 kernels, and 2h
  values cast to fp32 and back (2 kernels). LayerNorm (one fused kernel): 8 fixed (fp32
  mean and rstd) + 2h values, 1 kernel.
* Rotary embedding of a tensor of width w (neg, cat, two products, a sum): 10w values,
  5 kernels, plus 2 casts of the cos/sin tables per call.
* Residual add: 3h values, 1 kernel. SwiGLU (silu, product): 5f values, 2 kernels.
  GELU: 2f values, 1 kernel.
* Loss (head): the logits cast to fp32 (V values cast), log-softmax (8V) and the
  negative log-likelihood (reads one logit per token): 8V fixed, 2 kernels and the cast.
* Embedding: the gathered rows written out (2h values; GPT-2 adds the learned positions,
  gathered and read once per position for the whole batch: 4h values per token and 3
  kernels).

Under sequence parallelism (``specs.tensor_layout``) each member of a tensor group runs the
norms and residual adds on 1/t of the tokens: per token of the micro-batch, their traffic
is scaled by ``sequence_share`` = 1/t (their kernels are as many). The split widths (q, kv,
f, and V for a vocabulary-parallel head) are the caller's.

A cast to or from fp32 reads D and writes 4 bytes per value (or the reverse); in fp32
training it is no kernel at all, which is why casts are counted apart.

GEMM traffic (weights once, plus each GEMM's input and output activations, plus the
attention kernel's Q, K, V and output) overlaps the GEMMs' math; memory-bound kernels do
not overlap anything. The backward of every op reads its output's gradient and what it
saved and writes its input's gradient (and its weight's), about twice the forward's
traffic and kernels -- the counter measures about 2.2x the bytes and 1.6-1.9x the kernels
of a block for both families -- and ``piebald.cost.compute`` prices the backward as 2x the
forward.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "NO_OPS",
    "NO_RERUN",
    "BlockShape",
    "LayerOps",
    "Rerun",
    "block_ops",
    "block_reruns",
    "embedding_ops",
    "head_ops",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerOps:
    """A layer's forward pass per token, beyond its FLOPs (module docstring)."""

    gemm_io_values_per_token: float  # GEMM and attention inputs and outputs, training dtype
    stream_fixed_bytes_per_token: float  # memory-bound traffic in fp32/int64, any dtype
    stream_values_per_token: float  # memory-bound traffic in training-dtype values
    cast_values_per_token: float = 0.0  # values cast to or from fp32 (none in fp32)
    kernels: int  # kernel launches of one forward pass, whatever its size, casts aside
    cast_kernels: int = 0  # casts to or from fp32 (and of rotary tables): none in fp32

    def stream_bytes_per_token(self, *, dtype_bytes: int) -> float:
        casts = self.cast_values_per_token * (dtype_bytes + 4) if dtype_bytes < 4 else 0.0
        return (
            self.stream_fixed_bytes_per_token + self.stream_values_per_token * dtype_bytes + casts
        )

    def forward_kernels(self, *, dtype_bytes: int) -> int:
        return self.kernels + (self.cast_kernels if dtype_bytes < 4 else 0)


# No work: what a layer that is never recomputed runs again (``NO_RERUN``).
NO_OPS = LayerOps(
    gemm_io_values_per_token=0.0,
    stream_fixed_bytes_per_token=0.0,
    stream_values_per_token=0.0,
    kernels=0,
)

_RMSNORM_FIXED, _RMSNORM_VALUES, _RMSNORM_CASTS, _RMSNORM_KERNELS = 20, 2, 2, 6
_LAYERNORM_FIXED, _LAYERNORM_VALUES, _LAYERNORM_KERNELS = 8, 2, 1


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockShape:
    """One transformer block as a rank runs it: Llama (RMSNorm, RoPE, SwiGLU, separate
    Q/K/V projections) or GPT-2 (LayerNorm, fused QKV projection, GELU), its query,
    key/value and MLP widths (the rank's split of them), and the share of the tokens its
    norms and residual adds run on (module docstring)."""

    llama: bool
    hidden: int
    q_width: int
    kv_width: int
    ffn_hidden: int
    sequence_share: float = 1.0


def block_ops(*, shape: BlockShape) -> LayerOps:
    """One transformer block's forward (module docstring)."""
    h, q, kv, f = shape.hidden, shape.q_width, shape.kv_width, shape.ffn_hidden
    sequence_share = shape.sequence_share
    hs = h * sequence_share  # the hidden-width ops' values per token of the micro-batch
    attention_io = 2 * q + 2 * kv  # Q, K, V in; the output (q wide) out
    if shape.llama:
        # wq, wk, wv read h each; wo reads q; gate and up read h each; down reads f.
        gemm_io = (3 * h + q + 2 * kv) + (q + h) + (2 * h + 2 * f) + (f + h)
        return LayerOps(
            gemm_io_values_per_token=gemm_io + attention_io,
            stream_fixed_bytes_per_token=2 * _RMSNORM_FIXED * hs,
            stream_values_per_token=2 * _RMSNORM_VALUES * hs + 10 * (q + kv) + 2 * 3 * hs + 5 * f,
            cast_values_per_token=2 * _RMSNORM_CASTS * hs,
            # norms, RoPE on Q and K, two adds, SwiGLU, 7 GEMMs, the attention kernel
            kernels=2 * _RMSNORM_KERNELS + 2 * 5 + 2 + 2 + 7 + 1,
            cast_kernels=2 * 2 + 2 * 2,  # each norm's two; the rotary tables', per call
        )
    gemm_io = (h + 3 * h) + (h + h) + (h + f) + (f + h)
    return LayerOps(
        gemm_io_values_per_token=gemm_io + attention_io,
        stream_fixed_bytes_per_token=2 * _LAYERNORM_FIXED * sequence_share,
        stream_values_per_token=2 * _LAYERNORM_VALUES * hs + 2 * 3 * hs + 2 * f,
        kernels=2 * _LAYERNORM_KERNELS + 2 + 1 + 4 + 1,  # norms, adds, GELU, GEMMs, attention
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Rerun:
    """What a block's backward runs again of its forward under activation checkpointing
    (``specs.recompute``): the matmul weights per rank it multiplies again (2 FLOPs per
    weight per token), whether the attention kernel runs again, and the rest."""

    matmul_weights: float
    attention: bool
    ops: LayerOps


NO_RERUN = Rerun(matmul_weights=0.0, attention=False, ops=NO_OPS)


def block_reruns(*, shape: BlockShape, forward: LayerOps) -> tuple[Rerun, Rerun]:
    """(full, selective): what the backward of a block of ``shape`` whose forward is
    ``forward`` (:func:`block_ops`) reruns under each recompute mode.

    torch stops the rerun once every tensor the backward needs is back, which is before
    the block's last matmul (Llama's down projection, GPT-2's second MLP layer) and its
    final residual add: neither runs again under either mode. Full reruns everything
    else of :func:`block_ops`; selective skips, besides, the matmuls whose outputs it kept
    (Llama's Q, V and gate; GPT-2's QKV and first MLP layer) and the attention kernel, so
    it reruns Llama's K, O and up projections and GPT-2's attention output projection
    with every memory-bound op. The kernels of what is not run again are not launched.
    ``tests/unit/specs/test_layer_ops.py`` counts both against the runtime."""
    h, q, kv, f = shape.hidden, shape.q_width, shape.kv_width, shape.ffn_hidden
    hs = h * shape.sequence_share

    def rerun(weights: float, gemm_io: float, kernels_not_run: int, attention: bool) -> Rerun:
        ops = LayerOps(
            gemm_io_values_per_token=gemm_io,
            stream_fixed_bytes_per_token=forward.stream_fixed_bytes_per_token,
            # The final residual add (3 values per hidden position, one kernel) is not run.
            stream_values_per_token=forward.stream_values_per_token - 3 * hs,
            cast_values_per_token=forward.cast_values_per_token,
            kernels=forward.kernels - kernels_not_run - 1,
            cast_kernels=forward.cast_kernels,
        )
        return Rerun(matmul_weights=float(weights), attention=attention, ops=ops)

    if shape.llama:
        full = rerun(
            weights=2 * h * q + 2 * h * kv + 2 * h * f,  # all but down
            gemm_io=forward.gemm_io_values_per_token - (f + h),
            kernels_not_run=1,
            attention=True,
        )
        selective = rerun(
            weights=h * kv + q * h + h * f,  # K, O, up
            gemm_io=(h + kv) + (q + h) + (h + f),
            kernels_not_run=4 + 1,  # Q, V, gate, down; the attention kernel
            attention=False,
        )
        return full, selective
    full = rerun(
        weights=4 * h * q + h * f,  # all but the MLP's second layer
        gemm_io=forward.gemm_io_values_per_token - (f + h),
        kernels_not_run=1,
        attention=True,
    )
    selective = rerun(
        weights=q * h,  # the attention's output projection
        gemm_io=q + h,
        kernels_not_run=3 + 1,  # QKV, the MLP's two layers; the attention kernel
        attention=False,
    )
    return full, selective


def embedding_ops(*, learned_positions: bool, hidden: int) -> LayerOps:
    """The token gather (and GPT-2's position gather and add)."""
    if learned_positions:
        return LayerOps(
            gemm_io_values_per_token=0.0,
            stream_fixed_bytes_per_token=8.0,  # the int64 token id
            stream_values_per_token=4.0 * hidden,
            kernels=3,
        )
    return LayerOps(
        gemm_io_values_per_token=0.0,
        stream_fixed_bytes_per_token=8.0,
        stream_values_per_token=2.0 * hidden,
        kernels=1,
    )


def head_ops(*, llama: bool, hidden: int, vocab_size: int, sequence_share: float = 1.0) -> LayerOps:
    """The final norm (on ``sequence_share`` of the tokens), the LM head GEMM and the fp32
    cross-entropy over ``vocab_size`` logits (a vocabulary-parallel member's slice)."""
    h, v = hidden, vocab_size
    hs = h * sequence_share
    fixed, values, casts, kernels, cast_kernels = (
        (_RMSNORM_FIXED * hs, _RMSNORM_VALUES * hs, _RMSNORM_CASTS * hs, _RMSNORM_KERNELS, 2)
        if llama
        else (_LAYERNORM_FIXED * sequence_share, _LAYERNORM_VALUES * hs, 0, _LAYERNORM_KERNELS, 0)
    )
    return LayerOps(
        gemm_io_values_per_token=h + v,
        stream_fixed_bytes_per_token=fixed + 8.0 * v + 8.0,  # + the int64 label
        stream_values_per_token=values,
        cast_values_per_token=casts + v,  # the norm's, the logits'
        kernels=kernels + 1 + 2,  # the norm, the GEMM, log-softmax and the likelihood
        cast_kernels=cast_kernels + 1,
    )
