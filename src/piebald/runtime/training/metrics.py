"""What a run reports: one line (and one JSON object) per step, torchtitan-style, and the
summary at the end.

Tokens/s are the global batch's tokens over the step's wall time; under emulation the wall
time is divided by the time scale first, so the number describes the emulated cluster. MFU is
model FLOP/s (3 x forward, no recompute) over the used GPUs' dense peaks, as the planner
reports it. Memory is the largest peak of live tensor bytes over the used ranks
(``memory_meter``: CUDA's allocator statistics on GPUs, counted storages on CPU). ``lr`` is
the learning rate the step applied (``lr_schedule``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from piebald.errors import SpecError
from piebald.outputs import open_run_file, write_error
from piebald.runtime.training.tensorboard import TensorBoardWriter
from piebald.specs.units import format_bytes
from piebald.specs.user_input import parse_user_json, read_user_text

__all__ = [
    "MetricsWriter",
    "RunSummary",
    "StepMetrics",
    "format_eval",
    "format_step",
    "new_run_id",
    "summarise",
    "truncate_metrics",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMetrics:
    step: int  # 1-based: the number of optimizer steps taken once this one is done
    loss: float
    grad_norm: float
    lr: float  # the learning rate this step applied (``lr_schedule.lr_at``)
    step_time_s: float  # wall seconds, or emulated seconds under emulation
    tokens_per_s: float
    mfu: float
    peak_memory_bytes: float
    skipped: bool  # fp16 overflow: no parameter changed
    clamped_values: int = 0  # activation values clamped to fp16's range (pipeline.boundary)
    eval_loss: float | None = None  # after this step, when the run evaluated (evaluation.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    steps: int
    losses: tuple[float, ...]  # of the steps this run executed (a resumed run: from there)
    tokens_per_s: float  # median over the run's steps after the first (warm-up)
    predicted_tokens_per_s: float | None
    emulated: bool
    model_name: str  # the model the processes trained (reduced width under emulation)
    overruns: int = 0  # emulated operations whose real work outlasted their emulated time
    paced_operations: int = 0
    first_step: int = 0  # the step this run started from (after --resume)
    skipped_steps: int = 0  # fp16 overflow: no parameter changed
    clamped_values: int = 0  # activation values clamped to fp16's range, all steps
    compute_dtype: str = "fp32"  # native (each GPU's dtype) or fp32
    # Per used rank: its measured peak of live tensor bytes over the run's steps and the
    # plan's prediction without the framework reserve (empty when not measured).
    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    eval_steps: tuple[int, ...] = ()  # the steps after which the run evaluated
    eval_losses: tuple[float, ...] = ()  # the evaluation loss after each of them
    # Elastic runs: each change of the live nodes (``elastic.MembershipEvent.as_dict``).
    membership_events: tuple[dict[str, Any], ...] = ()

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        for name in _LISTS:
            data[name] = list(data[name])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        """The inverse of ``as_dict`` (a summary handed between processes as JSON)."""
        lists = {name: tuple(data.get(name, ())) for name in _LISTS}
        return cls(**{**data, **lists})


_LISTS = ("losses", "eval_steps", "eval_losses", "membership_events")


def format_step(metrics: StepMetrics) -> str:
    skipped = "  (skipped: fp16 overflow)" if metrics.skipped else ""
    clamped = (
        f"  ({metrics.clamped_values:,} activations clamped to fp16's range)"
        if metrics.clamped_values
        else ""
    )
    return (
        f"step {metrics.step:>5}  loss {metrics.loss:8.4f}  grad norm {metrics.grad_norm:8.4f}  "
        f"lr {metrics.lr:9.3e}  "
        f"tokens/s {metrics.tokens_per_s:>12,.0f}  MFU {metrics.mfu:6.1%}  "
        f"memory {format_bytes(metrics.peak_memory_bytes):>10}{skipped}{clamped}"
    )


def format_eval(metrics: StepMetrics) -> str:
    """The evaluation line printed after a step's line (when the step evaluated)."""
    return f"eval  {metrics.step:>5}  loss {metrics.eval_loss:8.4f}"


def summarise(
    history: list[StepMetrics],
    *,
    steps: int,
    predicted_tokens_per_s: float | None,
    emulated: bool,
    model_name: str,
    overruns: int = 0,
    paced_operations: int = 0,
    compute_dtype: str = "fp32",
    memory: dict[str, dict[str, int]] | None = None,
) -> RunSummary:
    timed = history[1:] if len(history) > 1 else history
    return RunSummary(
        steps=steps,
        losses=tuple(m.loss for m in history),
        tokens_per_s=statistics.median(m.tokens_per_s for m in timed) if timed else 0.0,
        predicted_tokens_per_s=predicted_tokens_per_s,
        emulated=emulated,
        model_name=model_name,
        overruns=overruns,
        paced_operations=paced_operations,
        first_step=history[0].step - 1 if history else steps,
        skipped_steps=sum(m.skipped for m in history),
        clamped_values=sum(m.clamped_values for m in history),
        compute_dtype=compute_dtype,
        memory=dict(memory or {}),
        eval_steps=tuple(m.step for m in history if m.eval_loss is not None),
        eval_losses=tuple(m.eval_loss for m in history if m.eval_loss is not None),
    )


