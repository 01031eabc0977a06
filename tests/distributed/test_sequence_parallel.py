"""The autograd functions of tensor parallelism (``models.tensor_ops``) on gloo ranks, with
and without sequence parallelism: a block in miniature (norm, two column-parallel layers,
a row-parallel one with a bias, the residual add, the stage's cut into chunks and gather
back) gives every rank the whole output and whole input gradient of the same block
computed in one process, the replicated weights' gradients summed over the group and the
split weights' the reference's slices; RMSNorm and LayerNorm, over 2 and 4 ranks
(sequence_parallel_workers.py)."""

from __future__ import annotations

import pytest
import sequence_parallel_workers
from dist_harness import run_ranks

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_block_equals_the_whole_computation(world_size: int) -> None:
    run_ranks(sequence_parallel_workers.sequence_parallel_block, world_size)


def test_a_split_block_keeps_its_share_of_the_activations() -> None:
    """Llama and GPT-2 blocks, fp32 and bf16, with and without recompute: what a TP 2
    member's block saves for the backward, per row, is half of the unsplit block's."""
    run_ranks(sequence_parallel_workers.block_keeps_its_share, 2)


def test_a_recomputed_split_block_reruns_and_keeps_what_the_cost_model_says() -> None:
    """Llama and GPT-2 blocks at TP 2, sequence parallel and not: under full and selective
    recompute the backward runs again all but the last of the forward's collectives, and
    under selective a member keeps exactly the bytes ``ModelSpec.layers_at`` gives."""
    run_ranks(sequence_parallel_workers.recomputed_block_on_a_tensor_group, 2)
