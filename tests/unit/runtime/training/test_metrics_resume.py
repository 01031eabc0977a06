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
from small_disk import fill, small_disk


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


def _run(path: Path, steps: range, *, first_step: int, run_id: str | None = None) -> str | None:
    writer = MetricsWriter(path, first_step=first_step, run_id=run_id)
    for step in steps:
        writer.write(_metrics(step))
    writer.close()
    return writer.run_id


def test_a_resumed_run_writes_every_step_once(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    run_id = _run(path, range(1, 8), first_step=0)  # killed after step 7, checkpoint at 4
    with path.open("a") as f:
        f.write('{"step": 8, "lo')  # and while writing step 8
    path.chmod(0o640)
    _run(path, range(5, 11), first_step=4, run_id=run_id)  # the checkpoint's run id
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


def test_every_record_names_its_run(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    run_id = _run(path, range(1, 3), first_step=0)
    assert run_id is not None and len(run_id) == 16
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["run_id"] for r in records] == [run_id, run_id]
    assert _run(tmp_path / "other.jsonl", range(1, 2), first_step=0) != run_id


def test_another_runs_metrics_file_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """A resumed run deleted the later records of any JSONL with ``step`` keys (another
    run's log of steps 1..100 lost 7..100): the file must belong to the checkpoint's run."""
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 101)))
    _run(tmp_path / "theirs.jsonl", range(1, 101), first_step=0)
    for path in (other, tmp_path / "theirs.jsonl"):
        before = path.read_bytes()
        with pytest.raises(SpecError) as caught:
            MetricsWriter(path, first_step=6, run_id="0123456789abcdef")
        message = str(caught.value)
        head, _, rest = message.partition("; expected the metrics file")
        shown, whole = head.removeprefix("--metrics: got "), repr(str(path))
        assert rest and (shown == whole or whole.startswith(shown.removesuffix("..."))), message
        assert "run 0123456789abcdef" in message and "\n" not in message
        assert path.read_bytes() == before
    # A checkpoint written before runs had ids resumes only a file without them.
    MetricsWriter(other, first_step=6).close()
    assert _steps(other) == list(range(1, 7))
    with pytest.raises(SpecError, match="a run without a run id"):
        MetricsWriter(tmp_path / "theirs.jsonl", first_step=6)


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe not utf-8\n", b"[" * 100_000 + b"\n" + b"{}\n"],
    ids=["non-utf-8", "deep"],
)
def test_an_unreadable_metrics_file_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(content)
    with pytest.raises(SpecError) as caught:
        MetricsWriter(path, first_step=2, run_id="x")
    assert "--metrics" in str(caught.value) and "\n" not in str(caught.value)
    assert path.read_bytes() == content


def test_a_metrics_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "target.jsonl"
    target.write_text("mine\n")
    link = tmp_path / "m.jsonl"
    link.symlink_to(target)
    for first_step in (0, 3):
        with pytest.raises(SpecError, match="a symbolic link"):
            MetricsWriter(link, first_step=first_step, run_id="x")
    assert target.read_text() == "mine\n"


def test_a_full_disk_is_one_line_naming_metrics(tmp_path: Path) -> None:
    """A disk that fills during the run: the record that does not fit is one line naming
    --metrics, the path and the OS's words, not a traceback."""
    with small_disk(tmp_path / "disk", size="64k") as disk:
        path = disk / "metrics.jsonl"
        writer = MetricsWriter(path, first_step=0)
        writer.write(_metrics(1))
        fill(disk / "filler")
        with pytest.raises(SpecError) as caught:
            for step in range(2, 10_000):  # each record is flushed: one soon does not fit
                writer.write(_metrics(step))
            writer.close()
        message = str(caught.value)
        assert "\n" not in message and message.startswith("--metrics: got '/"), message
        assert message.endswith("expected a location piebald can write (No space left on device)")
