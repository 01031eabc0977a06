"""Closed-form plan estimate against oracles: the pipeline bubble, one GPU, data parallel.

The model is a small Llama whose head costs exactly one block: with h = 64, q width 64,
kv width 32, f = 128 and s = 32 a block does 2 x 36864 + 4 x 32 x 64 = 81920 FLOPs per
token, and a head over V = 640 does 2 x 640 x 64 = 81920 too; the embedding lookup is a
memory-bound gather costing EMBEDDING_S. So a pipeline whose stages hold [embedding,
block], [block], ..., [head] has identical stages but for the first one's EMBEDDING_S per
micro-batch, and its makespan is (m + p - 1) t + m EMBEDDING_S (Huang et al. 2019).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from cluster_builders import ROUND_GPU, hand_model
from piebald.cost.comm import BUS_EFFICIENCY, Collective, collective_time_s
from piebald.cost.compute import EfficiencyCurve, PassKind
from piebald.cost.pass_shape import PassShape
from piebald.cost.plan_estimate import estimate_plan, model_flops_utilization
from piebald.cost.step_model import Bottleneck
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.model import LayerKind, LayerSpec
from piebald.specs.plan import Plan, Stage, ZeroMode

SEQ_LEN = 32
MICRO_BATCH = 2
# One block (or the head) on the 1 TFLOP/s device for 64 tokens: 81920 x 64 FLOPs at
# 0.5 TFLOP/s = c; forward c + 10 us, backward 2c + 10 us (all compute-bound).
C_S = 81920 * 64 / 0.5e12
LAYER_S = (C_S + 1e-5) + (2 * C_S + 1e-5)
# The embedding reads and writes one 2h = 128-byte row per token (64 tokens) at 1 TB/s;
# backward moves twice that; one launch constant each.
EMBEDDING_BYTES = 2 * 128 * 64
EMBEDDING_S = (EMBEDDING_BYTES / 1e12 + 1e-5) + (2 * EMBEDDING_BYTES / 1e12 + 1e-5)
PEAK = 1e12
# Parameters: embedding V h = 40960; block 36864 + 2h = 36992; head h + V h = 41024.
EMBEDDING_PARAMS, BLOCK_PARAMS, HEAD_PARAMS = 40960, 36992, 41024


@dataclass(frozen=True, slots=True, kw_only=True)
class _FlopsCurve(EfficiencyCurve):
    """Layer times as measured: FLOPs at half the peak plus 10 us a pass, the embedding's
    bytes at the full bandwidth. These tests check how the estimate composes layer times
    into a step; ``tests/unit/cost/test_compute.py`` checks the analytic layer times."""

    def measured_time_s(
        self, layer: LayerSpec, *, shape: PassShape, kind: PassKind
    ) -> float | None:
        work = {PassKind.FORWARD: 1.0, PassKind.BACKWARD: 2.0, PassKind.BACKWARD_RECOMPUTE: 3.0}
        passes = 2 if kind is PassKind.BACKWARD_RECOMPUTE else 1
        if layer.kind is LayerKind.EMBEDDING:
            moved = 2 * layer.output_bytes_per_token * shape.num_tokens
            return work[kind] * moved / PEAK + passes * 1e-5  # a 1 TB/s device
        flops = layer.forward_flops_per_token(seq_len=shape.seq_len) * shape.num_tokens
        return work[kind] * flops / (0.5 * PEAK) + passes * 1e-5


CURVE = _FlopsCurve(max_fraction=0.5, bandwidth_fraction=1.0)


def _cluster(
    num_gpus: int, *, intra_link: str = "100GB/s", intra_latency: str = "5us", gpu: str = "round"
) -> ClusterSpec:
    data: dict[str, Any] = {
        "name": "one-node",
        "gpu_types": [ROUND_GPU],
        "nodes": [
            {
                "name": "n",
                "gpu": gpu,
                "gpus_per_node": num_gpus,
                "intra_link": intra_link,
                "intra_latency": intra_latency,
            }
        ],
    }
    return parse_cluster(data, source="test")


def _one_stage_plan(
    cluster: ClusterSpec,
    *,
    num_micro_batches: tuple[int, ...],
    shard_fraction: tuple[float, ...] | None = None,
    zero: ZeroMode = ZeroMode.NONE,
    num_blocks: int = 3,
) -> Plan:
    model = hand_model(num_blocks)
    ranks = tuple(range(len(num_micro_batches)))
    job = JobSpec(global_batch_size=MICRO_BATCH * sum(num_micro_batches), seq_len=SEQ_LEN)
    routes = tuple((rank,) for rank in ranks for _ in range(num_micro_batches[rank]))
    stage = Stage(
        layer_start=0,
        layer_end=model.num_layers,
        ranks=ranks,
        micro_batch_size=(MICRO_BATCH,) * len(ranks),
        num_micro_batches=num_micro_batches,
        shard_fraction=shard_fraction or (1.0 / len(ranks),) * len(ranks),
        zero=zero,
    )
    return Plan(cluster=cluster, model=model, job=job, stages=(stage,), routes=routes)


def test_the_head_costs_exactly_one_block() -> None:
    model = hand_model(1)
    block, head = model.layers[1], model.layers[2]
    assert block.forward_flops_per_token(seq_len=SEQ_LEN) == 81920
    assert head.forward_flops_per_token(seq_len=SEQ_LEN) == 81920


@pytest.mark.parametrize("num_stages", [2, 3, 5])
@pytest.mark.parametrize("num_micro_batches", [1, 4, 8])
def test_uniform_pipeline_makespan_is_m_plus_p_minus_one_stage_times(
    num_stages: int, num_micro_batches: int
) -> None:
    p, m = num_stages, num_micro_batches
    model = hand_model(num_blocks=p - 1)  # layers: embedding, p - 1 blocks, head
    # One node, a near-free interconnect: 1 PB/s and no latency.
    cluster = _cluster(p, intra_link="1PB/s", intra_latency="0s")
    bounds = [0, *range(2, p + 2)]  # [0, 2), [2, 3), ..., [p, p + 1)
    stages = tuple(
        Stage(
            layer_start=bounds[i],
            layer_end=bounds[i + 1],
            ranks=(i,),
            micro_batch_size=(MICRO_BATCH,),
            num_micro_batches=(m,),
            shard_fraction=(1.0,),
        )
        for i in range(p)
    )
    plan = Plan(
        cluster=cluster,
        model=model,
        job=JobSpec(global_batch_size=m * MICRO_BATCH, seq_len=SEQ_LEN),
        stages=stages,
        routes=tuple(tuple(range(p)) for _ in range(m)),
    )
    estimate = estimate_plan(plan, curve=CURVE)
    # Every stage is busy m x t for the same t, one block's forward plus backward; the
    # first also gathers the embedding.
    busy = [stage.compute_s[rank] for rank, stage in enumerate(estimate.stages)]
    expected_busy = [m * (LAYER_S + EMBEDDING_S)] + [m * LAYER_S] * (p - 1)
    assert busy == pytest.approx(expected_busy, rel=1e-12)
    # Each activation hop (64 tokens x h x 2 B there, gradient back) is negligible here.
    hop_s = 2 * (MICRO_BATCH * SEQ_LEN * 64 * 2) / 1e15
    assert hop_s < 1e-6 * LAYER_S
    assert estimate.pipeline_s == pytest.approx((m + p - 1) * LAYER_S + m * EMBEDDING_S, rel=1e-6)
    # The bubble of the equal stages: (p - 1) / (m + p - 1) of the block-only pipeline.
    blocks_only_s = estimate.pipeline_s - m * EMBEDDING_S
    bubble = (blocks_only_s - m * LAYER_S) / blocks_only_s
    assert bubble == pytest.approx((p - 1) / (m + p - 1), rel=1e-5, abs=1e-9)
    # No data parallelism, so no sync; then the slowest optimizer step (stage 0's
    # embedding and block) at 30 B per parameter over 1 TB/s.
    assert estimate.exposed_sync_s == 0.0
    optimizer_s = (EMBEDDING_PARAMS + BLOCK_PARAMS) * 30 / 1e12
    assert estimate.step_time_s == pytest.approx(estimate.pipeline_s + optimizer_s, rel=1e-12)


@pytest.mark.parametrize("num_micro_batches", [1, 4])
def test_the_bottleneck_stages_own_hop_is_part_of_the_fill_and_drain(
    num_micro_batches: int,
) -> None:
    """Stage 0 (embedding, two blocks) is the bottleneck; its last micro-batch must still
    cross the 1 GB/s link to the head's stage and its gradient must come back."""
    m = num_micro_batches
    model = hand_model(num_blocks=2)
    cluster = _cluster(2, intra_link="1GB/s", intra_latency="5us")
    job = JobSpec(global_batch_size=m * MICRO_BATCH, seq_len=SEQ_LEN)
    stages = tuple(
        Stage(
            layer_start=start,
            layer_end=end,
            ranks=(rank,),
            micro_batch_size=(MICRO_BATCH,),
            num_micro_batches=(m,),
            shard_fraction=(1.0,),
        )
        for rank, (start, end) in enumerate([(0, 3), (3, 4)])
    )
    plan = Plan(cluster=cluster, model=model, job=job, stages=stages, routes=((0, 1),) * m)
    estimate = estimate_plan(plan, curve=CURVE)
    hop_s = 2 * (5e-6 + MICRO_BATCH * SEQ_LEN * 64 * 2 / 1e9)  # activation there, gradient back
    first_s = 2 * LAYER_S + EMBEDDING_S
    assert estimate.bottleneck == Bottleneck(stage_index=0, link=False)
    assert str(estimate.bottleneck) == "stage 0"
    assert estimate.pipeline_s == pytest.approx(m * first_s + hop_s + LAYER_S, rel=1e-9)


