"""Bounded input: every number a
user gives has a limit that is checked before anything is allocated, the cost model never
wraps, YAML aliases and JSON nesting are bounded, and each mistake is one line."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from cli_runner import run_cli
from piebald.cost.memory import prefix_sums, rank_memory, stage_params_matrix
from piebald.cost.pass_shape import PassShape
from piebald.errors import SpecError
from piebald.examples import example_path
from piebald.profiler.db import load_profile_db
from piebald.specs import limits
from piebald.specs.cluster_yaml import load_cluster, parse_cluster
from piebald.specs.devices import Dtype
from piebald.specs.hf_config import arch_from_hf_config
from piebald.specs.job import JobSpec, Optimizer
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.plan_io import load_plan
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute
from piebald.specs.yaml_bounded import expanded_size, safe_load_bounded

HF = Path(__file__).parents[2] / "data" / "hf"


def _one_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def _plan_args(*, batch: str = "8", seq: str = "64", model: str = "tiny") -> list[str]:
    return [
        "plan", "--cluster", str(example_path()), "--model", model,
        "--global-batch", batch, "--seq-len", seq,
    ]  # fmt: skip


def _llama_config(tmp_path: Path, **changes: object) -> Path:
    config = json.loads((HF / "llama-3-8b" / "config.json").read_text())
    config.update(changes)
    directory = tmp_path / "model"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def plan_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    code, output = run_cli(*_plan_args(), "--out", str(out))
    assert code == 0, output
    data: dict[str, object] = json.loads(out.read_text())
    return data


# -- limits (findings 14, 17) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "limit"),
    [
        ("--global-batch", str(10**7), limits.MAX_GLOBAL_BATCH),
        ("--global-batch", str(10**30), limits.MAX_GLOBAL_BATCH),
        ("--seq-len", str(10**30), limits.MAX_SEQ_LEN),
    ],
)
def test_flags_over_their_limit_are_one_line_before_any_work(
    flag: str, value: str, limit: int
) -> None:
    """Finding 14: --global-batch 10^7 ran for minutes, 10^12 was a MemoryError and 10^30
    an OverflowError traceback."""
    args = _plan_args(
        batch=value if flag == "--global-batch" else "8",
        seq=value if flag == "--seq-len" else "64",
    )
    started = time.perf_counter()
    code, output = run_cli(*args)
    assert time.perf_counter() - started < 10
    assert code == 2
    line = _one_line(output)
    assert flag in line and value in line and f"at most {limit}" in line


def test_train_flags_over_their_limit_are_one_line() -> None:
    code, output = run_cli(
        "train", "--model", "tiny", "--global-batch", str(10**12), "--seq-len", "16"
    )
    assert code == 2
    assert f"at most {limits.MAX_GLOBAL_BATCH}" in _one_line(output)


def test_limits_are_the_largest_values_accepted() -> None:
    """At the limit is accepted, one past it refused, in the specs themselves."""
    JobSpec(global_batch_size=limits.MAX_GLOBAL_BATCH, seq_len=limits.MAX_SEQ_LEN)
    with pytest.raises(ValueError, match="global batch"):
        JobSpec(global_batch_size=limits.MAX_GLOBAL_BATCH + 1, seq_len=8)
    with pytest.raises(ValueError, match="sequence length"):
        JobSpec(global_batch_size=1, seq_len=limits.MAX_SEQ_LEN + 1)
    _max_arch()
    with pytest.raises(ValueError, match="hidden_size"):
        _max_arch(hidden_size=limits.MAX_HIDDEN_SIZE + 2)
    with pytest.raises(ValueError, match="num_blocks"):
        _max_arch(num_blocks=limits.MAX_NUM_BLOCKS + 1)
    with pytest.raises(ValueError, match="head_dim"):
        _max_arch(head_dim=limits.MAX_HEAD_DIM + 2)


@pytest.mark.parametrize(
    ("section", "field", "value", "limit"),
    [
        ("job", "seq_len", 10**30, limits.MAX_SEQ_LEN),
        ("job", "global_batch_size", 10**12, limits.MAX_GLOBAL_BATCH),
        ("job", "seed", 10**30, limits.MAX_SEED),
        ("model", "hidden_size", 2**40, limits.MAX_HIDDEN_SIZE),
        ("model", "vocab_size", 2**40, limits.MAX_VOCAB_SIZE),
        ("model", "num_blocks", 10**6, limits.MAX_NUM_BLOCKS),
    ],
)
@pytest.mark.slow
def test_plan_values_over_their_limit_are_one_line(
    tmp_path: Path,
    plan_data: dict[str, object],
    section: str,
    field: str,
    value: int,
    limit: int,
) -> None:
    """Finding 17: job.seq_len 10^30 explained as a 2.3e50 s step; model.hidden_size 2^40
    an OverflowError traceback in training."""
    data = json.loads(json.dumps(plan_data))
    data[section][field] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    code, output = run_cli("explain", str(path))
    assert code == 2
    line = _one_line(output)
    assert f"{section}.{field}" in line and f"at most {limit}" in line and str(path) in line


def test_cluster_gpus_per_node_and_count_are_bounded(tmp_path: Path) -> None:
    for group, limit in (
        ({"gpus_per_node": 65}, limits.MAX_GPUS_PER_NODE),
        ({"gpus_per_node": 8, "count": 10**9}, limits.MAX_GPUS),
    ):
        node = {"name": "n", "gpu": "A100-80GB", "intra_link": "600GB/s", **group}
        with pytest.raises(SpecError, match=f"at most {limit}"):
            parse_cluster({"name": "c", "nodes": [node]}, source="c.yaml")


# -- no integer overflow (finding 15) -----------------------------------------------------


def _max_arch(**changes: int) -> ModelArch:
    sizes = dict(
        num_blocks=limits.MAX_NUM_BLOCKS,
        hidden_size=limits.MAX_HIDDEN_SIZE,
        num_heads=limits.MAX_NUM_HEADS,
        num_kv_heads=limits.MAX_NUM_HEADS,
        head_dim=limits.MAX_HEAD_DIM,
        ffn_hidden_size=limits.MAX_FFN_HIDDEN_SIZE,
        vocab_size=limits.MAX_VOCAB_SIZE,
        max_seq_len=limits.MAX_SEQ_LEN,
    )
    sizes.update(changes)
    return ModelArch(family=Family.LLAMA, tie_embeddings=False, **sizes)


def test_hidden_size_two_to_the_thirty_is_refused_in_one_line(tmp_path: Path) -> None:
    """Finding 15: hidden_size = intermediate_size = 2^30 gave a negative peak memory and
    exit 0 (np.cumsum wrapped in int64); it is now over the limit."""
    model = _llama_config(tmp_path, hidden_size=2**30, intermediate_size=2**30)
    code, output = run_cli(*_plan_args(model=str(model)))
    assert code == 2
    line = _one_line(output)
    assert "hidden_size" in line and f"at most {limits.MAX_HIDDEN_SIZE}" in line


def test_largest_model_within_the_limits_prices_exact_positive_memory() -> None:
    """Finding 15 at the limits: the parameter count is the closed form (Python ints, no
    wrap), the cost model's float64 range sums agree with it, and memory is positive."""
    arch = _max_arch()
    h, f, v = arch.hidden_size, arch.ffn_hidden_size, arch.vocab_size
    q = kv = arch.num_heads * arch.head_dim
    block = 2 * h * q + 2 * h * kv + 3 * h * f + 2 * h  # weights and two RMSNorms
    expected = v * h + arch.num_blocks * block + (h + v * h)
    assert expected * 16 < 2**63  # the bound specs/limits.py states
    model = ModelSpec(name="max", arch=arch)
    assert model.num_params == expected
    assert stage_params_matrix(model)[0, model.num_layers] == pytest.approx(
        float(expected), rel=1e-12
    )
    memory = rank_memory(
        model,
        layer_start=0,
        layer_end=model.num_layers,
        shape=PassShape(
            device=load_cluster(example_path()).device_of(0),
            dtype=Dtype.BF16,
            micro_batch_size=limits.MAX_GLOBAL_BATCH,
            seq_len=limits.MAX_SEQ_LEN,
            recompute=Recompute.NONE,
        ),
        optimizer=Optimizer.ADAMW,
        zero=ZeroMode.NONE,
        shard_fraction=1.0,
        num_in_flight=1,
        num_neighbor_stages=0,
    )
    assert memory.weights_bytes == pytest.approx(2.0 * expected, rel=1e-12)
    parts = (memory.gradients_bytes, memory.optimizer_bytes, memory.activations_bytes)
    assert all(np.isfinite(part) and part > 0 for part in parts)


