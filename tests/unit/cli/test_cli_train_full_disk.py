"""A full disk during ``train --emulate`` (a tiny tmpfs, mounted as root; skipped where
mounting is not permitted): one line naming the flag, the path and "No space left on
device", exit 2, no temporary left, and the older checkpoint intact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_runner import run_cli
from piebald.runtime.distributed.checkpoint import verify_checkpoint
from small_disk import fill, small_disk

FULL = "expected a location piebald can write (No space left on device)"


def _is_full_disk_line(line: str, *, flag: str, path: Path) -> bool:
    """``error: FLAG: got 'PATH'; FULL``, where a long PATH is shown cut, ending in ``...``."""
    head, tail = f"error: {flag}: got ", f"; {FULL}"
    if not (line.startswith(head) and line.endswith(tail)):
        return False
    shown, whole = line[len(head) : -len(tail)], repr(str(path))
    return shown == whole or (shown.endswith("...") and whole.startswith(shown[:-3]))


ONE_GPU = """name: one
nodes:
  - name: a
    gpu: A100-80GB
    gpus_per_node: 1
    intra_link: 600GB/s
    nic: {kind: infiniband, bandwidth: 200Gb/s}
"""


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", size="3m") as mounted:
        yield mounted


def _error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


@pytest.mark.slow
def test_a_full_disk_during_train_is_one_line_and_keeps_older_checkpoints(
    tmp_path: Path, disk: Path
) -> None:
    plan, cluster = tmp_path / "plan.json", tmp_path / "one.yaml"
    cluster.write_text(ONE_GPU)  # one process: the test stays short
    code, output = run_cli(
        "plan", "--cluster", str(cluster), "--model", "tiny",
        "--global-batch", "6", "--seq-len", "32", "--out", str(plan),
    )  # fmt: skip
    assert code == 0, output
    train = ["train", "--plan", str(plan), "--emulate", "--seed", "2"]
    checkpoints = disk / "ck"
    code, output = run_cli(*train, "--steps", "1", "--checkpoint-dir", str(checkpoints))
    assert code == 0, output
    first = checkpoints / "step-00000001"
    size = sum(p.stat().st_size for p in first.iterdir())
    fill(disk / "filler", leave=size // 2)  # room for half a checkpoint

    code, output = run_cli(*train, "--steps", "2", "--resume", "--checkpoint-dir", str(checkpoints))
    assert code == 2, output
    assert _is_full_disk_line(_error_line(output), flag="--checkpoint-dir", path=checkpoints)
    assert sorted(p.name for p in checkpoints.iterdir()) == [".lock", "step-00000001"]
    assert verify_checkpoint(first).step == 1

    fill(disk / "filler")
    model = disk / "w"
    code, output = run_cli(*train, "--steps", "1", "--save-model", str(model))
    assert code == 2, output
    assert _is_full_disk_line(_error_line(output), flag="--save-model", path=model)
    assert sorted(p.name for p in disk.iterdir()) == ["ck", "filler"]  # no .w.parts-*
