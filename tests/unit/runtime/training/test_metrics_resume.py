"""The metrics file after a resume holds every step once (reliability finding 9: steps came
out as [1,2,3,4,3,4,5,6]): records after the resumed step are dropped, the file rewritten
atomically, a last line cut short by a kill dropped, and a file that is not a metrics
file left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piebald.errors import SpecError
from piebald.runtime.training.metrics import MetricsWriter, StepMetrics


def _metrics(step: int) -> StepMetrics:
    return StepMetrics(
        step=step,
        loss=1.0 / step,
        grad_norm=0.5,
        lr=1e-3,
        step_time_s=0.1,
        tokens_per_s=100.0,
        mfu=0.1,
        peak_memory_bytes=1e6,
        skipped=False,
    )


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def _run(path: Path, steps: range, *, first_step: int) -> None:
    writer = MetricsWriter(path, first_step=first_step)
    for step in steps:
        writer.write(_metrics(step))
    writer.close()


def test_a_resumed_run_writes_every_step_once(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _run(path, range(1, 8), first_step=0)  # killed after step 7, last checkpoint at 4
    with path.open("a") as f:
        f.write('{"step": 8, "lo')  # and while writing step 8
    path.chmod(0o640)
    _run(path, range(5, 11), first_step=4)
    assert _steps(path) == list(range(1, 11))
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary left

    _run(path, range(11, 13), first_step=0)  # a fresh writer only appends
    assert _steps(path) == list(range(1, 13))


def test_a_file_that_is_not_metrics_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("my notes\nmore notes\n")
    with pytest.raises(SpecError, match=r"notes\.txt:1: --metrics"):
        MetricsWriter(path, first_step=3)
    assert path.read_text() == "my notes\nmore notes\n"
