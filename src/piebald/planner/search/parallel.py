"""The search's independent tasks spread over processes: the orders the coarse scan
prices, the scans the refinement searches around, the idle subsets tried, the candidates
built exactly.

Pricing a structure is pure Python and numpy over small arrays, one core's work, and at a
thousand GPUs a search prices about a thousand structures, and a user waits for it. The
tasks of a phase share nothing but the ``SearchState``'s caches. This process and processes
forked with a copy of the state (copy on write, nothing pickled on the way in) each take
the next task as they finish one (tasks differ in cost several fold); this one keeps what
it caches for later phases, the forked ones send back each task's result, the candidates it
priced anew or improved, and how many structures it priced. The candidates are merged in
task order, each keeping the lowest proxy and the place of its first finding, as running
the tasks one after another does: the search finds the same plans with any number of
workers (``tests/unit/planner/test_search_workers.py``). What the forked processes cached
is lost with them; later phases price again what they need.

Where ``fork`` is not available (not Linux), or one worker is asked for, the tasks run one
after another in this process."""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from typing import Any, Generic, TypeVar

from piebald.planner.search.records import Candidate, Stages
from piebald.planner.search.state import SearchState

__all__ = ["available_workers", "map_forked", "run_tasks"]

Task = TypeVar("Task")
Result = TypeVar("Result")


class _Job(Generic[Task, Result]):
    """A phase's tasks, the function that runs one, and the state it runs on."""

    def __init__(
        self,
        state: SearchState,
        tasks: Sequence[Task],
        work: Callable[[SearchState, Task], Result],
    ) -> None:
        self.state, self.tasks, self.work = state, tasks, work

    def run(self, index: int) -> tuple[Result, dict[tuple[Stages, int], Candidate], int]:
        """Task ``index`` on this process's state: its result, the candidates it priced
        anew or improved (in the order found), and the structures it priced."""
        state = self.state
        before, structures = dict(state.candidates), state.num_structures
        result = self.work(state, self.tasks[index])
        found = {
            key: candidate
            for key, candidate in state.candidates.items()
            if before.get(key) is not candidate
        }
        return result, found, state.num_structures - structures


def available_workers() -> int:
    """The cores this process may run on (at least 1): those it may be scheduled on, and
    no more than a container's CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``)
    lets it use at once."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return max(1, cores if quota is None else min(cores, math.ceil(quota)))


# Where a container's CPU quota is read: cgroup v2's "QUOTA PERIOD" (or "max PERIOD"), and
# cgroup v1's quota (-1: none) and period in two files.
_CGROUP_QUOTA_FILES: tuple[tuple[str, str | None], ...] = (
    ("/sys/fs/cgroup/cpu.max", None),
    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
)


def _cgroup_cpu_quota(
    files: tuple[tuple[str, str | None], ...] = _CGROUP_QUOTA_FILES,
) -> float | None:
    """CPUs' worth of time per second the cgroup may use; None where unlimited or unknown."""
    for path, period_path in files:
        try:
            with open(path) as file:
                fields = file.read().split()
            if period_path is not None:
                with open(period_path) as file:
                    fields.append(file.read().strip())
            quota, period = float(fields[0]), float(fields[1])
        except (OSError, ValueError, IndexError):  # absent, "max", or unreadable
            continue
        if quota > 0 and period > 0:
            return quota / period
    return None


def run_tasks(
    state: SearchState,
    tasks: Sequence[Task],
    work: Callable[[SearchState, Task], Result],
    *,
    workers: int,
    done: Callable[[], None] | None = None,
) -> list[Result]:
    """``work(state, task)`` for every task, the results in task order, on up to
    ``workers`` processes (module docstring): this one (its caches then outlive the phase)
    and forked ones, each taking the next task as it finishes one. ``done`` is called once
    per task as its result arrives."""
    job = _Job(state, tasks, work)
    before, structures = dict(state.candidates), state.num_structures
    outcomes = map_forked(len(tasks), job.run, workers=workers, done=done)
    # Merged in task order from the state before, as one process running them in turn
    # would have kept them (the first finding's place, the lowest proxy).
    state.candidates, state.num_structures = before, structures
    results = []
    for result, found, priced in outcomes:
        state.absorb(found, num_structures=priced)
        results.append(result)
    return results


def map_forked(
    count: int,
    run: Callable[[int], Result],
    *,
    workers: int,
    done: Callable[[], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> list[Result]:
    """``run(index)`` for every index below ``count``, the results in index order, on up
    to ``workers`` processes: this one and forked ones (copy on write; each result comes
    back pickled), each taking the next index as it finishes one. ``meanwhile`` runs here
    once the forked processes have started, before this one takes any index (work of its
    own that overlaps theirs). ``done`` is called once per index as its result arrives.
    One process (no fork, one worker, no semaphores) runs them all in turn, ``meanwhile``
    first."""
    processes = min(workers, count + (meanwhile is not None))
    context = multiprocessing.get_context("fork") if _can_fork() else None
    try:
        # Indices handed out so far, to whichever process asks (its lock is a POSIX
        # semaphore, which some containers lack: then one process does it all).
        taken = None if context is None or processes <= 1 else context.Value("l", 0)
    except OSError:
        taken = None
    if context is None or taken is None:
        if meanwhile is not None:
            meanwhile()
        results = []
        for index in range(count):
            results.append(run(index))
            if done is not None:
                done()
        return results
    children = []
    for _ in range(1, processes):
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_worker, args=(run, count, taken, sender))
        try:
            child.start()
        except OSError:  # no process to spare: those started, and this one, take every index
            receiver.close()
            break
        finally:
            sender.close()
        children.append((child, receiver))
    outcomes: dict[int, Any] = {}
    try:
        if meanwhile is not None:
            meanwhile()
        for index in _next_tasks(taken, count):
            outcomes[index] = run(index)
            if done is not None:
                done()
        for child, receiver in children:
            try:
                status, payload = receiver.recv()
            except EOFError:  # it died without a word (killed, out of memory)
                child.join()
                raise RuntimeError(f"a search worker died (exit code {child.exitcode})") from None
            if status != "ok":
                raise RuntimeError(f"a search worker failed:\n{payload}")
            outcomes.update(payload)
            if done is not None:
                for _ in payload:
                    done()
    except BaseException:
        # Interrupted, or a worker failed: the others' work is of no use any more.
        for child, _ in children:
            child.terminate()
        raise
    finally:
        for child, receiver in children:
            receiver.close()
            child.join()
    return [outcomes[index] for index in range(count)]


def _next_tasks(taken: Synchronized[int], count: int) -> Iterator[int]:
    """The tasks this process takes, one at a time, until all ``count`` are taken."""
    while True:
        with taken.get_lock():
            index = taken.value
            taken.value += 1
        if index >= count:
            return
        yield index


def _worker(
    run: Callable[[int], Any], count: int, taken: Synchronized[int], sender: Connection
) -> None:
    """A forked worker: indices until none are left, their results sent back as one
    message (or the error's traceback)."""
    try:
        outcomes = {index: run(index) for index in _next_tasks(taken, count)}
        sender.send(("ok", outcomes))
    except BaseException:  # the parent raises it, with this traceback
        sender.send(("error", traceback.format_exc()))
    finally:
        sender.close()


def _can_fork() -> bool:
    # Forking is safe for the planner's pure-Python and numpy work, and only Linux makes
    # it the platform's way (macOS's frameworks are not fork-safe).
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