def test_one_gpu_step_is_m_passes_plus_the_optimizer_step() -> None:
    plan = _one_stage_plan(_cluster(1), num_micro_batches=(4,))
    estimate = estimate_plan(plan, curve=CURVE)
    # A micro-batch: the embedding gather, then 3 blocks and the head, each LAYER_S.
    params = EMBEDDING_PARAMS + 3 * BLOCK_PARAMS + HEAD_PARAMS  # 192960
    assert plan.model.num_params == params
    assert estimate.pipeline_s == pytest.approx(4 * (4 * LAYER_S + EMBEDDING_S), rel=1e-12)
    assert estimate.exposed_sync_s == 0.0
    assert estimate.step_time_s == pytest.approx(
        4 * (4 * LAYER_S + EMBEDDING_S) + params * 30 / 1e12, rel=1e-12
    )
    assert estimate.bottleneck == Bottleneck(stage_index=0, link=False)
    assert str(estimate.bottleneck) == "stage 0"


def test_second_gpu_in_data_parallel_adds_one_all_reduce() -> None:
    cluster = _cluster(2)
    plan = _one_stage_plan(cluster, num_micro_batches=(2, 2))
    estimate = estimate_plan(plan, curve=CURVE)
    params = 192960
    # Gradients all-reduced in 16 bits over a 2-ring at 100 GB/s (at NCCL's bus efficiency
    # E), 5 us: 2 x 1 x (5 us + 2 P / (2 x 1e11 x E)).
    all_reduce_s = 2 * (5e-6 + 2 * params / (2 * 1e11 * BUS_EFFICIENCY))
    assert all_reduce_s == pytest.approx(
        collective_time_s(
            Collective.ALL_REDUCE, num_bytes=2 * params, ranks=[0, 1], cluster=cluster
        ),
        rel=1e-12,
    )
    assert estimate.stages[0].sync_s == pytest.approx(all_reduce_s, rel=1e-12)
    assert estimate.exposed_sync_s == pytest.approx(all_reduce_s, rel=1e-12)
    expected = 2 * (4 * LAYER_S + EMBEDDING_S) + all_reduce_s + params * 30 / 1e12
    assert estimate.step_time_s == pytest.approx(expected, rel=1e-12)


