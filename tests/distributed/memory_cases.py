"""Plans for checking the memory prediction against the runtime.

A state-heavy case: a 3.2 M-parameter Llama on four A100s (``STATE_HEAVY``, ``FOUR_A100``);
a small GPT-2 at any sequence length (``small_gpt2``).

Tensor-parallel plans (``tensor_parallel_plan``): a width-256 Llama or GPT-2 at 256 tokens
whose first stage (the embedding and the four blocks) is split two ways, sequence parallel
or not, and whose head sits alone on a third rank, so that the split stage's peak is its
blocks' backward, not the loss's.

Random plans (``random_plan``): 1-4 stages, every
ZeRO mode, every recompute mode, GPipe and 1F1B, uneven shards and micro-batch counts,
bf16 and fp16 GPUs mixed, ``tiny`` at full width with sequences of 32 or 128 tokens (some
plans dominated by the training state, others by activations).

``benchmarks/memory_prediction.py`` trains each for one emulated step and prints every
rank's measured peak against ``predicted_bytes``; ``test_memory_prediction.py`` requires
each within [0.75, 1.05].
"""

from __future__ import annotations

import dataclasses
import random

from dist_harness import StageSpec, make_plan

from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.plan import Plan, Schedule, ZeroMode
from piebald.specs.presets import PRESETS
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

FOUR_A100 = parse_cluster(
    {
        "name": "four-a100",
        "nodes": [{"name": "a", "gpu": "A100-80GB", "gpus_per_node": 4, "intra_link": "300GB/s"}],
    },
    source="memory_cases",
)
# Width 256, 4 blocks, vocabulary 512: about 3.2 M parameters, so with a few short
# sequences the training state outweighs the activations.
STATE_HEAVY = ModelSpec(
    name="llama-w256",
    arch=dataclasses.replace(
        PRESETS["tiny"],
        hidden_size=256,
        num_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=704,
        vocab_size=512,
        max_seq_len=64,
    ),
)

NUM_PLANS = 30
GPU_TYPES = ("A100-80GB", "V100-32GB", "T4")  # bf16, fp16, fp16
NUM_LAYERS = 6  # tiny: embedding, 4 blocks, head


def _split(total: int, parts: int, rng: random.Random) -> tuple[int, ...]:
    """``total`` as ``parts`` positive counts."""
    cuts = sorted(rng.sample(range(1, total), parts - 1))
    return tuple(b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True))


def _fractions(count: int, rng: random.Random) -> tuple[float, ...]:
    weights = [rng.uniform(0.5, 2.0) for _ in range(count)]
    return tuple(w / sum(weights) for w in weights)


def random_plan(rng: random.Random) -> Plan:
    num_stages = rng.randint(1, 4)
    schedule = rng.choice((Schedule.GPIPE, Schedule.ONE_F_ONE_B))
    widths = [rng.choice((1, 1, 2)) for _ in range(num_stages)]
    if num_stages == 1:
        widths = [rng.choice((2, 3))]
    num_gpus = sum(widths)
    gpu_types = sorted(rng.choice(GPU_TYPES) for _ in range(num_gpus))  # nodes of one type
    ranks = list(range(num_gpus))
    rng.shuffle(ranks)
    ends = [*sorted(rng.sample(range(1, NUM_LAYERS), num_stages - 1)), NUM_LAYERS]
    num_micro_batches = 6
    specs = []
    for width, end in zip(widths, ends, strict=True):
        members = tuple(ranks[:width])
        del ranks[:width]
        lockstep_allowed = num_stages == 1 or schedule is Schedule.GPIPE or width == 1
        modes = list(ZeroMode) if lockstep_allowed else [ZeroMode.NONE, ZeroMode.OPTIMIZER]
        zero = rng.choice(modes)
        if zero.per_pass or width == 1:
            counts = (num_micro_batches // width,) * width
        else:
            counts = _split(num_micro_batches, width, rng)
        sizes = None
        if num_stages == 1:  # one stage: each GPU its own micro-batch size
            sizes = tuple(rng.choice((1, 2)) for _ in range(width))
        specs.append(
            StageSpec(
                layer_end=end,
                ranks=members,
                num_micro_batches=counts,
                fractions=(1 / width,) * width if zero is ZeroMode.NONE else _fractions(width, rng),
                zero=zero,
                micro_batch_sizes=sizes,
                recompute=tuple(Recompute)[int(rng.random() * len(Recompute))],
            )
        )
    return make_plan(
        specs,
        num_gpus=num_gpus,
        tied=rng.random() < 0.5,
        schedule=schedule,
        gpu_types=gpu_types,
        seq_len=rng.choice((32, 128)),
    )


def small_gpt2(*, max_seq_len: int, name: str) -> ModelSpec:
    """A small GPT-2 (2 blocks of width 64, 4 heads): fused QKV, biases everywhere, learned
    positions, tied head."""
    arch = ModelArch(
        family=Family.GPT2,
        num_blocks=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=4,
        ffn_hidden_size=256,
        vocab_size=256,
        max_seq_len=max_seq_len,
        tie_embeddings=True,
    )
    return ModelSpec(name=name, arch=arch)


TP_SEQ_LEN = 256
GPT2_W256 = ModelSpec(
    name="gpt2-w256",
    arch=ModelArch(
        family=Family.GPT2,
        num_blocks=4,
        hidden_size=256,
        num_heads=4,
        num_kv_heads=4,
        ffn_hidden_size=1024,
        vocab_size=512,
        max_seq_len=TP_SEQ_LEN,
        tie_embeddings=False,
    ),
)
LLAMA_W256 = ModelSpec(
    name="llama-w256",
    arch=dataclasses.replace(STATE_HEAVY.arch, max_seq_len=TP_SEQ_LEN, tie_embeddings=False),
)


def tensor_parallel_plan(
    model: ModelSpec,
    *,
    layout: TensorLayout,
    recompute: Recompute,
    zero: ZeroMode = ZeroMode.OPTIMIZER,
) -> Plan:
    """Stage 0 (embedding and blocks) at TP 2 in ``layout`` under ``zero`` on two A100s,
    stage 1 (the head) on a third; GPipe (so ZeRO-2/3 may run), four micro-batches of two
    sequences."""
    return make_plan(
        [
            StageSpec(
                layer_end=5,
                ranks=(0, 1),
                num_micro_batches=(4, 4),
                fractions=(0.5, 0.5),
                micro_batch_sizes=(2, 2),
                zero=zero,
                recompute=recompute,
                tensor_parallel_degree=2,
                tensor_layout=layout,
            ),
            StageSpec(
                layer_end=6,
                ranks=(2,),
                num_micro_batches=(4,),
                fractions=(1.0,),
                micro_batch_sizes=(2,),
            ),
        ],
        num_gpus=3,
        model=model,
        seq_len=TP_SEQ_LEN,
        schedule=Schedule.GPIPE,
        tied=False,
    )
