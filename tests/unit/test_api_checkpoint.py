"""The Python API's side of checkpoint intervals: ``piebald.plan(checkpoint_every=...,
failures=...)`` records what ``piebald plan --checkpoint-every`` records, refuses what it
refuses (naming the argument, before any search), and ``simulate_report(failures=...)``
prices a failure at the simulated step time."""

from __future__ import annotations

from pathlib import Path

import pytest

import piebald
from cluster_builders import CPU_LAB_YAML
from piebald.cost.failure import FailureModel, price_failures
from piebald.errors import ArgumentError

DAY = FailureModel(mtbf_s=86400.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "cpu-lab.yaml"
    path.write_text(CPU_LAB_YAML)
    return path


def _job() -> piebald.JobSpec:
    return piebald.build_job(global_batch=8, seq_len=64)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"checkpoint_every": "auto"}, "checkpoint_every"),  # auto needs a failure rate
        ({"checkpoint_every": 0}, "checkpoint_every"),
        ({"checkpoint_every": 2.0, "failures": DAY}, "checkpoint_every"),
        ({"checkpoint_every": True}, "checkpoint_every"),
        ({"checkpoint_every": "daily", "failures": DAY}, "checkpoint_every"),
        ({"failures": 86400.0}, "failures"),
    ],
)
def test_bad_checkpoint_arguments_are_refused_naming_them(
    cluster: Path, kwargs: dict[str, object], argument: str
) -> None:
    with pytest.raises(ArgumentError) as caught:
        piebald.plan(cluster, "tiny", _job(), **kwargs)  # type: ignore[arg-type]
    assert caught.value.argument == argument


def test_failures_alone_record_daly_interval(cluster: Path) -> None:
    found = piebald.search_plans(cluster, "tiny", _job(), failures=DAY)
    assert found.checkpoint is not None and not found.checkpoint.given
    assert found.plan.checkpoint_every_steps == found.checkpoint.daly_steps
    again = price_failures(found.plan, model=DAY, step_time_s=found.estimate.step_time_s)
    assert again.daly_steps == found.checkpoint.daly_steps


def test_a_given_interval_is_recorded_with_or_without_failures(cluster: Path) -> None:
    assert piebald.plan(cluster, "tiny", _job(), checkpoint_every=9).checkpoint_every_steps == 9
    found = piebald.search_plans(cluster, "tiny", _job(), checkpoint_every=9, failures=DAY)
    assert found.plan.checkpoint_every_steps == 9
    assert found.checkpoint is not None and found.checkpoint.given
    assert found.checkpoint.cost.lost_work_s == pytest.approx(4.5 * found.estimate.step_time_s)
    assert piebald.search_plans(cluster, "tiny", _job()).checkpoint is None


def test_simulate_report_prices_failures_at_the_simulated_step(cluster: Path) -> None:
    plan = piebald.plan(cluster, "tiny", _job(), checkpoint_every=9)
    report = piebald.simulate_report(plan, failures=DAY)
    assert report.failures is not None
    assert report.failures.step_time_s == report.result.step_time_s
    assert report.failures.checkpoint_every == 9 and report.failures.given
    assert piebald.simulate_report(plan).failures is None
    with pytest.raises(ArgumentError) as caught:
        piebald.simulate_report(plan, failures="24h")  # type: ignore[arg-type]
    assert caught.value.argument == "failures"