class MetricsWriter:
    """Appends one JSON object per step to a file and, with a ``tensorboard_dir``, the same
    numbers as TensorBoard scalars ``train/<field>`` (the booleans as 0/1; the evaluation
    loss as ``eval/loss``) at the same step.

    Every record carries ``run_id``, the run it belongs to: a fresh run (``first_step`` 0)
    draws one (or takes ``run_id``), and its checkpoints record it
    (``save_checkpoint(run_id=writer.run_id)``); a run resumed after step ``first_step``
    is given its checkpoint's ``run_id`` and appends only to a file of that run: a record
    of another run (or of none, when the checkpoint has an id) is a one-line
    :class:`SpecError` naming ``--metrics`` and the file is left as it was. It then drops
    the file's records of later steps (written by the interrupted run after its last
    checkpoint; this run writes them again), so every step is in the file once
    (:func:`truncate_metrics`). The file is opened with
    :func:`piebald.outputs.open_run_file` (never through a link); a write that fails (a
    full disk) is an :class:`~piebald.outputs.OutputError` naming ``--metrics``."""

    def __init__(
        self,
        path: Path | None,
        *,
        tensorboard_dir: Path | None = None,
        first_step: int = 0,
        run_id: str | None = None,
    ) -> None:
        self.path = path
        self.run_id = run_id if run_id is not None or first_step else new_run_id()
        self._stream: IO[str] | None = None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise write_error(error, flag=_FLAG, path=path) from None
            if first_step > 0 and os.path.lexists(path):
                truncate_metrics(path, after_step=first_step, run_id=self.run_id)
            self._stream = os.fdopen(open_run_file(path, "append", flag=_FLAG), "a")
        self.tensorboard = TensorBoardWriter(tensorboard_dir, first_step=first_step)

    def write(self, metrics: StepMetrics) -> None:
        record = asdict(metrics)
        if self._stream is not None:
            line = {**record, "run_id": self.run_id} if self.run_id is not None else record
            try:
                self._stream.write(json.dumps(line) + "\n")
                self._stream.flush()
            except OSError as error:
                raise write_error(error, flag=_FLAG, path=self.path or "") from None
        step = record.pop("step")
        scalars = {
            "eval/loss" if name == "eval_loss" else f"train/{name}": float(value)
            for name, value in record.items()
            if value is not None  # eval_loss, on steps that did not evaluate
        }
        self.tensorboard.write_scalars(step=step, scalars=scalars)

    def close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            try:
                stream.close()
            except OSError as error:
                raise write_error(error, flag=_FLAG, path=self.path or "") from None
        self.tensorboard.close()


_FLAG = "--metrics"
MAX_METRICS_BYTES = 1 << 30  # a million steps' records, and then some


def new_run_id() -> str:
    """A fresh run's id: random, 16 hex digits."""
    return uuid.uuid4().hex[:16]


def truncate_metrics(path: Path, *, after_step: int, run_id: str | None = None) -> None:
    """Keep the records of steps up to ``after_step`` in the JSONL file ``path``, rewritten
    atomically (a temporary file in the same directory, then a rename). A last line cut
    short (a run killed while writing it) is dropped; any other line that is not a step
    record of the run ``run_id`` (a record without ``run_id`` when it is None, a file
    written before runs had ids) means the file is not this run's metrics file, and it is
    left alone (SpecError). Read as a user's file (``specs.user_input``: a regular file,
    not a link, bounded, UTF-8, JSON nested at most 64 deep)."""
    os.close(open_run_file(path, "read", flag=_FLAG))  # a link or a FIFO: refused here
    text = read_user_text(path, source=_FLAG, max_bytes=MAX_METRICS_BYTES)
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    for number, line in enumerate(lines, start=1):
        last_partial = number == len(lines) and not line.endswith("\n")
        try:
            record = parse_user_json(line, source=f"{path}:{number}", field=_FLAG)
        except SpecError:
            if last_partial:
                continue  # the interrupted run's last, partial write
            raise
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            if last_partial:
                continue
            raise SpecError(
                source=f"{path}:{number}",
                field=_FLAG,
                value=line.strip()[:40],
                expected="a metrics file of the resumed run (one JSON object per step)",
            )
        if record.get("run_id") != run_id:
            if last_partial:
                continue
            raise SpecError(
                source=_FLAG,
                field="",
                value=str(path),
                expected=f"the metrics file of the resumed checkpoint's run ({_run(run_id)}); "
                f"line {number} is of {_run(record.get('run_id'))}; the file was left as it "
                "was: pass that run's --metrics file, or a new path",
            )
        if step <= after_step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) == len(lines):
        return
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise write_error(error, flag=_FLAG, path=path) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        shutil.copymode(path, temp)
        os.replace(temp, path)
    except BaseException as error:
        Path(temp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise write_error(error, flag=_FLAG, path=path) from None
        raise


def _run(run_id: object) -> str:
    return f"run {run_id}" if isinstance(run_id, str) else "a run without a run id"
