"""Fallback plans: recovery from a lost node by reading a stored plan instead of searching.

Plans the big cluster once, writes its fallback plans (``piebald plan --fallbacks DIR``:
one per node group, the plan for the loss of any one of its nodes), then for each group
loses its *first* node (the stored plan was made for the loss of its last: the key
holds them equal by symmetry) and times finding the stored plan (``find_fallback_plan``,
median of ``--repeats``; the target is under 1 s), against a fresh search for the same
membership (``replan``): its wall time, and the ratio of the two plans' predicted tokens/s
(1.000 by symmetry; the check is that it is within 5%). Exit status 1 where a check fails.

    .venv/bin/python benchmarks/fallback_plans.py [--cluster FILE] [--model llama-3-70b]
        [--global-batch 2048] [--seq-len 4096] [--repeats 5] [--workers N]

Default: benchmarks/clusters/six-type-1024.yaml (1,024 GPUs, six groups of 16 to 24 nodes)
with llama-3-70b, a global batch of 2048 sequences of 4096 tokens. The markdown table it
prints is docs/results/fallback-plans.md's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from piebald.planner.fallback import (
    find_fallback_plan,
    single_loss_memberships,
    write_fallback_plans,
)
from piebald.planner.replan import Infeasible, replan
from piebald.planner.search import search
from piebald.specs.cluster_yaml import load_cluster
from piebald.specs.job import JobSpec
from piebald.specs.membership import Membership
from piebald.specs.plan import Plan
from piebald.specs.presets import load_model

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CLUSTER = ROOT / "benchmarks" / "clusters" / "six-type-1024.yaml"
FIND_LIMIT_S = 1.0
RATIO_TOLERANCE = 0.05


@dataclass(frozen=True)
class Row:
    group: str
    nodes: int
    gpus_per_node: int
    lost: str
    find_s: float
    replan_s: float
    found_tokens_per_s: float | None  # None: no stored plan found
    fresh_tokens_per_s: float | None  # None: no plan fits

    @property
    def ratio(self) -> float | None:
        if self.found_tokens_per_s is None or not self.fresh_tokens_per_s:
            return None
        return self.found_tokens_per_s / self.fresh_tokens_per_s

    @property
    def ok(self) -> bool:
        if self.fresh_tokens_per_s is None:  # infeasible: nothing stored is right too
            return self.found_tokens_per_s is None
        ratio = self.ratio
        return (
            self.find_s < FIND_LIMIT_S and ratio is not None and abs(ratio - 1.0) <= RATIO_TOLERANCE
        )


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def _commit() -> str:
    commit = _git("rev-parse", "--short", "HEAD")
    # The planning core it runs (not the runtime's, CLI's or API's files).
    core = [f"src/piebald/{package}" for package in ("specs", "cost", "schedule", "planner")]
    if _git("status", "--porcelain", "--", *core, "benchmarks/fallback_plans.py"):
        commit += " (working tree: uncommitted changes to the planning core)"
    return commit


def _tokens(plan: Plan) -> float:
    assert plan.predicted is not None
    return plan.predicted.tokens_per_s


def _first_node_loss(membership: Membership) -> tuple[Membership, str, int]:
    """The membership that loses the first node of the group ``membership`` loses the last
    of, that node's name, and the group's index."""
    cluster = membership.cluster
    live = set(membership.live)
    gone = next(node for node in cluster.nodes if node.name not in live)
    first = next(node for node in cluster.nodes if node.group_index == gone.group_index)
    return Membership.everyone(cluster).without([first.name]), first.name, gone.group_index


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER)
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--global-batch", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    command = shlex.join([".venv/bin/python", "benchmarks/fallback_plans.py", *sys.argv[1:]])
    commit = _commit()  # before the run: what it ran

    cluster = load_cluster(args.cluster)
    model = load_model(args.model)
    job = JobSpec(global_batch_size=args.global_batch, seq_len=args.seq_len)
    print(f"planning {cluster.name} ({len(cluster.gpus)} GPUs) ...", file=sys.stderr)
    start = time.perf_counter()
    plan = search(cluster, model=model, job=job, workers=args.workers).best.plan
    plan_s = time.perf_counter() - start

    def progress(fraction: float, message: str) -> None:
        print(f"  fallback {fraction:4.0%} {message}", file=sys.stderr, flush=True)

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fallback-plans-") as folder:
        directory = Path(folder)
        start = time.perf_counter()
        result = write_fallback_plans(plan, directory, progress=progress, workers=args.workers)
        write_s = time.perf_counter() - start
        sizes = [path.stat().st_size for path in result.written]
        for stored_for in single_loss_memberships(cluster):
            membership, lost, group_index = _first_node_loss(stored_for)
            group = cluster.node_groups[group_index]
            times = []
            found = None
            for _ in range(args.repeats):
                start = time.perf_counter()
                found = find_fallback_plan(directory, membership, plan=plan)
                times.append(time.perf_counter() - start)
            print(f"  searching without {lost} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            try:
                fresh: Plan | None = replan(plan, membership, workers=args.workers)
            except Infeasible as error:  # the row says so
                print(f"  without {lost}: {error}", file=sys.stderr)
                fresh = None
            replan_s = time.perf_counter() - start
            rows.append(
                Row(
                    group=group.name,
                    nodes=group.count,
                    gpus_per_node=group.gpus_per_node,
                    lost=lost,
                    find_s=statistics.median(times),
                    replan_s=replan_s,
                    found_tokens_per_s=None if found is None else _tokens(found),
                    fresh_tokens_per_s=None if fresh is None else _tokens(fresh),
                )
            )

    covered = sum(row.nodes for row in rows)
    print(
        f"Fallback plans for {cluster.name} ({len(cluster.nodes)} nodes, {len(cluster.gpus)} "
        f"GPUs), {model.name}, global batch {job.global_batch_size} x {job.seq_len} tokens: "
        f"the plan {_tokens(plan):,.0f} tokens/s in {plan_s:.1f} s; {len(result.written)} "
        f"fallback plans written in {write_s:.1f} s ({statistics.mean(sizes) / 1e3:,.0f} kB "
        f"each), standing for the loss of any one of {covered} nodes"
        + (f"; infeasible: {', '.join(result.infeasible)}" if result.infeasible else "")
        + ".\n"
    )
    print(
        "| group | nodes it stands for | node lost | find (median) | fresh search "
        "| stored tokens/s | fresh tokens/s | stored / fresh |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for row in rows:
        stored = "none" if row.found_tokens_per_s is None else f"{row.found_tokens_per_s:,.0f}"
        new = "infeasible" if row.fresh_tokens_per_s is None else f"{row.fresh_tokens_per_s:,.0f}"
        ratio = "-" if row.ratio is None else f"{row.ratio:.3f}"
        print(
            f"| {row.group} | {row.nodes} x {row.gpus_per_node} GPUs | {row.lost} "
            f"| {row.find_s * 1e3:.1f} ms | {row.replan_s:.1f} s | {stored} | {new} "
            f"| {ratio} |"
        )
    print(
        f"\n<small>Table recorded {datetime.now():%Y-%m-%d %H:%M}, commit {commit}, "
        f"{os.cpu_count()} cores; find: median of {args.repeats}. Command: "
        f"`{command}`.</small>"
    )
    failed = [row.lost for row in rows if not row.ok]
    if failed:
        print(
            f"\nFAILED (find >= {FIND_LIMIT_S:g} s or tokens/s off by more than "
            f"{RATIO_TOLERANCE:.0%}): without {', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
