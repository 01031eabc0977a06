"""A decoder-only transformer as an ordered list of layers, with what each one costs.

Layer 0 is the embedding, layers 1..N the transformer blocks, layer N+1 the final norm and
LM head. Per layer the spec gives parameters, forward FLOPs per token and the activation
bytes per token kept for the backward pass, with and without recompute.

Formulas (h = hidden size, h_kv = key/value width = kv heads x head dim, f = MLP width,
V = vocabulary, s = sequence length):

* Parameters, GPT-2 block: 12h^2 + 13h (QKV 3h^2+3h, proj h^2+h, MLP 8h^2+5h, two LayerNorms
  4h). Llama block: 2h^2 + 2h*h_kv (Q, O, K, V) + 3hf (gate, up, down) + 2h (two RMSNorms).
* Forward FLOPs per token: 2 per matmul weight, plus 4*s*h per block for the attention
  scores and the weighted sum (PaLM, Chowdhery et al. 2022, appendix B: 6N + 12LHQT per
  token for training = 3 x forward). Backward is 2 x forward.
* Activation bytes per token at 16-bit activations, after Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", section 4.1, whose GPT
  block stores 34h + 5as bytes per token. piebald runs fused attention
  (scaled_dot_product_attention), which keeps no s x s scores (the 5as term goes, leaving a
  4a-byte fp32 log-sum-exp per token), and trains without dropout (the 2h of masks go):
  GPT-2 block 32h + 4a. Llama block: norm inputs 4h, norm outputs 4h, Q/K/V 2h + 4h_kv,
  attention output 2h, SwiGLU gate/up/silu/product 8f: 12h + 4h_kv + 8f + 4a.
  With full recompute a block keeps only its input, 2h (Korthikanti section 5).
  The head keeps the final norm's input and output (4h) and the logits in 16 bits and in
  fp32 for the loss (6V).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["Family", "LayerKind", "LayerSpec", "ModelArch", "ModelSpec", "build_model_spec"]


class Family(StrEnum):
    GPT2 = "gpt2"
    LLAMA = "llama"  # Llama and Mistral: RMSNorm, RoPE, SwiGLU, grouped-query attention


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
    head_dim: int = 0  # 0: hidden_size // num_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in (
            "num_blocks",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "ffn_hidden_size",
            "vocab_size",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"ModelArch.{name} = {value}; expected >= 1")
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
    matmul_flops_per_token: float
    attention_flops_per_token_per_position: float  # x seq_len
    activation_bytes_per_token: float
    recompute_activation_bytes_per_token: float
    output_bytes_per_token: float  # what the layer hands to the next one (16-bit): 2h

    def forward_flops_per_token(self, *, seq_len: int) -> float:
        return self.matmul_flops_per_token + self.attention_flops_per_token_per_position * seq_len


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

    def stage_params(self, start: int, end: int) -> int:
        """Parameters a stage holding layers [start, end) stores, tied replicas included."""
        total = 0
        for layer in self.layers[start:end]:
            total += layer.num_params
            if layer.num_tied_params and start > 0:  # the owner (embedding) is elsewhere
                total += layer.num_tied_params
        return total


def build_model_spec(name: str, arch: ModelArch) -> ModelSpec:
    return ModelSpec(name=name, arch=arch)


def _block_params(arch: ModelArch) -> tuple[int, int]:
    """(all parameters, matmul weights) of one block."""
    h, f = arch.hidden_size, arch.ffn_hidden_size
    if arch.family is Family.GPT2:
        weights = 4 * h * h + 2 * h * f
        return weights + (3 * h + h + f + h) + 4 * h, weights  # biases, two LayerNorms
    weights = 2 * h * arch.q_width + 2 * h * arch.kv_width + 3 * h * f
    return weights + 2 * h, weights


def _block_activation_bytes(arch: ModelArch) -> float:
    h, f, lse = arch.hidden_size, arch.ffn_hidden_size, 4 * arch.num_heads
    if arch.family is Family.GPT2:
        return 16 * h + 4 * f + lse  # 32h + 4a when f = 4h
    return 8 * h + 4 * arch.q_width + 4 * arch.kv_width + 8 * f + lse


def _build_layers(arch: ModelArch) -> tuple[LayerSpec, ...]:
    h, vocab = arch.hidden_size, arch.vocab_size
    positions = arch.max_seq_len * h if arch.family is Family.GPT2 else 0
    embedding = LayerSpec(
        index=0,
        kind=LayerKind.EMBEDDING,
        num_params=vocab * h + positions,
        num_tied_params=0,
        matmul_flops_per_token=0.0,
        attention_flops_per_token_per_position=0.0,
        activation_bytes_per_token=0.0,
        recompute_activation_bytes_per_token=0.0,
        output_bytes_per_token=2.0 * h,
    )
    block_params, block_weights = _block_params(arch)
    blocks = [
        LayerSpec(
            index=1 + i,
            kind=LayerKind.BLOCK,
            num_params=block_params,
            num_tied_params=0,
            matmul_flops_per_token=2.0 * block_weights,
            attention_flops_per_token_per_position=4.0 * arch.q_width,
            activation_bytes_per_token=_block_activation_bytes(arch),
            recompute_activation_bytes_per_token=2.0 * h,
            output_bytes_per_token=2.0 * h,
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
        matmul_flops_per_token=2.0 * head_weight,
        attention_flops_per_token_per_position=0.0,
        activation_bytes_per_token=4.0 * h + 6.0 * vocab,
        recompute_activation_bytes_per_token=4.0 * h + 6.0 * vocab,
        output_bytes_per_token=0.0,  # the loss
    )
    return (embedding, *blocks, head)
