"""What the scenario benchmarks share: their command-line options (which scenarios, which
models, the job) and reading the chosen scenarios' cluster files."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import load_cluster
from piebald.specs.job import JobSpec

SCENARIOS = Path(__file__).parent / "scenarios"


def scenario_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", default="llama-3-8b,llama-2-13b")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--scenarios", default="", help="comma-separated names; default all")
    return parser


def scenario_job(args: argparse.Namespace) -> JobSpec:
    return JobSpec(global_batch_size=args.global_batch, seq_len=args.seq_len)


def scenario_clusters(args: argparse.Namespace) -> Iterator[tuple[str, ClusterSpec]]:
    """(name, cluster) of every chosen scenario, in name order unless named."""
    names = (
        args.scenarios.split(",")
        if args.scenarios
        else sorted(p.stem for p in SCENARIOS.glob("*.yaml"))
    )
    for name in names:
        yield name, load_cluster(SCENARIOS / f"{name}.yaml")
