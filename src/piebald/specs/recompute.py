"""How much of a block's forward the backward pass runs again: activation recomputation.

A stage's blocks either keep every activation their backward needs (``none``), or run
under activation checkpointing and keep only some (``selective``) or only their input
(``full``). The embedding and the head are never recomputed.

* ``none``: a block keeps what its eager kernels save (``specs.model`` gives the bytes).
* ``full``: a block keeps its input and runs its forward again in the backward (all of it
  up to its last matmul, below; Chen et al. 2016, "Training Deep Nets with Sublinear
  Memory Cost"; Korthikanti et al. 2022, section 5).
* ``selective``: a block keeps its input, the outputs of its attention kernel and of every
  other matrix multiply in the order it calls them (the first, third, fifth, ...), and
  recomputes the rest: the even-numbered matmuls and every memory-bound op (norms, rotary
  embeddings, the MLP's activation, residual adds). This is torchtitan's operator-level
  selective checkpointing policy (``activation_checkpoint.py``: the attention kernel's
  outputs saved, matmul outputs saved on alternate calls), which its published Llama runs
  used, so piebald can run and price the same thing. In a Llama block the matmuls run Q,
  K, V, O, gate, up, down: Q, V, gate and down are kept (q, kv, f and h values per token,
  the down projection's partial sums whole on every member of a tensor group) and K, O and
  up recomputed. In a GPT-2 block the fused QKV and the MLP's first layer are kept (3q and
  f values) and the attention's output projection recomputed (the MLP's second layer is
  not kept, and not run again either: below).

Under either checkpointing mode the backward reruns the forward only up to the block's last
matmul: torch stops recomputing once every saved tensor is back, so that matmul, the final
residual add and a tensor group's last collective do not run again. ``specs.model`` and
``specs.layer_ops`` hold the bytes kept and the work rerun; ``runtime.models.stage_part``
runs the modes, and tests count the runtime's kernels, FLOPs, kept bytes and collectives
against them (``tests/unit/specs/test_layer_ops.py``,
``tests/unit/runtime/models/test_selective_recompute.py``,
``tests/distributed/test_sequence_parallel.py``).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["RECOMPUTE_BY_FRUGALITY", "Recompute"]


class Recompute(StrEnum):
    """A stage's activation recomputation (module docstring)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"

    @property
    def checkpoints(self) -> bool:
        """Whether blocks run under activation checkpointing: they keep their input, and
        the backward runs (some of) their forward again."""
        return self is not Recompute.NONE


# From the most memory a block keeps to the least.
RECOMPUTE_BY_FRUGALITY = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
