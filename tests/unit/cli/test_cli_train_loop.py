"""``piebald train``'s training-loop flags: the learning-rate schedule as the metrics show it
(closed forms), ``--config job.toml`` (the file's flags, the command line winning, one-line
errors naming the file and the key) and ``--tensorboard`` without its package."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from cli_runner import last_json, run_cli
from piebald.cli.job_file import MAX_JOB_FILE_BYTES

JOB = ["--model", "tiny", "--global-batch", "2", "--seq-len", "16"]


def _lrs(metrics: Path) -> list[float]:
    return [json.loads(line)["lr"] for line in metrics.read_text().splitlines()]


@pytest.mark.slow
def test_schedule_flags_give_the_closed_form_lrs(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    code, output = run_cli(
        "train", *JOB, "--steps", "5", "--lr", "0.004", "--warmup-steps", "1",
        "--lr-decay", "linear", "--decay-steps", "3", "--min-lr", "0.001",
        "--metrics", str(metrics),
    )  # fmt: skip
    assert code == 0, output
    # step 0: 0.004 * 1/2; step 1: the peak; then 1/2 and all of the way to the floor.
    assert _lrs(metrics) == pytest.approx([0.002, 0.004, 0.0025, 0.001, 0.001])
    assert "lr 2.000e-03" in output  # the step line shows it too
    constant = tmp_path / "c.jsonl"
    code, output = run_cli("train", *JOB, "--steps", "2", "--metrics", str(constant))
    assert code == 0, output
    assert _lrs(constant) == [1e-3, 1e-3]  # the default: today's constant lr


@pytest.mark.slow
def test_job_file_is_the_flags_and_the_command_line_wins(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    # Both spellings of keys; decay-steps defaults to --steps, given on the command line.
    job.write_text(
        'model = "tiny"\nglobal_batch = 2\nseq-len = 16\nsteps = 9\nlr = 0.004\n'
        'warmup_steps = 1\nlr-decay = "cosine"\nweight-decay = 0.1\njson = true\n'
        f'metrics = "{tmp_path / "file.jsonl"}"\n'
    )
    code, output = run_cli("train", "--config", str(job), "--steps", "3")
    assert code == 0, output
    from_file = last_json(output)  # json = true: the summary is the last line
    assert from_file["steps"] == 3
    # cos(pi / 2) halfway through the decay from step 1 to step 3, to min-lr 0.
    assert _lrs(tmp_path / "file.jsonl") == pytest.approx([0.002, 0.004, 0.002])
    code, output = run_cli(
        "train", *JOB, "--steps", "3", "--lr", "0.004", "--warmup-steps", "1",
        "--lr-decay", "cosine", "--weight-decay", "0.1", "--json",
    )  # fmt: skip
    assert code == 0, output
    assert last_json(output)["losses"] == from_file["losses"]  # the same run, exactly


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("stepz = 3", "stepz: expected a flag of this command (did you mean 'steps'?)"),
        ('steps = "3"', "steps: got '3'; expected an integer"),
        ("steps = true", "steps: got True; expected an integer"),
        ("steps = 0", "steps: got 0; expected an integer >= 1"),
        ('lr = "fast"', "lr: got 'fast'; expected a number"),
        ("json = 1", "json: got 1; expected true or false"),
        ("metrics = 3", "metrics: got 3; expected a string"),
        ("warmup-steps = 1\nwarmup_steps = 2", "one key per flag (also given as warmup-steps)"),
        ("config = 'other.toml'", "config: expected a flag of this command"),
        ("steps = [", "expected TOML"),
        ("lr = inf", "lr: got inf; expected a finite number"),
        ("lr = -inf", "lr: got -inf; expected a finite number"),
        ("lr = nan", "lr: got nan; expected a finite number"),
        ("steps = " + "[" * 5000 + "]" * 5000, "expected TOML with lists and mappings at most 64"),
        ("t = " + "{a = " * 3000 + "1" + "}" * 3000, "at most 64 levels deep"),
    ],
)
def test_job_file_errors_are_one_line(tmp_path: Path, body: str, expected: str) -> None:
    job = tmp_path / "job.toml"
    job.write_text(body + "\n")
    code, output = run_cli("train", "--config", str(job), *JOB)
    assert code == 2, output
    assert output.count("\n") == 1 and "Traceback" not in output
    assert f"{job}: " in output and expected in output


@pytest.mark.parametrize("kind", ["fifo", "zero", "directory", "not-utf8", "huge"])
def test_job_file_that_is_no_regular_file_is_one_line(tmp_path: Path, kind: str) -> None:
    """A FIFO blocked forever and /dev/zero grew until the OOM killer: both are refused
    before reading, as are a directory, bytes that are not UTF-8 and an oversized file."""
    job = tmp_path / "job.toml"
    if kind == "fifo":
        os.mkfifo(job)
    elif kind == "zero":
        job.symlink_to("/dev/zero")
    elif kind == "directory":
        job.mkdir()
    elif kind == "not-utf8":
        job.write_bytes(b"steps = 3\n# \xff\n")
    else:
        job.write_bytes(b"#" * (MAX_JOB_FILE_BYTES + 1))
    signal.alarm(20)  # a regression would block here, not fail
    try:
        code, output = run_cli("train", "--config", str(job), *JOB)
    finally:
        signal.alarm(0)
    assert code == 2, output
    assert output.count("\n") == 1 and "Traceback" not in output
    expected = {
        "fifo": "a regular file (it is a named pipe)",
        "zero": "a regular file (it is a device node)",
        "directory": "a regular file (it is a directory)",
        "not-utf8": "UTF-8 text (byte 0xff on line 2 is not UTF-8)",
        "huge": "a file of at most 1 MiB",
    }[kind]
    assert f"{job}: expected {expected}" in output


def test_schedule_and_tensorboard_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = [
        (["--lr-decay", "cosh"], "--lr-decay: got 'cosh'; expected constant or cosine or linear"),
        (["--lr-decay", "cosine", "--min-lr", "0.01"], "--min-lr: got 0.01; expected at most"),
        (
            ["--lr-decay", "linear", "--warmup-steps", "4", "--steps", "4"],
            "--steps: got 4; expected a step after --warmup-steps (4)",
        ),
        (
            ["--lr-decay", "linear", "--decay-steps", "2", "--warmup-steps", "2"],
            "--decay-steps: got 2; expected a step after --warmup-steps (2)",
        ),
        (["--config", str(tmp_path / "missing.toml")], "missing.toml: expected a readable file"),
    ]
    for flags, expected in cases:
        code, output = run_cli("train", *JOB, *flags)
        assert code == 2 and expected in output and "Traceback" not in output, output
    from piebald.runtime.training import tensorboard

    monkeypatch.setattr(tensorboard, "tensorboard_available", lambda: False)
    code, output = run_cli("train", *JOB, "--tensorboard", str(tmp_path / "tb"))
    assert code == 2 and "--tensorboard" in output and "pip install" in output, output
    assert not (tmp_path / "tb").exists()
