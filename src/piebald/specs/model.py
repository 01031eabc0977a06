"""A decoder-only transformer as an ordered list of layers, with what each one costs.

Layer 0 is the embedding, layers 1..N the transformer blocks, layer N+1 the final norm and
LM head. Per layer the spec gives parameters, forward FLOPs per token and the activation
bytes per token kept for the backward pass, with and without recompute.

Formulas (h = hidden size, h_kv = key/value width = kv heads x head dim, f = MLP width,
V = vocabulary, s = sequence length):

* Parameters, GPT-2 block: 12h^2 + 13h (QKV 3h^2+3h, proj h^2+h, MLP 8h^2+5h, two LayerNorms
  4h). Llama block: 2h^2 + 2h*h_kv (Q, O, K, V) + 3hf (gate, up, down) + 2h (two RMSNorms),
  plus the biases an architecture has: q_width + 2h_kv on Q, K, V (Qwen2, Llama's
  attention_bias), h on O (Llama's attention_bias), 2f + h on the MLP (Llama's mlp_bias).
* Forward FLOPs per token: 2 per matmul weight, plus 4*s*h per block for the attention
  scores and the weighted sum (PaLM, Chowdhery et al. 2022, appendix B: 6N + 12LHQT per
  token for training = 3 x forward). Backward is 2 x forward.
* Activation bytes per token, as the runtime's eager kernels keep them for the backward
  pass (measured tensor by tensor with saved-tensor hooks, docs/activation_bytes.md; the
  shape of the accounting follows Korthikanti et al. 2022, section 4.1). Each layer keeps
  ``A + B x D`` bytes per token for activations of D bytes: A are bytes kept in fp32 or
  int64 whatever the training dtype, B the values kept in the training dtype. Fused
  attention (scaled_dot_product_attention) keeps no s x s scores, only an fp32
  log-sum-exp (4 bytes per head), and there is no dropout.
  Llama block: each RMSNorm keeps its input in fp32 (4h), its fp32 rstd (4), the
  normalised input before the weight and its output (2 x Dh); Q and K after RoPE, V and
  the attention output (2 q_width + 2 kv_width); the SwiGLU gate, up, silu and product
  (4f): A = 8h + 4a + 8, B = 4h + 2 q_width + 2 kv_width + 4f.
  GPT-2 block: two LayerNorms' inputs and outputs, one QKV tensor, the attention output
  (8h), the MLP's hidden and GELU output (2f), fp32 mean and rstd per LayerNorm and the
  log-sum-exp: A = 4a + 16, B = 8h + 2f.
  Embedding: the int64 token ids, A = 8. Head: the final norm as in a block (Llama
  4h + 4 fp32 and 2h values; GPT-2 mean/rstd 8 and 2h values), the fp32 log-softmax of
  the loss (4V; the logits themselves are not kept) and the int64 labels (8).
  With full recompute a block keeps only its input, B = h (Korthikanti section 5). With
  selective recompute (``specs.recompute``) it keeps its input, the attention output and
  log-sum-exp and its kept matmuls' outputs: Llama A = 4a, B = 2h + 2q + kv + f; GPT-2
  A = 4a, B = h + 4q + f (the fused QKV output 3q wide, the attention output q).

Tensor parallelism of degree t (Megatron-LM, Shoeybi et al. 2019) splits a block's heads and
MLP width t ways: :meth:`ModelSpec.layers_at` gives the layers as one rank of a tensor group
holds and runs them -- each block's matmul weights, column biases, attention heads,
FLOPs, the activations on split widths (Q, K, V, the attention output, the MLP's hidden
values, the log-sum-exp) and its per-token kernel traffic divided by t; the norms, the
row-parallel biases and everything on the hidden width (norm inputs and outputs, residual
adds) whole, on every rank (no sequence parallelism; Korthikanti's "10 + 24/t" split).
The embedding and the head are not split: every rank of the group holds and runs them.
That is the ``blocks`` layout; ``layers_at`` also gives the layers of the other layouts
(``specs.tensor_layout``), among them ``sequence``, the one piebald's planner makes:

* ``vocabulary``: the embedding's and the head's weights split over the vocabulary (each
  rank ceil(V / t) rows, the vocabulary padded as Megatron-LM pads it), the head's FLOPs,
  logits, loss traffic and kept fp32 log-softmax (4V) with them; GPT-2's learned positions
  stay whole.
* ``sequence``: that, and every rank keeps and runs the hidden-width part of a block (its
  norms' inputs, statistics and outputs, residual adds; with recompute, the block's input)
  and the final norm on 1/t of the tokens: Korthikanti's "34/t" (section 4.2.2, table 2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from piebald.specs.layer_ops import (
    NO_RERUN,
    BlockShape,
    LayerOps,
    Rerun,
    block_ops,
    block_reruns,
    embedding_ops,
    head_ops,
)
from piebald.specs.limits import (
    MAX_FFN_HIDDEN_SIZE,
    MAX_HEAD_DIM,
    MAX_HIDDEN_SIZE,
    MAX_NUM_BLOCKS,
    MAX_NUM_HEADS,
    MAX_SEQ_LEN,
    MAX_VOCAB_SIZE,
)
from piebald.specs.recompute import Recompute
from piebald.specs.rope_scaling import RopeScaling
from piebald.specs.tensor_layout import TensorLayout

__all__ = [
    "ARCH_LIMITS",
    "Family",
    "HfModelType",
    "LayerKind",
    "LayerSpec",
    "ModelArch",
    "ModelSpec",
    "build_model_spec",
    "kept_bytes",
]


class Family(StrEnum):
    GPT2 = "gpt2"
    # Llama, Mistral and Qwen2: RMSNorm, RoPE, SwiGLU, grouped-query attention
    LLAMA = "llama"


class HfModelType(StrEnum):
    """The Hugging Face ``model_type`` an architecture is written out as."""

    GPT2 = "gpt2"
    LLAMA = "llama"
    MISTRAL = "mistral"  # a Llama with an optional sliding attention window
    QWEN2 = "qwen2"  # a Llama with biases on Q, K and V (and an optional sliding window)


_HF_MODEL_TYPES = {
    Family.GPT2: (HfModelType.GPT2,),
    Family.LLAMA: (HfModelType.LLAMA, HfModelType.MISTRAL, HfModelType.QWEN2),
}


# The size fields of a ModelArch and their limits (piebald.specs.limits); loaders read
# these fields with the same maxima, so a config over one is refused naming its field.
ARCH_LIMITS = {
    "num_blocks": MAX_NUM_BLOCKS,
    "hidden_size": MAX_HIDDEN_SIZE,
    "num_heads": MAX_NUM_HEADS,
    "num_kv_heads": MAX_NUM_HEADS,
    "ffn_hidden_size": MAX_FFN_HIDDEN_SIZE,
    "vocab_size": MAX_VOCAB_SIZE,
    "max_seq_len": MAX_SEQ_LEN,
}


class LayerKind(StrEnum):
    EMBEDDING = "embedding"
    BLOCK = "block"
    HEAD = "head"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelArch:
    """The architecture numbers a layer list is built from (and a runtime model too)."""

    family: Family
    num_blocks: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_seq_len: int
    tie_embeddings: bool
    # 0: hidden_size // num_heads (a head_dim equal to that is stored as 0, so that two
    # descriptions of one architecture compare equal).
    head_dim: int = 0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None  # None: plain RoPE
    attention_qkv_bias: bool = False  # biases on the Q, K, V projections (Qwen2)
    attention_out_bias: bool = False  # a bias on the output projection (Llama attention_bias)
    mlp_bias: bool = False  # biases on gate, up and down (Llama mlp_bias)
    # Tokens a query attends to, itself included (Mistral, Qwen2); None: every earlier one.
    sliding_window: int | None = None
    # None: the family's own (gpt2, llama); set on construction, so never None afterwards.
    hf_model_type: HfModelType | None = None

    def __post_init__(self) -> None:
        for name, maximum in ARCH_LIMITS.items():
            value = getattr(self, name)
            if not 1 <= value <= maximum:
                raise ValueError(f"ModelArch.{name} = {value}; expected 1..{maximum}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelArch.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim == 0 and self.hidden_size % self.num_heads:
            raise ValueError(
                f"ModelArch.hidden_size ({self.hidden_size}) must be a multiple "
                f"of num_heads ({self.num_heads}) when head_dim is not given"
            )
        if not 0 <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f"ModelArch.head_dim = {self.head_dim}; expected 0..{MAX_HEAD_DIM}")
        if self.family is Family.LLAMA and self.resolved_head_dim % 2:
            # RoPE rotates pairs of a head's dimensions.
            raise ValueError(
                f"ModelArch head dimension = {self.resolved_head_dim}; expected an even "
                "number (RoPE rotates pairs of dimensions)"
            )
        if self.head_dim and self.head_dim * self.num_heads == self.hidden_size:
            object.__setattr__(self, "head_dim", 0)
        if self.hf_model_type is None:
            object.__setattr__(self, "hf_model_type", _HF_MODEL_TYPES[self.family][0])
        self._check_variant()

    def _check_variant(self) -> None:
        """The options each Hugging Face model type can express (hf_config_from_arch writes
        them back, so an architecture none of them describes is refused here)."""
        kind = self.hf_model_type
        if kind not in _HF_MODEL_TYPES[self.family]:
            raise ValueError(
                f"ModelArch.hf_model_type = {kind}; expected one of "
                f"{[t.value for t in _HF_MODEL_TYPES[self.family]]} for family {self.family}"
            )
        biases = (self.attention_qkv_bias, self.attention_out_bias, self.mlp_bias)
        allowed = {
            HfModelType.GPT2: {(False, False, False)},  # its biases come with the family
            HfModelType.LLAMA: {(q, q, m) for q in (False, True) for m in (False, True)},
            HfModelType.MISTRAL: {(False, False, False)},
            HfModelType.QWEN2: {(True, False, False)},
        }[kind]
        if biases not in allowed:
            raise ValueError(
                f"ModelArch (attention_qkv_bias, attention_out_bias, mlp_bias) = {biases}; "
                f"expected one of {sorted(allowed)} for {kind}"
            )
        if self.sliding_window is not None:
            if kind not in (HfModelType.MISTRAL, HfModelType.QWEN2):
                raise ValueError(f"ModelArch.sliding_window is for mistral and qwen2, not {kind}")
            if not 1 <= self.sliding_window <= MAX_SEQ_LEN:
                raise ValueError(
                    f"ModelArch.sliding_window = {self.sliding_window}; expected 1..{MAX_SEQ_LEN}"
                )
        if self.family is Family.GPT2 and self.rope_scaling is not None:
            raise ValueError("ModelArch.rope_scaling is for the Llama family (GPT-2 has no RoPE)")

    @property
    def model_type(self) -> HfModelType:
        """The Hugging Face model type (hf_model_type, resolved)."""
        assert self.hf_model_type is not None  # set by __post_init__
        return self.hf_model_type

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.resolved_head_dim

    @property
    def q_width(self) -> int:
        return self.num_heads * self.resolved_head_dim


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSpec:
    """One pipeline-splittable layer and its per-token costs."""

    index: int
    kind: LayerKind
    num_params: int
    # Parameters this layer uses but another layer owns (the LM head tied to the
    # embedding): a stage holding this layer without its owner keeps a replica.
    num_tied_params: int
    # Of ``num_params``, those a tensor group does not split: every member holds them whole
    # (norms, row-parallel biases, the embedding and head unless the vocabulary is split).
    # A group's leader owns their sharded state for it; its other members keep replicas
    # (``runtime.distributed.group_layout``).
    num_whole_params: int
    matmul_flops_per_token: float
    attention_flops_per_token_per_position: float  # x seq_len
    # Kept for the backward pass, per token: bytes in fp32 or int64 whatever the training
    # dtype, and values in the training dtype (see the module docstring); with recompute.
    activation_fixed_bytes_per_token: float
    activation_values_per_token: float
    recompute_fixed_bytes_per_token: float  # under full recompute (specs/recompute.py)
    recompute_values_per_token: float
    selective_fixed_bytes_per_token: float  # under selective recompute
    selective_values_per_token: float
    output_bytes_per_token: float  # what the layer hands to the next one (16-bit): 2h
    ops: LayerOps  # its traffic and kernels beyond the FLOPs (specs/layer_ops.py)
    # What its backward runs again under full and selective recompute
    # (``layer_ops.block_reruns``; nothing outside the blocks).
    full_rerun: Rerun = NO_RERUN
    selective_rerun: Rerun = NO_RERUN

    def forward_flops_per_token(self, *, seq_len: int) -> float:
        return self.matmul_flops_per_token + self.attention_flops_per_token_per_position * seq_len

    def activation_bytes_per_token(
        self, *, dtype_bytes: int, recompute: Recompute = Recompute.NONE
    ) -> float:
        """Bytes per token the layer keeps for its backward pass in a dtype of
        ``dtype_bytes`` under ``recompute``."""
        fixed, values = self.kept_per_token(recompute)
        return float(kept_bytes(fixed=fixed, values=values, dtype_bytes=dtype_bytes))

    def rerun(self, recompute: Recompute) -> Rerun:
        """What the layer's backward runs again of its forward under ``recompute``."""
        if recompute is Recompute.FULL:
            return self.full_rerun
        if recompute is Recompute.SELECTIVE:
            return self.selective_rerun
        return NO_RERUN

    def kept_per_token(self, recompute: Recompute) -> tuple[float, float]:
        """(fp32/int64 bytes, training-dtype values) kept per token under ``recompute``."""
        if recompute is Recompute.FULL:
            return self.recompute_fixed_bytes_per_token, self.recompute_values_per_token
        if recompute is Recompute.SELECTIVE:
            return self.selective_fixed_bytes_per_token, self.selective_values_per_token
        return self.activation_fixed_bytes_per_token, self.activation_values_per_token


