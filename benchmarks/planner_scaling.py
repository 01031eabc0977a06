"""Planner scaling: wall time and plan quality of `piebald plan`, this tree against an older commit.

Each run is the whole command line, timed around its process (start-up, search, writing
the plan): ``PYTHONPATH=<tree>/src python -m piebald plan --cluster FILE --model MODEL
--global-batch N --seq-len S --out PLAN.json``, with this script's Python. Every cluster is
planned REPEATS times (median reported, min..max beside it); with ``--against COMMIT`` that
commit is checked out into a temporary git worktree (removed at the end) and its runs
alternate with this tree's (HEAD, old, HEAD, old, ...) so that the machine's load hits
both alike. Plan quality is read from each plan file: the predicted tokens/s and its share
of the upper bound (each GPU's best standalone throughput, summed).

    .venv/bin/python benchmarks/planner_scaling.py [--against 05307b2] [--sizes 64,256]
        [--cluster FILE ...] [--quick-start] [--model llama-3-70b] [--repeats 3]

The synthetic clusters (``--sizes``, default 64 to 16384 GPUs) are six GPU types in nodes
of 8 (``scaling_clusters.py``), planned for llama-3-70b at 4096 tokens and a global batch
of max(512, GPUs) sequences unless ``--global-batch``. ``--cluster FILE`` (repeatable)
plans a cluster file with the same job and replaces the default sizes (give ``--sizes`` as
well to have both); for one cluster file it also prints this tree's plan stage by stage
(the big 1,024-GPU two-site cluster: ``--cluster benchmarks/clusters/six-type-1024.yaml
--global-batch 2048``). ``--quick-start`` adds the README's quick-start plan (lab-mix,
llama-3.2-1b, batch 32 x 2048). ``--workers N`` is passed to every run; a run past
``--timeout`` seconds is stopped and shown as "> T s". Targets on a 2-core machine:
1024 GPUs in under 10 s, 4096 in under 60 s.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).parent))

from piebald.specs.cluster_yaml import load_cluster
from piebald.specs.plan import Plan
from piebald.specs.plan_io import load_plan
from scaling_clusters import TYPES, scaling_cluster_data, scaling_cluster_yaml

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 3
DEFAULT_SIZES = "64,256,1024,4096,16384"
QUICK_START_CLUSTER = ROOT / "src/piebald/examples/lab-mix.yaml"
QUICK_START_JOB = ("llama-3.2-1b", 32, 2048)  # model, global batch, sequence length

# The plan's title and the summary line under the table, for plan files without the numbers.
_TITLE_TOKENS = re.compile(r"step [\d.]+ s, ([\d,]+) tokens/s")
_UPPER_BOUND = re.compile(r"upper bound ([\d,]+) tokens/s")


@dataclass(frozen=True)
class Target:
    """One row: a cluster file and the job to plan on it."""

    label: str
    cluster: Path
    num_gpus: int
    model: str
    global_batch: int
    seq_len: int


@dataclass(frozen=True)
class Tree:
    """A source tree to plan with: ``src/`` under ``root``."""

    name: str  # the column's name: HEAD or old
    commit: str  # short hash
    root: Path


@dataclass(frozen=True)
class Quality:
    tokens_per_s: float
    share_of_bound: float | None


@dataclass
class Runs:
    """One tree's runs of one target."""

    seconds: list[float] = field(default_factory=list)
    qualities: list[Quality] = field(default_factory=list)
    timed_out: bool = False
    failure: str | None = None  # the last error line of a run that failed
    plan_file: Path | None = None  # the last plan written

    @property
    def done(self) -> bool:
        """Whether further repeats are pointless: a run timed out or failed."""
        return self.timed_out or self.failure is not None


def main() -> None:
    args = _parse_args()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # clean up the worktree on kill too
    head = Tree("HEAD", _git("rev-parse", "--short", "HEAD"), ROOT)
    with tempfile.TemporaryDirectory(prefix="planner-scaling-") as scratch_name:
        scratch = Path(scratch_name)
        targets = _targets(args, scratch / "clusters")
        with contextlib.ExitStack() as stack:
            trees = [head]
            if args.against is not None:
                trees.append(stack.enter_context(_worktree(args.against, scratch / "old")))
            for tree in trees:  # bytecode for both, so neither first run pays for compiling
                compileall.compile_dir(tree.root / "src", quiet=1)
            _print_header(args, trees, targets)
            results = [_run_target(target, trees, args, scratch / "plans") for target in targets]
            _print_failures(targets, trees, results)
            if args.cluster and len(targets) == 1 and results[0][0].plan_file is not None:
                _print_structure(load_plan(results[0][0].plan_file))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--against", metavar="COMMIT", help="also plan with this commit")
    parser.add_argument(
        "--sizes", help=f"synthetic six-type clusters, GPUs (default {DEFAULT_SIZES})"
    )
    parser.add_argument(
        "--cluster",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a cluster file to plan (repeatable); replaces the default --sizes",
    )
    parser.add_argument(
        "--quick-start", action="store_true", help="add the README quick-start plan"
    )
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--global-batch", type=int, help="default: max(512, GPUs) sequences")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one run may take (default 600)"
    )
    parser.add_argument(
        "--workers", type=int, help="processes a search may use; default: every core"
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.sizes is None:
        args.sizes = "" if args.cluster else DEFAULT_SIZES
    return args


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _git(*arguments: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *arguments], check=True, capture_output=True, text=True
    ).stdout.strip()


