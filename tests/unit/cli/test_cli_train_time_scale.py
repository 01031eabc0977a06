"""``--time-scale`` is a finite pacing factor: inf (which died in a worker with an
OverflowError traceback) and values past what a sleep can wait for are refused first."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from piebald.cli import app


@pytest.mark.parametrize("value", ["inf", "Infinity", "1e7", "1e300", "nan", "0"])
def test_a_non_finite_or_huge_time_scale_is_refused_before_the_plan_is_read(
    tmp_path: Path, value: str
) -> None:
    result = CliRunner().invoke(
        app,
        ["train", "--plan", str(tmp_path / "none.json"), "--emulate", "--time-scale", value],
    )
    assert result.exit_code == 2, result.output
    assert "--time-scale" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0, 0.0, 1e7])
def test_the_pacer_refuses_what_it_cannot_wait_for(value: float) -> None:
    pytest.importorskip("torch")
    from piebald.runtime.pipeline.pacing import MAX_TIME_SCALE, Pacer

    assert MAX_TIME_SCALE == 1e6  # --time-scale's max
    with pytest.raises(ValueError, match="time_scale"):
        Pacer(plan=None, rank=0, prices=None, time_scale=value)  # type: ignore[arg-type]
