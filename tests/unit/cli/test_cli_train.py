"""``piebald train`` end to end: the single-process reference, an emulated run of a plan made
by ``piebald plan`` (same losses as the reference), metrics, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_runner import last_json, run_cli
from piebald.examples import example_path
from piebald.runtime.data.token_file import write_token_file

JOB = ["--global-batch", "6", "--seq-len", "32"]
TRAIN = ["--steps", "3", "--seed", "2", "--lr", "0.003"]


@pytest.mark.distributed
def test_emulated_plan_trains_like_the_reference(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), "--model", "tiny", *JOB, "--out", str(plan)
    )
    assert code == 0, output
    eval_ids = np.random.default_rng(5).integers(0, 256, size=10 * 33)
    evaluation = ["--eval-data", str(write_token_file(tmp_path / "eval.bin", eval_ids).path)]
    evaluation += ["--eval-every", "2"]
    code, output = run_cli("train", "--model", "tiny", *JOB, *TRAIN, *evaluation, "--json")
    assert code == 0, output
    reference = last_json(output)
    assert list(reference)[-2:] == ["eval_steps", "eval_losses"]
    assert reference["eval_steps"] == [2, 3]
    metrics = tmp_path / "metrics.jsonl"
    code, output = run_cli(
        "train",
        "--plan",
        str(plan),
        "--emulate",
        *TRAIN,
        *evaluation,
        "--json",
        "--metrics",
        str(metrics),
    )
    assert code == 0, output
    emulated = last_json(output)
    assert emulated["steps"] == reference["steps"] == 3
    assert emulated["emulated"] is True and emulated["predicted_tokens_per_s"] > 0  # type: ignore[operator]
    assert emulated["losses"] == pytest.approx(reference["losses"], rel=1e-4, abs=1e-4)
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert [line["loss"] for line in lines] == emulated["losses"]
    assert emulated["eval_losses"] == pytest.approx(reference["eval_losses"], rel=1e-5)
    assert [line["eval_loss"] for line in lines] == [None, *emulated["eval_losses"]]


@pytest.mark.slow
def test_train_errors_are_one_line(tmp_path: Path) -> None:
    code, output = run_cli("train", "--steps", "1")
    assert code == 2 and "--global-batch" in output and "Traceback" not in output
    code, output = run_cli("train", "--emulate", "--model", "tiny", *JOB)
    assert code == 2 and "a --plan to emulate" in output
    code, output = run_cli("train", "--model", "tiny", *JOB, "--checkpoint-dir", str(tmp_path))
    assert code == 2 and "takes no checkpoints" in output
    code, output = run_cli("train", "--model", "tiny", *JOB, "--resume")
    assert code == 2 and "--checkpoint-dir" in output and "Traceback" not in output
    code, output = run_cli("train", "--model", "tiny", *JOB, "--eval-every", "2")
    assert code == 2 and "an --eval-data file" in output
    short = write_token_file(tmp_path / "short.bin", np.arange(32)).path
    code, output = run_cli("train", "--model", "tiny", *JOB, "--eval-data", str(short))
    assert code == 2 and "one evaluation window" in output and "Traceback" not in output
    code, output = run_cli("train", "--model", "tiny", *JOB, "--compute-dtype", "bf16")
    assert code == 2 and "--compute-dtype" in output and "native or fp32" in output
    code, output = run_cli("train", "--model", "tiny", *JOB, "--compute-dtype", "native")
    assert code == 2 and "reference is fp32" in output and "Traceback" not in output
    plan = tmp_path / "plan.json"
    code, output = run_cli(
        "plan", "--cluster", str(example_path()), "--model", "tiny", *JOB, "--out", str(plan)
    )
    assert code == 0, output
    code, output = run_cli("train", "--plan", str(plan))
    assert code == 2 and "torchrun" in output and "--emulate" in output
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("keep me\n")
    code, output = run_cli("train", "--model", "tiny", *JOB, "--metrics", str(metrics))
    assert code == 2 and "already exists" in output
    assert metrics.read_text() == "keep me\n"
