"""``--tensorboard``: the event files hold, per step, the numbers of the metrics JSONL.

The files are read back without the writer: TFRecord framing (a little-endian u64 length,
its masked CRC, the bytes, their masked CRC) decoded by hand, each record an ``Event``
protobuf (tensorboardX's generated classes, the schema TensorBoard itself reads).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboardX.proto.event_pb2 import Event, SessionLog

from piebald.runtime.data.token_file import write_token_file
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.lr_schedule import LrDecay, LrSchedule
from piebald.runtime.training.metrics import MetricsWriter
from piebald.runtime.training.reference import train_reference
from piebald.specs.devices import Dtype
from piebald.specs.job import JobSpec
from piebald.specs.presets import load_model
from small_disk import small_disk


def _events(directory: Path) -> list[Event]:
    events = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            at += 8 + 4  # the length and its CRC
            events.append(Event.FromString(data[at : at + length]))
            at += length + 4  # the record and its CRC
        assert at == len(data), path  # whole records only
    return events


def _scalars(events: list[Event]) -> dict[int, dict[str, float]]:
    by_step: dict[int, dict[str, float]] = {}
    for event in events:
        for value in event.summary.value:
            by_step.setdefault(event.step, {})[value.tag] = value.simple_value
    return by_step


def test_scalars_equal_the_metrics_jsonl(tmp_path: Path) -> None:
    config = TrainConfig(
        steps=3,
        seed=1,
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.1),
        lr_schedule=LrSchedule(warmup_steps=1, decay=LrDecay.COSINE, decay_steps=4),
        metrics_path=tmp_path / "metrics.jsonl",
        tensorboard_dir=tmp_path / "tb",
        eval_data_path=write_token_file(tmp_path / "eval.bin", np.arange(100) % 256).path,
        eval_every=2,
    )
    job = JobSpec(global_batch_size=2, seq_len=16, precision=Dtype.FP32)
    train_reference(load_model("tiny"), job, config, print_line=lambda _: None)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    scalars = _scalars(_events(tmp_path / "tb"))
    assert sorted(scalars) == [1, 2, 3] == [line["step"] for line in lines]
    assert len({line["lr"] for line in lines}) == 3  # the schedule moves: lr is not a constant
    assert [line["eval_loss"] is not None for line in lines] == [False, True, True]
    assert len({line.pop("run_id") for line in lines}) == 1  # the run's, not a scalar
    for line in lines:
        step = line.pop("step")
        tags = {"eval/loss" if name == "eval_loss" else f"train/{name}": value
                for name, value in line.items() if value is not None}  # fmt: skip
        assert set(scalars[step]) == set(tags)
        for tag, value in tags.items():
            # TensorBoard keeps float32 (simple_value); booleans as 0 and 1.
            assert scalars[step][tag] == np.float32(float(value)), (step, tag)


def test_a_resumed_run_gets_its_own_file_and_purges_what_it_retrains(tmp_path: Path) -> None:
    directory = tmp_path / "tb"
    MetricsWriter(None, tensorboard_dir=directory).close()
    MetricsWriter(None, tensorboard_dir=directory, first_step=2).close()  # in the same second
    assert len(list(directory.iterdir())) == 2  # the first file was not reopened
    starts = [e.step for e in _events(directory) if e.session_log.status == SessionLog.START]
    assert starts == [3]  # steps >= 3 of earlier files are hidden: this run logs them anew


_FILL_AND_LOG = """
import contextlib, sys
from pathlib import Path
from piebald.errors import SpecError
from piebald.runtime.training.tensorboard import TensorBoardWriter
disk = Path(sys.argv[1])
writer = TensorBoardWriter(disk / "tb")
with contextlib.suppress(OSError), (disk / "filler").open("ab") as filler:
    while True:  # until the disk is full
        filler.write(bytes(4096))
        filler.flush()
try:
    for step in range(1, 2000):
        writer.write_scalars(step=step, scalars={"loss": 1.0, "lr": 0.1})
    writer.close()
except SpecError as error:
    print(error)
"""


def test_a_full_disk_is_one_line_and_nothing_after_it(tmp_path: Path) -> None:
    """tensorboardX retries a failed write from its logger thread, its atexit hook and the
    file's buffer: none of them may print a traceback after the run's one line."""
    pytest.importorskip("tensorboardX")
    with small_disk(tmp_path / "disk", size="256k") as disk:
        run = subprocess.run([sys.executable, "-c", _FILL_AND_LOG, str(disk)],
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert run.returncode == 0 and run.stderr == "", run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("--tensorboard: got '/"), run.stdout
    assert lines[0].endswith("; expected a location piebald can write (No space left on device)")