def kept_bytes(*, fixed: Any, values: Any, dtype_bytes: int) -> Any:
    """``A + B x D`` (module docstring): bytes kept in fp32 or int64 plus values kept in
    a training dtype of D bytes; for one layer or summed over a range of them."""
    return fixed + values * dtype_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    name: str
    arch: ModelArch
    layers: tuple[LayerSpec, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", _build_layers(self.arch))

    def __hash__(self) -> int:
        # The layers follow from the architecture; hashing them too would make every cache
        # keyed by a model walk its whole layer list.
        return hash((self.name, self.arch))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_params(self) -> int:
        return sum(layer.num_params for layer in self.layers)

    def forward_flops_per_token(self, *, seq_len: int) -> float:
        return sum(layer.forward_flops_per_token(seq_len=seq_len) for layer in self.layers)

    def training_flops_per_token(self, *, seq_len: int) -> float:
        """Model FLOPs of forward plus backward (3 x forward); recompute never counts."""
        return 3.0 * self.forward_flops_per_token(seq_len=seq_len)

    def layers_at(
        self, tensor_parallel_degree: int, layout: TensorLayout = TensorLayout.BLOCKS
    ) -> tuple[LayerSpec, ...]:
        """The layers as one rank of a tensor group of this degree and ``layout`` holds
        and runs them (module docstring); :attr:`layers` at degree 1, whatever the
        layout."""
        if tensor_parallel_degree == 1:
            return self.layers
        return _build_layers(
            self.arch, tensor_parallel_degree=tensor_parallel_degree, layout=layout
        )

    def stage_params(
        self,
        start: int,
        end: int,
        *,
        tensor_parallel_degree: int = 1,
        layout: TensorLayout = TensorLayout.BLOCKS,
    ) -> int:
        """Parameters a stage holding layers [start, end) stores, tied replicas included;
        per rank of a tensor group of ``tensor_parallel_degree`` and ``layout``."""
        total = 0
        for layer in self.layers_at(tensor_parallel_degree, layout)[start:end]:
            total += layer.num_params
            if layer.num_tied_params and start > 0:  # the owner (embedding) is elsewhere
                total += layer.num_tied_params
        return total


def build_model_spec(name: str, arch: ModelArch) -> ModelSpec:
    return ModelSpec(name=name, arch=arch)


@dataclass(frozen=True, slots=True, kw_only=True)
class _BlockWidths:
    """The widths one rank of a tensor group of degree t computes: heads, the query and
    key/value widths and the MLP width divided by t, the hidden width whole."""

    hidden: int
    heads: int
    q: int
    kv: int
    ffn: int

    @classmethod
    def of(cls, arch: ModelArch, tensor_parallel_degree: int) -> _BlockWidths:
        t = tensor_parallel_degree
        return cls(
            hidden=arch.hidden_size,
            heads=arch.num_heads // t,
            q=arch.q_width // t,
            kv=arch.kv_width // t,
            ffn=arch.ffn_hidden_size // t,
        )


def _block_params(arch: ModelArch, widths: _BlockWidths) -> tuple[int, int, int]:
    """(all parameters, matmul weights, whole parameters) of one block, per rank of its
    tensor group: split weights and column biases, whole norms and row biases."""
    h, q, kv, f = widths.hidden, widths.q, widths.kv, widths.ffn
    if arch.family is Family.GPT2:
        weights = 4 * h * q + 2 * h * f  # fused QKV and proj (q = h unsplit), the MLP
        whole = 2 * h + 4 * h  # the two row biases, two LayerNorms
        return weights + (3 * q + f) + whole, weights, whole
    weights = 2 * h * q + 2 * h * kv + 3 * h * f
    whole = 2 * h + (h if arch.attention_out_bias else 0) + (h if arch.mlp_bias else 0)
    column_biases = (q + 2 * kv if arch.attention_qkv_bias else 0) + (2 * f if arch.mlp_bias else 0)
    return weights + column_biases + whole, weights, whole


def _block_activations(
    arch: ModelArch, widths: _BlockWidths, *, sequence_share: float
) -> tuple[float, float]:
    """(fp32/int64 bytes, training-dtype values) a block keeps per token (module
    docstring), per rank of its tensor group, its hidden-width part on ``sequence_share``
    of the tokens."""
    h, heads, q, kv, f = widths.hidden, widths.heads, widths.q, widths.kv, widths.ffn
    hs = h * sequence_share
    if arch.family is Family.GPT2:
        # Norm inputs and outputs and the residual path (4h) whole; QKV and the attention
        # output (4q, = 4h unsplit) and the MLP's two (2f) split.
        return 4 * heads + 16 * sequence_share, 4 * hs + 4 * q + 2 * f
    return 8 * hs + 4 * heads + 8 * sequence_share, 4 * hs + 2 * q + 2 * kv + 4 * f


def _block_selective_kept(
    arch: ModelArch, widths: _BlockWidths, *, sequence_share: float
) -> tuple[float, float]:
    """(fp32 bytes, training-dtype values) a block keeps per token under selective
    recompute (``specs.recompute``): its input (a chunk, sequence parallel), the attention
    kernel's output and fp32 log-sum-exp, and the kept matmuls' outputs -- Llama's Q, V and
    gate on split widths and the down projection's partial sums, whole; GPT-2's fused QKV
    and the MLP's first layer."""
    h, heads, q, kv, f = widths.hidden, widths.heads, widths.q, widths.kv, widths.ffn
    block_input = h * sequence_share
    if arch.family is Family.GPT2:
        return 4 * heads, block_input + (q + 2 * kv) + q + f
    return 4 * heads, block_input + q + kv + q + f + h


def _head_activations(
    arch: ModelArch, *, vocab_slice: int, sequence_share: float
) -> tuple[float, float]:
    """(fp32/int64 bytes, training-dtype values) the head and loss keep per token: the
    final norm's on ``sequence_share`` of the tokens, the log-softmax over ``vocab_slice``
    logits."""
    hs = arch.hidden_size * sequence_share
    norm_fixed = 8 * sequence_share if arch.family is Family.GPT2 else 4 * hs + 4 * sequence_share
    return norm_fixed + 4 * vocab_slice + 8, 2 * hs


@functools.lru_cache(maxsize=256)
def _build_layers(
    arch: ModelArch, *, tensor_parallel_degree: int = 1, layout: TensorLayout = TensorLayout.BLOCKS
) -> tuple[LayerSpec, ...]:
    h, t = arch.hidden_size, tensor_parallel_degree
    vocab = layout.vocabulary_rows(vocab_size=arch.vocab_size, degree=t)  # a rank's rows
    sequence_share = 1.0 / t if layout.splits_sequence else 1.0
    widths = _BlockWidths.of(arch, t)
    positions = arch.max_seq_len * h if arch.family is Family.GPT2 else 0
    split_vocabulary = layout.splits_vocabulary and t > 1
    embedding = LayerSpec(
        index=0,
        kind=LayerKind.EMBEDDING,
        num_params=vocab * h + positions,
        num_tied_params=0,
        num_whole_params=positions + (0 if split_vocabulary else vocab * h),
        matmul_flops_per_token=0.0,
        attention_flops_per_token_per_position=0.0,
        activation_fixed_bytes_per_token=8.0,  # the int64 token ids
        activation_values_per_token=0.0,
        recompute_fixed_bytes_per_token=8.0,
        recompute_values_per_token=0.0,
        selective_fixed_bytes_per_token=8.0,
        selective_values_per_token=0.0,
        output_bytes_per_token=2.0 * h,
        ops=embedding_ops(learned_positions=arch.family is Family.GPT2, hidden=h),
    )
    llama = arch.family is not Family.GPT2
    block_shape = BlockShape(
        llama=llama,
        hidden=h,
        q_width=widths.q,
        kv_width=widths.kv,
        ffn_hidden=widths.ffn,
        sequence_share=sequence_share,
    )
    one_block_ops = block_ops(shape=block_shape)
    block_params, block_weights, block_whole = _block_params(arch, widths)
    block_fixed, block_values = _block_activations(arch, widths, sequence_share=sequence_share)
    selective_fixed, selective_values = _block_selective_kept(
        arch, widths, sequence_share=sequence_share
    )
    full_rerun, selective_rerun = block_reruns(shape=block_shape, forward=one_block_ops)
    # The final norm runs on the sequence shards only where the head is split too; a
    # whole head (``sequence``) sees the sequence gathered at the stage's exit.
    head_share = sequence_share if layout.splits_vocabulary else 1.0
    head_fixed, head_values = _head_activations(arch, vocab_slice=vocab, sequence_share=head_share)
    blocks = [
        LayerSpec(
            index=1 + i,
            kind=LayerKind.BLOCK,
            num_params=block_params,
            num_tied_params=0,
            num_whole_params=block_whole,
            matmul_flops_per_token=2.0 * block_weights,
            attention_flops_per_token_per_position=4.0 * widths.q,
            activation_fixed_bytes_per_token=block_fixed,
            activation_values_per_token=block_values,
            recompute_fixed_bytes_per_token=0.0,
            recompute_values_per_token=h * sequence_share,  # the block's input
            selective_fixed_bytes_per_token=selective_fixed,
            selective_values_per_token=selective_values,
            output_bytes_per_token=2.0 * h,
            ops=one_block_ops,
            full_rerun=full_rerun,
            selective_rerun=selective_rerun,
        )
        for i in range(arch.num_blocks)
    ]
    norm_params = 2 * h if arch.family is Family.GPT2 else h
    head_weight = vocab * h
    head = LayerSpec(
        index=arch.num_blocks + 1,
        kind=LayerKind.HEAD,
        num_params=norm_params + (0 if arch.tie_embeddings else head_weight),
        num_tied_params=head_weight if arch.tie_embeddings else 0,
        num_whole_params=norm_params
        + (0 if arch.tie_embeddings or split_vocabulary else head_weight),
        matmul_flops_per_token=2.0 * head_weight,
        attention_flops_per_token_per_position=0.0,
        activation_fixed_bytes_per_token=head_fixed,
        activation_values_per_token=head_values,
        recompute_fixed_bytes_per_token=head_fixed,  # the head is never recomputed
        recompute_values_per_token=head_values,
        selective_fixed_bytes_per_token=head_fixed,
        selective_values_per_token=head_values,
        output_bytes_per_token=0.0,  # the loss
        ops=head_ops(llama=llama, hidden=h, vocab_size=vocab, sequence_share=head_share),
    )
    return (embedding, *blocks, head)
