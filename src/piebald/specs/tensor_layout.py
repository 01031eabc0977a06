"""What a tensor group splits besides its blocks' attention heads and MLP width.

Every tensor-parallel layout splits a block's heads and MLP width t ways (Megatron-LM,
Shoeybi et al. 2019, section 3). Systems differ in what else they split, and that decides
how much of a rank's work shrinks with t:

* ``blocks``: only that. The embedding, the final norm, the LM head and its loss, and
  everything on a block's hidden width (norms, residual adds) run whole on every member.
  piebald's runtime runs it (``runtime.models.tensor_parallel``), for plans that say it.
* ``vocabulary``: also the embedding and the LM head over the vocabulary, with the loss
  computed on each member's slice of the logits (Megatron-LM's ``VocabParallelEmbedding``
  and parallel cross-entropy, Shoeybi et al. 2019 section 3; torchtitan's row-parallel
  embedding and column-parallel output with ``loss_parallel``). The embedding's output and
  the head's input gradient are partial sums: one all-reduce each per pass.
* ``sequence``: also the norms and residual adds (and dropout), each member on 1/t of the
  tokens (sequence parallelism, Korthikanti et al. 2022, section 4.2.2). Each block
  all-reduce becomes a reduce-scatter and an all-gather of the same bytes; the stage's
  sequence is made whole at its edges (``cost.tensor_comm``). The embedding and head stay
  whole, as under ``blocks``. The layout piebald's planner makes and its runtime runs
  (``runtime.models.tensor_ops``).
* ``vocabulary-sequence``: both (Megatron-Core's ``--sequence-parallel``, which
  ``--tp-comm-overlap`` requires; torchtitan's ``SequenceParallel`` norms with its
  vocabulary-parallel embedding and output).

The cost model prices any of them (``ModelSpec.layers_at``, ``cost.tensor_comm``); the
runtime runs ``sequence`` and ``blocks`` and refuses the vocabulary layouts before it
starts (``runtime.training.plan_support``). Those are in the plan so that runs of other
systems can be priced as they ran (benchmarks/published.py).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TensorLayout"]


class TensorLayout(StrEnum):
    """What a tensor group splits besides its blocks' heads and MLP (module docstring)."""

    BLOCKS = "blocks"
    VOCABULARY = "vocabulary"
    SEQUENCE = "sequence"
    VOCABULARY_SEQUENCE = "vocabulary-sequence"

    @property
    def splits_vocabulary(self) -> bool:
        """Whether the embedding and the LM head (and its loss) are split over the
        vocabulary."""
        return self in (TensorLayout.VOCABULARY, TensorLayout.VOCABULARY_SEQUENCE)

    def vocabulary_rows(self, *, vocab_size: int, degree: int) -> int:
        """The rows of the embedding and head (and the logits per token) one member of a
        group of ``degree`` holds: ceil(V / t) where the vocabulary is split (padded to a
        multiple of t, as Megatron-LM pads it), V where it is not."""
        return -(-vocab_size // degree) if self.splits_vocabulary else vocab_size

    @property
    def splits_sequence(self) -> bool:
        """Whether the hidden-width ops (norms, residual adds) run on 1/t of the tokens."""
        return self in (TensorLayout.SEQUENCE, TensorLayout.VOCABULARY_SEQUENCE)