def test_prefix_sums_do_not_wrap_past_int64() -> None:
    """np.cumsum of Python ints is int64 and wraps; the cost model's sums are float64."""
    sums = prefix_sums([2**62, 2**62, 2**62])
    assert sums[-1] == pytest.approx(float(3 * 2**62)) and sums[-1] > 0


def test_widest_model_within_the_limits_is_infeasible_not_negative(tmp_path: Path) -> None:
    """At the width limits (two blocks keep it fast) the planner says what does not fit:
    exit 3, with a positive size."""
    model = _llama_config(
        tmp_path,
        hidden_size=limits.MAX_HIDDEN_SIZE,
        intermediate_size=limits.MAX_FFN_HIDDEN_SIZE,
        num_hidden_layers=2,
        vocab_size=limits.MAX_VOCAB_SIZE,
        num_attention_heads=limits.MAX_NUM_HEADS,
        num_key_value_heads=limits.MAX_NUM_HEADS,
        head_dim=limits.MAX_HEAD_DIM,
    )
    args = _plan_args(model=str(model), batch=str(limits.MAX_GLOBAL_BATCH), seq="1024")
    code, output = run_cli(*args)
    assert code == 3, output
    assert "needs" in output and " -" not in output and "Traceback" not in output


# -- YAML aliases (finding 12) -------------------------------------------------------------


