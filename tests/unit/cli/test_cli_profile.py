"""``piebald profile compute / merge / calibrate`` and ``plan --profiles`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cli_runner import run_cli
from piebald.profiler.db import load_profile_db
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.devices import BLOCK_SHARE_OF_BENCHMARK_GEMM, Dtype

pytest.importorskip("torch")

CLUSTER = """\
name: cpu-lab
gpu_types:
  - {name: cpu, memory: 8GiB, fp32_tflops: 0.05, memory_bandwidth: 5GB/s}
nodes:
  - {name: box, gpu: cpu, gpus_per_node: 2, intra_link: 2GB/s}
"""


@pytest.mark.slow
def test_profile_plan_calibrate_merge(tmp_path: Path) -> None:
    db = tmp_path / "db"
    code, output = run_cli(
        "profile", "compute", "--model", "tiny", "--seq-len", "32",
        "--micro-batch-sizes", "1,2", "--out", str(db), "--warmup", "1", "--repeats", "1",
        "--threads", "1",
    )  # fmt: skip
    assert code == 0, output
    assert "block" in output and "not in the catalog" in output and "fp32_tflops" in output
    # The suggested gpu_types entry is one a cluster file takes, its measured GEMM rate
    # priced at the share a block reaches of such a rate.
    suggested = next(line for line in output.splitlines() if line.startswith("  - {name:"))
    (entry,) = yaml.safe_load(suggested)
    nodes = [{"name": "n", "gpu": entry["name"], "gpus_per_node": 1}]
    cluster = parse_cluster({"name": "x", "gpu_types": [entry], "nodes": nodes}, source="x")
    device = cluster.device_of(0)
    assert device.sustained_matmul_efficiency(Dtype.FP32) == BLOCK_SHARE_OF_BENCHMARK_GEMM
    assert load_profile_db(db).num_files == 3
    cluster = tmp_path / "cpu.yaml"
    cluster.write_text(CLUSTER)
    code, output = run_cli(
        "plan", "--cluster", str(cluster), "--model", "tiny", "--global-batch", "4",
        "--seq-len", "32", "--profiles", str(db), "--json",
    )  # fmt: skip
    assert code == 0, output
    recorded = json.loads(output)["cost_inputs"]
    assert recorded["profile_db_digest"] == load_profile_db(db).digest
    assert {entry["layer_kind"] for entry in recorded["layer_times"]} <= {
        "embedding",
        "block",
        "head",
    }
    assert recorded["layer_times"] and recorded["curves"]
    code, output = run_cli(
        "compare", "--cluster", str(cluster), "--model", "tiny", "--global-batch", "4",
        "--seq-len", "32", "--profiles", str(db), "--json",
    )  # fmt: skip
    assert code == 0, output
    code, output = run_cli("profile", "calibrate", "--profiles", str(db), "--cluster", str(cluster))
    assert code == 0, output
    assert "error before" in output and "embedding" in output
    code, output = run_cli("profile", "merge", str(db), "--into", str(tmp_path / "merged"))
    assert code == 0 and "copied 3 files" in output


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("[1, 2")
    code, output = run_cli("profile", "calibrate", "--profiles", str(tmp_path))
    assert code == 2 and "bad.json" in output and "Traceback" not in output
    code, output = run_cli(
        "profile", "compute", "--model", "tiny", "--seq-len", "32", "--micro-batch-sizes", "1,x",
    )  # fmt: skip
    assert code == 2 and "--micro-batch-sizes" in output
    code, output = run_cli("profile", "compute", "--model", "tiny", "--seq-len", "100000")
    assert code == 2 and "max_seq_len" in output
    code, output = run_cli(
        "plan", "--cluster", "x.yaml", "--model", "tiny", "--global-batch", "4", "--seq-len", "32",
        "--profiles", str(tmp_path / "missing"),
    )  # fmt: skip
    assert code == 2


@pytest.mark.parametrize("sizes", ["16777216", "1,16385", "0", "1,,x"])
def test_message_sizes_out_of_bounds_are_one_line(tmp_path: Path, sizes: str) -> None:
    """--message-sizes is in MiB: 16777216 asked every rank for two 16 TiB buffers, a
    worker's allocation traceback after the workers started. Refused first, in one line."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "name: c\nnodes:\n  - {name: a, gpu: A100-80GB, gpus_per_node: 2, intra_link: 600GB/s}\n"
    )
    code, output = run_cli(
        "profile", "network", "--cluster", str(cluster), "--emulate",
        "--message-sizes", sizes, "--out", str(tmp_path / "n"),
    )  # fmt: skip
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --message-sizes"), output
    assert not (tmp_path / "n").exists()
