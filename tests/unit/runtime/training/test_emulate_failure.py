"""How an emulated run reports a worker that failed: one line, exit 1 from the CLI."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import typer

from piebald.cli.common import EXIT_RUN_FAILED, user_errors
from piebald.errors import RunFailedError, SpecError
from piebald.runtime.training.emulate import _one_line, _raise_failure


def test_a_worker_killed_by_sigkill_names_the_rank_and_the_newest_checkpoint(
    tmp_path: Path,
) -> None:
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(RunFailedError) as caught:
        _raise_failure(tmp_path, rank=5, exitcode=-signal.SIGKILL, checkpoint_dir=tmp_path / "ckpt")
    assert str(caught.value) == (
        f"emulated rank 5 was killed by SIGKILL, likely out of memory; "
        f"{tmp_path / 'ckpt'} holds no complete checkpoint yet"
    )
    with pytest.raises(RunFailedError, match=r"^emulated rank 1 was killed by SIGTERM$"):
        _raise_failure(tmp_path, rank=1, exitcode=-signal.SIGTERM, checkpoint_dir=None)


def test_a_worker_exception_is_its_own_message_on_one_line(tmp_path: Path) -> None:
    error = OSError(28, "No space left on device")
    error.filename = "/ckpt/.tmp-step-00000001/rank-00000.pt"
    (tmp_path / "failure-2.txt").write_text(_one_line(error))
    with pytest.raises(RunFailedError) as caught:
        _raise_failure(tmp_path, rank=2, exitcode=1, checkpoint_dir=None)
    assert str(caught.value) == (
        "emulated rank 2 failed: [Errno 28] No space left on device: "
        "'/ckpt/.tmp-step-00000001/rank-00000.pt'"
    )
    assert _one_line(KeyError("a\nb")) == "KeyError: 'a\\nb'"
    assert _one_line(ValueError("two\nlines")) == "ValueError: two lines"
    assert _one_line(MemoryError()) == "MemoryError"


def test_a_worker_spec_error_is_still_bad_input(tmp_path: Path) -> None:
    (tmp_path / "error-0.json").write_text(
        '{"source": "ck", "field": "", "value": 1, "expected": "x", "has_value": true}'
    )
    with pytest.raises(SpecError, match=r"^ck: got 1; expected x$"):
        _raise_failure(tmp_path, rank=3, exitcode=1, checkpoint_dir=None)


def test_the_cli_prints_a_failed_run_as_one_line_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    @user_errors
    def command() -> None:
        raise RunFailedError("emulated rank 0 was killed by SIGKILL,\nlikely out of memory")

    with pytest.raises(typer.Exit) as caught:
        command()
    assert caught.value.exit_code == EXIT_RUN_FAILED == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: emulated rank 0 was killed by SIGKILL, likely out of memory"
    ]


MANY_GPUS = """name: c72
nodes:
  - {name: a100, gpu: A100-80GB, count: 9, gpus_per_node: 8, intra_link: 600GB/s,
     nic: {kind: infiniband, bandwidth: 200Gb/s}}
"""


def test_an_emulation_refusal_names_the_plan_file(tmp_path: Path) -> None:
    """A plan emulation cannot run (more GPUs than processes it starts) is refused naming
    the plan file it came from, as every other refusal of an input file does."""
    from cli_runner import run_cli

    cluster = tmp_path / "c72.yaml"
    cluster.write_text(MANY_GPUS)
    plan_file = tmp_path / "p72.json"
    code, output = run_cli(
        "plan", "--cluster", str(cluster), "--model", "tiny", "--global-batch", "72",
        "--seq-len", "64", "--strategy", "megatron", "--out", str(plan_file),
    )  # fmt: skip
    assert code == 0, output
    code, output = run_cli("train", "--plan", str(plan_file), "--emulate", "--steps", "1")
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, output
    assert lines[0].startswith(f"error: {plan_file}: cluster: got 'c72 (72 GPUs)'"), output