def _bomb(levels: int = 9) -> str:
    """A billion-laughs document whose anchors all sit inside ``name:``."""
    items = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels):
        items.append(f"&a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "name: [" + ", ".join(items) + "]\nnodes: []\n"


def test_yaml_bomb_under_a_valid_field_is_refused_fast_and_small(tmp_path: Path) -> None:
    """Finding 12: a 400-byte file reached 3.2 GB in 34 s (repr of the expanded value)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    assert len(path.read_bytes()) < 600
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(SpecError) as error:
        load_cluster(path)
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 1.0 and peak < 20 * 2**20
    assert str(path) in str(error.value) and "aliases" in str(error.value)
    code, output = run_cli("plan", "--cluster", str(path), "--model", "tiny",
                           "--global-batch", "8", "--seq-len", "64")  # fmt: skip
    assert code == 2 and "aliases" in _one_line(output)


def test_expanded_size_counts_aliases_as_their_expansion() -> None:
    """Oracle: the bomb's expansion is a geometric sum, 1 + 9 + ... for each level."""
    text = _bomb(levels=4)
    data = safe_load_bounded(text)
    assert isinstance(data, dict)
    import yaml

    node = yaml.compose(text, Loader=yaml.SafeLoader)

    def count(value: object) -> int:  # brute force over the built value
        if isinstance(value, dict):
            return 1 + sum(count(k) + count(v) for k, v in value.items())
        if isinstance(value, list):
            return 1 + sum(count(item) for item in value)
        return 1

    assert expanded_size(node) == count(data)


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("name: &a [x, *a]\nnodes: []\n")
    with pytest.raises(SpecError, match="its own anchor"):
        load_cluster(path)


def test_ordinary_aliases_still_work(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "name: lab\n"
        "nodes:\n"
        "  - &node {name: a, gpu: A100-80GB, gpus_per_node: 2, intra_link: 600GB/s}\n"
        "  - {<<: *node, name: b}\n"
    )
    assert [group.name for group in load_cluster(path).node_groups] == ["a", "b"]


# -- JSON nesting (finding 22) -------------------------------------------------------------


@pytest.mark.parametrize("depth", [200_000, 100])
def test_deeply_nested_json_is_one_line_in_every_loader(tmp_path: Path, depth: int) -> None:
    """Finding 22: '[' * 200000 was a RecursionError in the plan, model config and profile
    loaders; a depth under the interpreter's limit (100) is refused the same way."""
    text = "[" * depth + "]" * depth
    plan = tmp_path / "plan.json"
    plan.write_text(text)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(text)
    profiles = tmp_path / "db"
    profiles.mkdir()
    (profiles / "p.json").write_text(text)
    for load, path in (
        (load_plan, plan),
        (load_model, str(model)),
        (load_profile_db, profiles),
    ):
        with pytest.raises(SpecError, match="levels deep") as error:
            load(path)  # type: ignore[operator]
        assert "\n" not in str(error.value)
    code, output = run_cli("explain", str(plan))
    assert code == 2 and "levels deep" in _one_line(output)


# -- head_dim (finding 19) -----------------------------------------------------------------


def test_odd_head_dim_is_refused_for_rope_models(
    tmp_path: Path, plan_data: dict[str, object]
) -> None:
    """Finding 19: head_dim 15 planned, then training crashed in RoPE."""
    config = json.loads((HF / "llama-3-8b" / "config.json").read_text())
    with pytest.raises(SpecError, match="head_dim: got 15; expected an even number"):
        arch_from_hf_config({**config, "head_dim": 15}, source="config.json")
    with pytest.raises(SpecError, match="num_attention_heads"):  # 4095 / 4095 = 1: odd
        arch_from_hf_config(
            {
                **config,
                "hidden_size": 4095,
                "num_attention_heads": 4095,
                "num_key_value_heads": 4095,
            },
            source="config.json",
        )
    data = json.loads(json.dumps(plan_data))
    model = data["model"]
    assert isinstance(model, dict)
    model["head_dim"] = 15
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    code, output = run_cli("explain", str(path))
    assert code == 2 and "even" in _one_line(output)
    # GPT-2 has no RoPE: an odd head dimension is fine there.
    gpt2 = json.loads((HF / "gpt2" / "config.json").read_text())
    arch_from_hf_config({**gpt2, "n_embd": 15 * 12, "n_head": 12}, source="config.json")


# -- the reference run's micro-batch (finding 23) -------------------------------------------


def test_reference_micro_batch_larger_than_the_batch_is_one_line() -> None:
    code, output = run_cli(
        "train", "--model", "tiny", "--global-batch", "2", "--seq-len", "16",
        "--steps", "1", "--micro-batch-size", "5",
    )  # fmt: skip
    assert code == 2
    assert "--micro-batch-size: got 5" in _one_line(output)


# -- messages (findings 27, 28) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("model", "family", "qwen2"),
        ("model", "num_kv_heads", 3),
        ("model", "rope_scaling", {"rope_type": "linear", "factor": -1}),
        ("job", "precision", "fp8"),
    ],
)
def test_plan_errors_name_the_file_and_field_once(
    tmp_path: Path, plan_data: dict[str, object], section: str, field: str, value: object
) -> None:
    """Finding 27: 'model: expected a consistent architecture (<file>: model.family: ...)'
    named the file twice and wrapped one error in another."""
    data = json.loads(json.dumps(plan_data))
    part = data[section]
    assert isinstance(part, dict)
    part[field] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    code, output = run_cli("explain", str(path))
    assert code == 2
    line = _one_line(output)
    assert line.count(str(path)) == 1 and line.count("expected") == 1, line


