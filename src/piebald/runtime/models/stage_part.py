"""A contiguous range of the model's layers, as one pipeline stage runs it.

Layer indices are those of ``ModelSpec.layers``: 0 is the embedding (with learned positions
for GPT-2), 1..N the blocks, N+1 the final norm and LM head. A part holds layers
[layer_start, layer_end) in an ``nn.ModuleDict`` keyed by the global index, so a parameter
has the same name in every split of the model ("layers.3.attention.wq.weight"), which is
what checkpoints and equivalence tests match on.

Weights depend only on (seed, layer index) (models/init.py): the parts of any split hold
exactly the weights of the whole model.

Under sequence-parallel tensor parallelism (models/tensor_parallel.py sets
``tensor_group``) the blocks run on each member's chunk of the sequence: the part's first
block cuts its whole input to the member's chunk and its last block's output is gathered
whole again (models/tensor_ops.py), so the embedding, the head and what a stage sends and
receives stay whole.

Tied embeddings: when the embedding and the head sit on different parts, each holds its own
copy of the shared table (the head's starts as a copy of the embedding's). Both copies must
receive the sum of the two gradients so that they stay equal; ``tied_parameters`` names them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

from piebald.runtime.models.embedding import Embedding
from piebald.runtime.models.gpt2 import GPT2Block
from piebald.runtime.models.head import Head
from piebald.runtime.models.init import INIT_STD, init_layer, layer_generator
from piebald.runtime.models.llama import LlamaBlock, Rope, rope_tables
from piebald.runtime.models.norms import RMSNorm
from piebald.runtime.models.selective_recompute import selective_contexts
from piebald.runtime.models.tensor_ops import (
    TensorGroup,
    enter_sequence_chunks,
    leave_sequence_chunks,
)
from piebald.specs.model import Family, LayerKind, ModelArch, ModelSpec
from piebald.specs.recompute import Recompute

__all__ = ["StagePart", "TiedParameter", "build_layer_module", "build_stage_part"]

EMBEDDING_WEIGHT_NAME = "layers.0.tok_embeddings.weight"


@dataclass(frozen=True, slots=True, kw_only=True)
class TiedParameter:
    """One copy of a weight shared by two layers on different stages (embedding and head).

    The runtime sums ``parameter.grad`` with the gradient of the copy held by the ranks of
    the stage holding ``peer_layer_index`` (after each stage's own data-parallel sum), so both
    copies take the same optimizer step. Checkpoints store it once, as ``canonical_name``.
    """

    canonical_name: str  # the owner's name: "layers.0.tok_embeddings.weight"
    local_name: str  # its name in this part's named_parameters()
    parameter: nn.Parameter
    layer_index: int  # the layer of this part that uses it (0, or N+1 for the head)
    peer_layer_index: int  # the layer on another stage that holds the other copy


def build_layer_module(arch: ModelArch, index: int, *, head_owns_output: bool) -> nn.Module:
    """The module of global layer ``index`` (uninitialised; built on the current device)."""
    last = arch.num_blocks + 1
    if index == 0:
        positions = arch.max_seq_len if arch.family is Family.GPT2 else 0
        return Embedding(
            vocab_size=arch.vocab_size, hidden_size=arch.hidden_size, max_positions=positions
        )
    if index <= arch.num_blocks:
        return GPT2Block(arch) if arch.family is Family.GPT2 else LlamaBlock(arch)
    assert index == last, f"layer {index} outside 0..{last}"
    norm: nn.Module = (
        nn.LayerNorm(arch.hidden_size, eps=arch.norm_eps)
        if arch.family is Family.GPT2
        else RMSNorm(arch.hidden_size, eps=arch.norm_eps)
    )
    return Head(
        norm,
        hidden_size=arch.hidden_size,
        vocab_size=arch.vocab_size,
        owns_output_weight=head_owns_output,
    )


class StagePart(nn.Module):
    """Layers [layer_start, layer_end) of a model.

    forward(x): x is int64 token ids [b, s] when the part starts at the embedding, else
    hidden states [b, s, h]; returns hidden states [b, s, h], or logits [b, s, V] when the
    part ends with the head. Set ``recompute`` to ``Recompute.FULL`` or ``SELECTIVE`` to
    recompute each block's activations, all or some (``specs.recompute``), in the backward
    pass (activation checkpointing; gradients are unchanged).
    """

    def __init__(
        self, model: ModelSpec, *, layer_start: int, layer_end: int, layers: nn.ModuleDict
    ) -> None:
        super().__init__()
        self.model = model
        self.layer_start = layer_start
        self.layer_end = layer_end
        self.layers = layers
        self.recompute = Recompute.NONE
        # Set when the blocks are split over a tensor group (if sequence parallel, between
        # the part's first and last block: module docstring).
        self.tensor_group: TensorGroup | None = None

    @property
    def has_embedding(self) -> bool:
        return self.layer_start == 0

    @property
    def has_head(self) -> bool:
        return self.layer_end == self.model.num_layers

    def layer(self, index: int) -> nn.Module:
        """The module of global layer ``index`` (which this part must hold)."""
        return self.layers[str(index)]

    @property
    def layer_indices(self) -> range:
        return range(self.layer_start, self.layer_end)

    @property
    def block_indices(self) -> range:
        """The global indices of the part's blocks (empty: embedding or head only)."""
        return range(max(self.layer_start, 1), min(self.layer_end, self.model.arch.num_blocks + 1))

    def rope(self, x: torch.Tensor) -> Rope | None:
        """The rotary tables the part's Llama blocks share for input ``x`` ([b, s] or
        [b, s, h]); None for GPT-2 or a part without blocks."""
        arch = self.model.arch
        if arch.family is not Family.LLAMA or not self.block_indices:
            return None
        return rope_tables(
            seq_len=x.shape[1],
            head_dim=arch.resolved_head_dim,
            theta=arch.rope_theta,
            device=x.device,
            scaling=arch.rope_scaling,
        )

    def run_layer(self, index: int, x: torch.Tensor, rope: Rope | None) -> torch.Tensor:
        """Global layer ``index`` on ``x``: the embedding ([b, s] -> [b, s, h]), a block
        (recomputed in the backward pass as ``recompute`` says), or the head
        ([b, s, h] -> [b, s, V]). Sequence parallel, the part's first block takes the whole
        [b, s, h] and the others a chunk [b, s/t, h], and its last block returns the whole,
        the others a chunk."""
        arch = self.model.arch
        out: torch.Tensor
        if index == 0:
            out = self.layer(0)(x)
        elif index <= arch.num_blocks:
            block = self.layer(index)
            blocks = self.block_indices
            if index == blocks[0]:
                x = enter_sequence_chunks(x, self.tensor_group)
            # The cut and the gather stay outside the checkpoint: a recomputed block
            # keeps only its chunk.
            if self.recompute.checkpoints and torch.is_grad_enabled():
                out = checkpoint(
                    block,
                    x,
                    rope,
                    use_reentrant=False,
                    context_fn=(
                        selective_contexts
                        if self.recompute is Recompute.SELECTIVE
                        else noop_context_fn
                    ),
                )
            else:
                out = block(x, rope)
            if index == blocks[-1]:
                out = leave_sequence_chunks(out, self.tensor_group)
        else:
            out = self.layer(index)(x, output_weight=self._shared_embedding_weight())
        return out

    def parameters_used_by(self, index: int) -> tuple[nn.Parameter, ...]:
        """The parameters :meth:`run_layer` reads for layer ``index``: its own, and for a
        head that projects with the embedding's table, that table."""
        used = list(self.layer(index).parameters())
        shared = self._shared_embedding_weight() if index == self.model.num_layers - 1 else None
        if isinstance(shared, nn.Parameter) and all(p is not shared for p in used):
            used.append(shared)
        return tuple(used)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rope = self.rope(x)
        for index in self.layer_indices:
            x = self.run_layer(index, x, rope)  # [b, s, h]; logits [b, s, V] after the head
        return x

    def tied_parameters(self) -> tuple[TiedParameter, ...]:
        """The copies of tied weights in this part whose other copy lives on another stage.

        Empty unless the model ties its embeddings and this part holds exactly one of the
        embedding (layer 0) and the head (layer N+1): when it holds both, the head uses the
        embedding's parameter itself and autograd already sums the two gradients.
        """
        if not self.model.arch.tie_embeddings or self.has_embedding == self.has_head:
            return ()
        head_index = self.model.num_layers - 1
        if self.has_embedding:
            embedding = self.layer(0)
            assert isinstance(embedding, Embedding)
            weight = embedding.tok_embeddings.weight
            local_name, index, peer = EMBEDDING_WEIGHT_NAME, 0, head_index
        else:
            head = self.layer(head_index)
            assert isinstance(head, Head) and head.output is not None
            weight = head.output.weight
            local_name, index, peer = f"layers.{head_index}.output.weight", head_index, 0
        assert isinstance(weight, nn.Parameter)
        return (
            TiedParameter(
                canonical_name=EMBEDDING_WEIGHT_NAME,
                local_name=local_name,
                parameter=weight,
                layer_index=index,
                peer_layer_index=peer,
            ),
        )

    def _shared_embedding_weight(self) -> torch.Tensor | None:
        """The embedding table the head projects with, when it owns no weight of its own."""
        if self.model.arch.tie_embeddings and self.has_embedding:
            embedding = self.layer(0)
            assert isinstance(embedding, Embedding)
            return embedding.tok_embeddings.weight
        return None


def build_stage_part(
    model: ModelSpec,
    *,
    layer_start: int,
    layer_end: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> StagePart:
    """Build and initialise layers [layer_start, layer_end) of ``model``.

    Each layer is built on the meta device, materialised on the CPU, drawn in fp32 from the
    stream of (seed, layer index), then cast to ``dtype`` and moved to ``device`` one layer at a
    time (so peak host memory is one layer, and the values do not depend on the device).
    """
    if not 0 <= layer_start < layer_end <= model.num_layers:
        raise ValueError(
            f"layer range [{layer_start}, {layer_end}) of model {model.name!r} must satisfy "
            f"0 <= layer_start < layer_end <= num_layers ({model.num_layers})"
        )
    if seed < 0:
        raise ValueError(f"seed = {seed}; expected >= 0")
    arch = model.arch
    modules = nn.ModuleDict()
    for index in range(layer_start, layer_end):
        kind = model.layers[index].kind
        head_owns_output = not arch.tie_embeddings or layer_start > 0
        with torch.device("meta"):
            module = build_layer_module(arch, index, head_owns_output=head_owns_output)
        module = module.to_empty(device="cpu")
        init_layer(
            module,
            generator=layer_generator(seed=seed, layer_index=index),
            num_blocks=arch.num_blocks,
        )
        if kind is LayerKind.HEAD and arch.tie_embeddings and head_owns_output:
            _copy_embedding_init(module, seed=seed)
        modules[str(index)] = module.to(device=device, dtype=dtype)
    return StagePart(model, layer_start=layer_start, layer_end=layer_end, layers=modules)


@torch.no_grad()
def _copy_embedding_init(head: nn.Module, *, seed: int) -> None:
    """Give a tied head replica the embedding's initial table: the embedding draws its table
    first from the stream of layer 0 (models/embedding.py), so the same draw reproduces it."""
    assert isinstance(head, Head) and head.output is not None
    nn.init.normal_(
        head.output.weight,
        mean=0.0,
        std=INIT_STD,
        generator=layer_generator(seed=seed, layer_index=0),
    )