@contextlib.contextmanager
def _worktree(commit: str, path: Path) -> Iterator[Tree]:
    """``commit`` checked out at ``path`` (a detached worktree), removed on the way out."""
    full = _git("rev-parse", "--verify", f"{commit}^{{commit}}")
    _git("worktree", "add", "--detach", str(path), full)
    try:
        yield Tree("old", _git("rev-parse", "--short", full), path)
    finally:
        try:
            _git("worktree", "remove", "--force", str(path))
        except subprocess.CalledProcessError:
            shutil.rmtree(path, ignore_errors=True)
            _git("worktree", "prune")


def _targets(args: argparse.Namespace, folder: Path) -> list[Target]:
    """The rows: synthetic sizes (written as cluster files), cluster files, quick start."""
    folder.mkdir()
    targets = []
    for size in [int(text) for text in args.sizes.split(",") if text.strip()]:
        file = folder / f"scaling-{size}.yaml"
        name = scaling_cluster_data(size)["name"]
        file.write_text(scaling_cluster_yaml(size))
        targets.append(_target(args, name, file, size))
    for file in args.cluster:
        cluster = load_cluster(file)
        targets.append(_target(args, cluster.name, file.resolve(), cluster.num_gpus))
    if args.quick_start:
        model, batch, seq_len = QUICK_START_JOB
        cluster = load_cluster(QUICK_START_CLUSTER)
        label = f"{cluster.name} (quick start: {model}, {batch} x {seq_len})"
        targets.append(Target(label, QUICK_START_CLUSTER, cluster.num_gpus, model, batch, seq_len))
    return targets


def _target(args: argparse.Namespace, label: str, file: Path, num_gpus: int) -> Target:
    batch = args.global_batch or max(512, num_gpus)
    return Target(label, file, num_gpus, args.model, batch, args.seq_len)


def _print_header(args: argparse.Namespace, trees: Sequence[Tree], targets: list[Target]) -> None:
    head = trees[0]
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", "src")
    commits = f"HEAD {head.commit}"
    if changed:
        commits += " (working tree; src/ has uncommitted changes)"
    if len(trees) > 1:
        commits += f" against old {trees[1].commit}"
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    print(
        f"{datetime.now():%Y-%m-%d %H:%M}, {commits}; {cores} cores"
        + (f" ({usable} usable)" if usable != cores else "")
        + f"; {args.repeats} runs each, alternated; timeout {args.timeout:g} s"
        + (f"; --workers {args.workers}" if args.workers else "")
    )
    if args.sizes:
        batch = "max(512, GPUs)" if args.global_batch is None else str(args.global_batch)
        print(
            f"scaling-N: {', '.join(t[0] for t in TYPES)} in nodes of 8; {args.model}, "
            f"seq {args.seq_len}, global batch {batch} sequences"
        )
    elif any(target.model == args.model for target in targets):
        batch = "max(512, GPUs)" if args.global_batch is None else str(args.global_batch)
        print(f"{args.model}, seq {args.seq_len}, global batch {batch} sequences")
    print("wall s: median (min..max) of the whole `python -m piebald plan` process\n")
    columns = ["cluster", "GPUs", "HEAD wall s"]
    if len(trees) > 1:
        columns += ["old wall s", "speed-up (old/HEAD)"]
    columns += ["HEAD tokens/s", "HEAD of bound"]
    if len(trees) > 1:
        columns += ["old tokens/s", "old of bound"]
    print("| " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * (len(columns) - 1), flush=True)


def _run_target(
    target: Target, trees: Sequence[Tree], args: argparse.Namespace, plans: Path
) -> list[Runs]:
    """Every repeat of ``target`` on every tree, alternated; prints the row."""
    plans.mkdir(exist_ok=True)
    runs = [Runs() for _ in trees]
    for repeat in range(args.repeats):
        for tree, tree_runs in zip(trees, runs, strict=True):
            if not tree_runs.done:
                out = plans / f"{target.cluster.stem}-{target.model}-{tree.name}-{repeat}.json"
                _run_once(target, tree, args, out, tree_runs)
    timeout = f"> {args.timeout:g} s"
    cells = [target.label, str(target.num_gpus), _wall_cell(runs[0], timeout)]
    if len(runs) > 1:
        cells += [_wall_cell(runs[1], timeout), _speed_up(runs[1], runs[0], args.timeout)]
    for tree_runs in runs:
        cells += _quality_cells(tree_runs)
    print("| " + " | ".join(cells) + " |", flush=True)
    return runs