def test_hf_config_errors_name_the_file_once(tmp_path: Path) -> None:
    model = _llama_config(tmp_path, num_key_value_heads=3)
    code, output = run_cli(*_plan_args(model=str(model)))
    assert code == 2
    line = _one_line(output)
    assert line.count("config.json") == 1 and line.count("expected") == 1, line


def _cluster_with(tmp_path: Path, gpu_type: str, node: str = "") -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "name: lab\n"
        f"gpu_types:\n  - {{name: X, memory: 8GiB, memory_bandwidth: 1TB/s, {gpu_type}}}\n"
        f"nodes:\n  - {{name: a, gpu: X, gpus_per_node: 2, intra_link: 64GB/s{node}}}\n"
    )
    return path


def test_yaml_numbers_in_scientific_notation_are_numbers(tmp_path: Path) -> None:
    """Finding 28: YAML 1.1 reads 1e2 (no dot) as a string; it said 'expected a number'."""
    path = _cluster_with(tmp_path, "bf16_tflops: 1e2, fp32_tflops: 25E-1")
    device = load_cluster(path).device_of(0)
    assert device.bf16_flops == pytest.approx(1e14)
    assert device.fp32_flops == pytest.approx(2.5e12)
    bad = _cluster_with(tmp_path, "bf16_tflops: 1e2x, fp32_tflops: 1")
    with pytest.raises(SpecError, match="expected a number"):
        load_cluster(bad)


def test_a_negative_quantity_says_non_negative(tmp_path: Path) -> None:
    """Finding 28: '-5ms' said 'expected a quantity with a unit'."""
    path = _cluster_with(tmp_path, "bf16_tflops: 100, fp32_tflops: 25", ", intra_latency: -5ms")
    with pytest.raises(SpecError, match="got '-5ms'; expected a finite non-negative quantity"):
        load_cluster(path)
    path = _cluster_with(
        tmp_path, "bf16_tflops: 100, fp32_tflops: 25", ", intra_latency: 5 parsecs"
    )
    with pytest.raises(SpecError, match="expected a quantity with a unit"):
        load_cluster(path)