def test_optimizer_sharding_prices_uneven_collectives_and_owned_state() -> None:
    cluster = _cluster(2)
    plan = _one_stage_plan(
        cluster, num_micro_batches=(2, 2), shard_fraction=(0.75, 0.25), zero=ZeroMode.OPTIMIZER
    )
    estimate = estimate_plan(plan, curve=CURVE)
    params = 192960
    # Reduce-scatter then all-gather, each padded to 2 x 0.75 x 2P bytes over the 2-ring.
    one_pass_s = 5e-6 + (2 * 0.75 * 2 * params) / (2 * 1e11 * BUS_EFFICIENCY)
    # The larger owner updates 3/4 of the parameters.
    optimizer_s = 0.75 * params * 30 / 1e12
    assert estimate.stages[0].sync_s == pytest.approx(2 * one_pass_s, rel=1e-12)
    assert estimate.stages[0].optimizer_s == pytest.approx(optimizer_s, rel=1e-12)
    expected = 2 * (4 * LAYER_S + EMBEDDING_S) + 2 * one_pass_s + optimizer_s
    assert estimate.step_time_s == pytest.approx(expected, rel=1e-12)


def test_tokens_per_second_is_tokens_per_step_over_step_time() -> None:
    plan = _one_stage_plan(_cluster(2), num_micro_batches=(3, 1))
    estimate = estimate_plan(plan, curve=CURVE)
    tokens_per_step = 4 * MICRO_BATCH * SEQ_LEN  # 256
    assert estimate.tokens_per_s == pytest.approx(tokens_per_step / estimate.step_time_s)
    # The rank with 3 micro-batches sets the pace.
    assert estimate.pipeline_s == pytest.approx(3 * (4 * LAYER_S + EMBEDDING_S), rel=1e-12)
    prediction = estimate.prediction()
    assert prediction.step_time_s == estimate.step_time_s
    assert prediction.tokens_per_s == estimate.tokens_per_s
    assert set(prediction.peak_memory_bytes) == {0, 1}


def test_model_flops_utilization_closed_form() -> None:
    plan = _one_stage_plan(_cluster(2), num_micro_batches=(2, 2))
    # 3 x forward: 3 x (0 + 3 x 81920 + 81920) = 983040 FLOPs per token; two 1 TFLOP/s GPUs.
    assert model_flops_utilization(plan, tokens_per_s=1000.0) == pytest.approx(
        983040 * 1000 / 2e12, rel=1e-12
    )


def test_model_flops_utilization_counts_only_used_gpus() -> None:
    plan = _one_stage_plan(_cluster(2), num_micro_batches=(4,))
    assert plan.idle_ranks == (1,)
    assert model_flops_utilization(plan, tokens_per_s=1000.0) == pytest.approx(
        983040 * 1000 / 1e12, rel=1e-12
    )


def test_model_flops_utilization_uses_the_peak_of_the_training_dtype() -> None:
    # A T4 has no bf16: a bf16 job trains in fp16 at its 65 TFLOP/s dense peak.
    plan = _one_stage_plan(_cluster(1, gpu="T4"), num_micro_batches=(4,))
    assert model_flops_utilization(plan, tokens_per_s=1000.0) == pytest.approx(
        983040 * 1000 / 65e12, rel=1e-12
    )
