"""The search finds the same plans on any number of worker processes.

A large cluster's scan, refinement, idle subsets and exact build run as tasks on forked
workers (``planner/search/parallel.py``), whose caches are lost with them and whose
candidates the search merges. The oracle is the search run in one process: the best plan,
its runners-up, their estimates and the count of structures priced must be identical.
The task runner itself: results in task order wherever each ran, a worker's failure
raised with its traceback (its death with its exit code), and every task run here where
no process can be spared.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster_builders import cluster as _cluster
from cluster_builders import group as _group
from piebald.cost.compute import DEFAULT_CURVE
from piebald.planner.search import SearchResult, parallel, search
from piebald.planner.search.parallel import run_tasks
from piebald.planner.search.settings import ALL_SIZES_UP_TO, SearchSettings
from piebald.planner.search.state import SearchState
from piebald.planner.strategies import PIEBALD
from piebald.specs.job import JobSpec
from piebald.specs.plan_io import plan_to_dict
from piebald.specs.presets import load_model


@pytest.mark.slow
def test_one_and_two_workers_find_the_same_plans() -> None:
    # Four GPU types on 40 GPUs: a large cluster (past ALL_SIZES_UP_TO), several orders
    # and idle subsets, so every phase has several tasks.
    cluster = _cluster(
        "four-types",
        _group("h", "H100-SXM", 4, count=2, nic=("infiniband", "400Gb/s")),
        _group("a", "A100-80GB", 4, count=3, nic=("infiniband", "200Gb/s")),
        _group("l", "L40S", 4, count=3, nic=("ethernet", "100Gb/s")),
        _group("v", "V100-32GB", 4, count=2, nic=("ethernet", "25Gb/s")),
    )
    assert cluster.num_gpus > ALL_SIZES_UP_TO
    model, job = load_model("llama-3.2-1b"), JobSpec(global_batch_size=64, seq_len=1024)
    _assert_same_results(
        search(cluster, model=model, job=job, workers=1),
        search(cluster, model=model, job=job, workers=2),
    )


def test_tasks_run_in_workers_and_come_back_in_order() -> None:
    # Results return in task order wherever each ran, every task reported done, the
    # count of structures (none here) merged.
    state = _state(workers=2)
    # Tasks 0 and 1 meet at a barrier for two, so no process can run both: one runs in
    # this process (it takes the first task it asks for), the other in a forked one.
    meet = multiprocessing.get_context("fork").Barrier(2, timeout=60)

    def work(_: SearchState, task: int) -> tuple[int, int]:
        if task < 2:
            meet.wait()
        return task * task, os.getpid()

    ticks: list[int] = []
    results = run_tasks(state, list(range(6)), work, workers=2, done=lambda: ticks.append(1))
    assert [square for square, _ in results] == [t * t for t in range(6)]
    assert results[0][1] != results[1][1]
    assert os.getpid() in {results[0][1], results[1][1]}
    assert len(ticks) == 6 and state.num_structures == 0


def test_meanwhile_runs_here_while_forked_processes_take_tasks() -> None:
    # ``meanwhile`` waits at a barrier for two: the other party can only be a forked
    # process running task 0, so the two overlap; the results come back in order.
    meet = multiprocessing.get_context("fork").Barrier(2, timeout=60)
    ran: list[int] = []

    def run(index: int) -> tuple[int, int]:
        if index == 0:
            meet.wait()
        return index + 10, os.getpid()

    def meanwhile() -> None:
        meet.wait()
        ran.append(os.getpid())

    results = parallel.map_forked(3, run, workers=2, meanwhile=meanwhile)
    assert [value for value, _ in results] == [10, 11, 12]
    assert ran == [os.getpid()] and results[0][1] != os.getpid()


def test_seeded_search_finds_the_same_plans_on_one_and_two_workers() -> None:
    # A small cluster seeds with the baselines' searches, on other processes while the
    # search runs its own phases: the seeds, and so the plans, are those of one process.
    cluster = _cluster(
        "two-types",
        _group("a", "A100-80GB", 2, count=1),
        _group("v", "V100-32GB", 2, count=1),
    )
    model, job = load_model("tiny"), JobSpec(global_batch_size=8, seq_len=64)
    _assert_same_results(
        search(cluster, model=model, job=job, workers=1),
        search(cluster, model=model, job=job, workers=2),
    )


def _raise(task: int) -> None:
    raise ValueError(f"task {task} failed in a worker")


def _die(task: int) -> None:
    os._exit(9)  # as the kernel's OOM killer leaves it: no word sent


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        (_raise, r"(?s)search worker failed.*ValueError: task"),
        (_die, r"search worker died \(exit code 9\)"),
    ],
    ids=["raises: its traceback", "dies: its exit code"],
)
def test_a_worker_that_fails_fails_the_search(fail: Callable[[int], None], message: str) -> None:
    state = _state(workers=2)
    meet = multiprocessing.get_context("fork").Barrier(2, timeout=60)
    parent = os.getpid()

    def work(_: SearchState, task: int) -> int:
        meet.wait()  # tasks 0 and 1 in different processes
        if os.getpid() != parent:
            fail(task)
        return task

    with pytest.raises(RuntimeError, match=message):
        run_tasks(state, [0, 1], work, workers=2)


class _NoSpareProcess:
    """A fork context whose processes cannot start (the system is out of them)."""

    real = multiprocessing.get_context("fork")  # taken before any test patches it

    def Value(self, *args: Any) -> Any:  # noqa: N802 - multiprocessing's name
        return self.real.Value(*args)

    def Pipe(self, *, duplex: bool) -> Any:  # noqa: N802 - multiprocessing's name
        return self.real.Pipe(duplex=duplex)

    def Process(self, **_: Any) -> Any:  # noqa: N802 - multiprocessing's name
        class Unstartable:
            def start(self) -> None:
                raise OSError("Resource temporarily unavailable")

        return Unstartable()


class _NoSemaphores(_NoSpareProcess):
    """A fork context without POSIX semaphores (some containers)."""

    def Value(self, *args: Any) -> Any:  # noqa: N802 - multiprocessing's name
        raise OSError("Function not implemented")


@pytest.mark.parametrize("context", [_NoSpareProcess, _NoSemaphores])
def test_without_processes_to_spare_this_one_runs_every_task(
    context: type[_NoSpareProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(workers=2)
    monkeypatch.setattr(parallel.multiprocessing, "get_context", lambda _: context())
    results = run_tasks(state, list(range(4)), lambda _, task: (task, os.getpid()), workers=2)
    assert results == [(task, os.getpid()) for task in range(4)]


def test_a_containers_cpu_quota_caps_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def quota(*lines: str) -> float | None:
        files = []
        for index, text in enumerate(lines):
            (tmp_path / f"f{index}").write_text(text)
        if len(lines) == 1:  # cgroup v2: one file
            files.append((str(tmp_path / "f0"), None))
        else:  # cgroup v1: quota and period
            files.append((str(tmp_path / "f0"), str(tmp_path / "f1")))
        return parallel._cgroup_cpu_quota((("/nonexistent/cpu.max", None), *files))

    assert quota("200000 100000\n") == 2.0
    assert quota("max 100000\n") is None
    assert quota("150000\n", "100000\n") == 1.5
    assert quota("-1\n", "100000\n") is None
    monkeypatch.setattr(parallel, "_cgroup_cpu_quota", lambda: 1.5)
    assert parallel.available_workers() == min(2, len(os.sched_getaffinity(0)))
    monkeypatch.setattr(parallel, "_cgroup_cpu_quota", lambda: 0.5)
    assert parallel.available_workers() == 1


def test_small_clusters_search_in_one_process() -> None:
    assert SearchSettings.for_cluster(ALL_SIZES_UP_TO, workers=8).workers == 1
    assert SearchSettings.for_cluster(ALL_SIZES_UP_TO + 1, workers=8).workers == 8
    with pytest.raises(ValueError, match="workers = 0"):
        SearchSettings.for_cluster(64, workers=0)


def _state(*, workers: int) -> SearchState:
    """A search's state on 32 A100s (large: past ALL_SIZES_UP_TO), for ``workers``."""
    cluster = _cluster("a100x32", _group("a", "A100-80GB", 8, count=4))
    settings = SearchSettings.for_cluster(cluster.num_gpus, workers=workers)
    assert settings.workers == workers
    return SearchState(
        cluster,
        model=load_model("tiny"),
        job=JobSpec(global_batch_size=8, seq_len=64),
        strategy=PIEBALD,
        curve=DEFAULT_CURVE,
        settings=settings,
    )


def _assert_same_results(alone: SearchResult, shared: SearchResult) -> None:
    """The best plan and its runners-up, their estimates, the search credited with each
    and the count of structures priced: identical."""
    assert shared.num_structures == alone.num_structures
    for one, two in zip(
        (alone.best, *alone.runners_up), (shared.best, *shared.runners_up), strict=True
    ):
        assert two.strategy == one.strategy
        assert two.estimate.step_time_s == one.estimate.step_time_s
        assert plan_to_dict(two.plan) == plan_to_dict(one.plan)