def _run_once(target: Target, tree: Tree, args: argparse.Namespace, out: Path, runs: Runs) -> None:
    command = [
        sys.executable,
        "-m",
        "piebald",
        "plan",
        "--cluster",
        str(target.cluster),
        "--model",
        target.model,
        "--global-batch",
        str(target.global_batch),
        "--seq-len",
        str(target.seq_len),
        "--out",
        str(out),
    ]
    if args.workers:
        command += ["--workers", str(args.workers)]
    env = {**os.environ, "PYTHONPATH": str(tree.root / "src"), "COLUMNS": "250", "NO_COLOR": "1"}
    started = time.perf_counter()
    # Its own process group, so that a timeout or Ctrl-C stops the search's workers too.
    process = subprocess.Popen(
        command,
        cwd=tree.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        runs.timed_out = True
        return
    except BaseException:
        _kill_group(process)
        raise
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        runs.failure = f"rc {process.returncode}: " + (lines[-1] if lines else "no message")
        return
    runs.seconds.append(seconds)
    runs.qualities.append(_quality(out, stdout))
    runs.plan_file = out


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


def _quality(plan_file: Path, stdout: str) -> Quality:
    """Predicted tokens/s and its share of the upper bound: from the plan file where it
    carries them, else from the printed title and summary line."""
    data = json.loads(plan_file.read_text())
    predicted = data.get("predicted") or {}
    tokens = predicted.get("tokens_per_s")
    bound = data.get("upper_bound_tokens_per_s")
    if tokens is None and (match := _TITLE_TOKENS.search(stdout)):
        tokens = float(match[1].replace(",", ""))
    if bound is None and (match := _UPPER_BOUND.search(stdout)):
        bound = float(match[1].replace(",", ""))
    if tokens is None:
        raise RuntimeError(f"{plan_file}: no predicted tokens/s in the plan or its output")
    return Quality(float(tokens), float(tokens) / float(bound) if bound else None)


def _wall_cell(runs: Runs, timeout: str) -> str:
    if runs.timed_out:
        return timeout
    if runs.failure is not None:
        return "infeasible" if "no feasible plan" in runs.failure else "failed"
    times = runs.seconds
    return f"{statistics.median(times):.1f} ({min(times):.1f}..{max(times):.1f})"


def _speed_up(old: Runs, head: Runs, timeout: float) -> str:
    """old / HEAD median wall time; a bound where one of them timed out."""
    if old.failure is not None or head.failure is not None:
        return ""
    if old.timed_out and head.timed_out:
        return ""
    if head.timed_out:
        return f"< {statistics.median(old.seconds) / timeout:.2f}x"
    if old.timed_out:
        return f"> {timeout / statistics.median(head.seconds):.2f}x"
    return f"{statistics.median(old.seconds) / statistics.median(head.seconds):.2f}x"


def _quality_cells(runs: Runs) -> list[str]:
    if not runs.qualities:
        return ["", ""]
    first = runs.qualities[0]
    varies = " (varies)" if len(set(runs.qualities)) > 1 else ""
    share = "" if first.share_of_bound is None else f"{first.share_of_bound:.2f}"
    return [f"{first.tokens_per_s:,.0f}{varies}", share]


def _print_failures(
    targets: Sequence[Target], trees: Sequence[Tree], results: Sequence[Sequence[Runs]]
) -> None:
    for target, runs in zip(targets, results, strict=True):
        for tree, tree_runs in zip(trees, runs, strict=True):
            if tree_runs.failure is not None:
                print(f"\n{target.label}, {tree.name} {tree.commit}: {tree_runs.failure}")


def _print_structure(plan: Plan) -> None:
    """The winner stage by stage, and the GPU types it leaves idle."""
    cluster = plan.cluster
    print("\nHEAD's plan:\n")
    print("| stage | layers | GPUs | TP | ZeRO | recompute | micro-batches per group |")
    print("|---:|---|---|---:|---|---|---:|")
    for index, stage in enumerate(plan.stages):
        kinds = Counter(cluster.device_of(rank).name for rank in stage.ranks)
        gpus = ", ".join(f"{count} {name}" for name, count in kinds.items())
        print(
            f"| {index} | {stage.layer_start}-{stage.layer_end - 1} | {gpus} | "
            f"{stage.tensor_parallel_degree} | {stage.zero.value} | "
            f"{stage.recompute.value} | {max(stage.num_micro_batches)} |"
        )
    idle = Counter(cluster.device_of(rank).name for rank in plan.idle_ranks)
    print("\nidle:", ", ".join(f"{count} {name}" for name, count in idle.items()) or "none")
    for note in plan.notes[1:]:
        print("note:", note if len(note) < 300 else note[:120] + " ... " + note[-80:])


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the worktree and runs are cleaned up by then
        sys.exit(130)
