"""benchmarks/published.yaml still builds: every point's GPU is in the catalog, every model
and job is one piebald plans, and the GPT-2-shaped models have the parameters transformers
gives the same shapes (so benchmarks/published.py cannot rot silently)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from piebald.specs.job import check_job_fits_model
from piebald.specs.plan import ZeroMode
from published_points import (
    PublishedPoint,
    build_cluster,
    build_job,
    build_model,
    catalog_gpu_name,
    load_points,
    nic_gbit_per_node,
    plan_choice,
    tensor_parallel_degree,
)

POINTS = load_points()
IDS = [point.point_id for point in POINTS]


@pytest.mark.parametrize("point", POINTS, ids=IDS)
def test_gpu_type_is_in_the_catalog_and_the_cluster_builds(point: PublishedPoint) -> None:
    assert catalog_gpu_name(point.gpu_name) is not None, point.gpu_name
    cluster, _ = build_cluster(point)
    assert cluster.num_gpus == point.num_gpus
    assert {g.device.name for g in cluster.gpus} == {catalog_gpu_name(point.gpu_name)}
    assert all(group.gpus_per_node == point.gpus_per_node for group in cluster.node_groups)


@pytest.mark.parametrize("point", POINTS, ids=IDS)
def test_model_and_job_build(point: PublishedPoint) -> None:
    model, _ = build_model(point)
    job = build_job(point)
    check_job_fits_model(job, model)
    assert job.tokens_per_step == point.global_batch * point.seq_len


def test_nic_rates_read_from_the_free_text() -> None:
    by_id = {point.point_id: point for point in POINTS}
    # "400 Gb/s per GPU" on 8-GPU nodes; "1600 Gb/s node-node (8x200 Gb/s)"; "8x 200 Gb/s".
    assert nic_gbit_per_node(by_id["tt-8b-128gpu-fsdp-eager"]) == (3200.0, None)
    assert nic_gbit_per_node(by_id["mpt-7b-8xa100-80"]) == (1600.0, None)
    assert nic_gbit_per_node(by_id["meg21-7.5b-128xa100"]) == (1600.0, None)
    rate, note = nic_gbit_per_node(by_id["tt-a100-70b-64gpu-fsdp"])  # "not stated"
    assert note is not None and str(int(rate)) in note


def test_strategy_follows_the_parallelism() -> None:
    by_id = {point.point_id: point for point in POINTS}
    assert tensor_parallel_degree(by_id["tt-8b-64gpu-2d-bf16"]) == 8
    assert tensor_parallel_degree(by_id["megcore-7.1b-96xh100"]) == 2
    assert tensor_parallel_degree(by_id["mpt-7b-8xh100"]) == 1  # "no TP/PP"
    fsdp = plan_choice(by_id["tt-a100-8b-64gpu-fsdp"])
    assert (fsdp.strategy, fsdp.zero) == ("zero-even", ZeroMode.FULL)
    zero1 = plan_choice(by_id["llmc-gpt2-124m-8xa100"])
    assert (zero1.strategy, zero1.zero) == ("zero-even", ZeroMode.OPTIMIZER)


@pytest.mark.slow
def test_gpt2_shaped_models_match_transformers_parameter_counts() -> None:
    """Oracles: transformers' GPT-2 with the same shape (exactly: piebald's GPT-2 family),
    and MPT itself for the MPT points, whose count differs by exactly what GPT-2 has and
    MPT (no_bias, ALiBi) has not: learned positions and biases."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for point in POINTS:
        if point.model_arch is None:
            continue
        model, _ = build_model(point)
        arch = model.arch
        with torch.device("meta"):
            gpt2 = transformers.GPT2LMHeadModel(
                transformers.GPT2Config(
                    n_embd=arch.hidden_size,
                    n_layer=arch.num_blocks,
                    n_head=arch.num_heads,
                    n_inner=arch.ffn_hidden_size,
                    vocab_size=arch.vocab_size,
                    n_positions=arch.max_seq_len,
                    tie_word_embeddings=arch.tie_embeddings,
                )
            )
        assert model.num_params == sum(p.numel() for p in gpt2.parameters()), point.point_id
        if point.point_id.startswith("mpt-"):
            with torch.device("meta"):
                mpt = transformers.MptForCausalLM(
                    transformers.MptConfig(
                        d_model=arch.hidden_size,
                        n_heads=arch.num_heads,
                        n_layers=arch.num_blocks,
                        expansion_ratio=arch.ffn_hidden_size // arch.hidden_size,
                        vocab_size=arch.vocab_size,
                        max_seq_len=point.seq_len,
                        no_bias=True,
                    )
                )
            h, f = arch.hidden_size, arch.ffn_hidden_size
            # Per block: biases on Q, K, V, the output, fc and proj (3h + h + f + h) and
            # the two LayerNorms' (2h); the final LayerNorm's (h); the position table.
            gpt2_only = arch.num_blocks * (7 * h + f) + h + arch.max_seq_len * h
            mpt_params = sum(p.numel() for p in mpt.parameters())
            assert model.num_params == mpt_params + gpt2_only, point.point_id


def test_a_missing_gpu_type_is_reported_not_planned() -> None:
    from published import predict

    by_id = {point.point_id: point for point in POINTS}
    missing = predict(dataclasses.replace(by_id["mpt-7b-8xa100-80"], gpu_name="B300"))
    assert missing.predicted_tokens_per_s_per_gpu is None
    assert missing.why_none is not None and "'B300'" in missing.why_none


def test_a_tensor_parallel_point_is_planned_in_its_own_layout() -> None:
    from published import predict

    by_id = {point.point_id: point for point in POINTS}
    tp = predict(by_id["megcore-7.1b-96xh100"])  # TP 2 x PP 1 x DP 48
    assert tp.predicted_tokens_per_s_per_gpu is not None, tp.why_none
    # --tp-comm-overlap needs --sequence-parallel: priced in the layout the run had.
    assert "TP 2 (vocabulary-sequence), zero optimizer: 1 stage(s)" in tp.plan_summary


def test_unknown_point_id_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from published import main

    assert main(["--points", "mpt-7b-8xa100-80,no-such-point"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--points" in err and "no-such-point" in err
