"""Time from a lost node to the first step on the new plan, under elastic emulation.

``piebald train --emulate --elastic`` of tiny on the example cluster (three 2-GPU nodes),
checkpoints every 2 steps; the workers of the plan's node are SIGKILLed once step 3 is
printed, and the run goes on without it. Per run: the wall time from the kill to the next
step line (the first step on the new plan), and the run's own split of it (detect,
re-plan, restore: ``membership_events``; the rest is that first step). Prints a markdown
table with the median of ``--repeats`` runs, the date, the command and the commit.

    PYTHONPATH=src .venv/bin/python benchmarks/elastic_recovery.py --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from piebald.api import build_job, load_cluster, plan
from piebald.examples import example_path
from piebald.runtime.training.emulate import worker_process_name
from piebald.specs.plan_io import save_plan

STEP_S = 0.3  # wall seconds per step of the original plan


def _node_pids(node_index: int, *, session: int) -> list[int]:
    """The workers of one node of the run in ``session``, by their process names."""
    prefix = worker_process_name(group_rank=node_index, rank=0)[:-1]
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                name = (entry / "comm").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[3]) == session and name.startswith(prefix):
                found.append(int(entry.name))
    return found


def one_run(work: Path, *, plan_file: Path, node_index: int, time_scale: float) -> dict[str, float]:
    """Kill the node after step 3; the kill-to-next-step time and the event's split."""
    summary = work / "summary.json"
    command = [
        *(sys.executable, "-m", "piebald", "train", "--plan", str(plan_file), "--emulate"),
        *("--elastic", "--steps", "6", "--checkpoint-every", "2", "--json"),
        *("--checkpoint-dir", str(work / "ckpt"), "--time-scale", f"{time_scale:.6g}"),
    ]
    process = subprocess.Popen(
        command,
        stdout=summary.open("w"),
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(work)},
        start_new_session=True,  # its workers are found in its session alone
    )
    assert process.stderr is not None
    killed_at = first_step_at = 0.0
    for line in process.stderr:
        if not killed_at and line.startswith("step     3"):
            for pid in _node_pids(node_index, session=process.pid):
                os.kill(pid, signal.SIGKILL)
            killed_at = time.time()
        elif killed_at and not first_step_at and line.startswith("step "):
            first_step_at = time.time()
    process.wait()
    if process.returncode != 0 or not first_step_at:
        raise SystemExit(f"the run failed (exit {process.returncode}): {command}")
    (event,) = json.loads(summary.read_text())["membership_events"]
    return {
        "total_s": first_step_at - killed_at,
        "detect_s": event["detect_s"],
        "replan_s": event["replan_s"],
        "restore_s": event["restore_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cluster = load_cluster(example_path())
    original = plan(cluster, "tiny", build_job(global_batch=8, seq_len=64))
    assert original.predicted is not None
    node_index = cluster.node_of(min(original.used_ranks)).index
    runs = []
    with tempfile.TemporaryDirectory(prefix="pb-", dir="/tmp") as scratch:
        plan_file = Path(scratch) / "plan.json"
        save_plan(original, plan_file)
        for repeat in range(args.repeats):
            work = Path(scratch) / f"run-{repeat}"
            work.mkdir()
            runs.append(
                one_run(
                    work,
                    plan_file=plan_file,
                    node_index=node_index,
                    time_scale=STEP_S / original.predicted.step_time_s,
                )
            )
            print(f"run {repeat + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print()
    print(
        f"{datetime.date.today()}, commit {commit}, `PYTHONPATH=src .venv/bin/python "
        f"benchmarks/elastic_recovery.py --repeats {args.repeats}`, "
        f"{cluster.nodes[node_index].name} of {cluster.name} SIGKILLed after step 3 of tiny "
        "(batch 8, seq 64), checkpoints every 2 steps; seconds, median of the runs "
        f"(min-max):"
    )
    print()
    print("| kill to first step on the new plan | detect | re-plan | restore | first step |")
    print("|---:|---:|---:|---:|---:|")

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    rest = [r["total_s"] - r["detect_s"] - r["replan_s"] - r["restore_s"] for r in runs]
    columns = [[r[key] for r in runs] for key in ("total_s", "detect_s", "replan_s", "restore_s")]
    print("| " + " | ".join(cell(values) for values in [*columns, rest]) + " |")


if __name__ == "__main__":
    main()
