"""What would lift the big plan: recompute fewer blocks, or put the idle GPUs elsewhere.

The target is llama-3-70b on the 1,024-GPU six-type cluster at 0.65 of the bound; the
search's plan is at 0.58, with full recompute on every H100 stage and the V100 and L4 idle.
This prints two checks of what the plan space offers beyond it:

1. **Partial recompute** (Megatron-LM's ``--recompute-num-layers``: only some of a stage's
   blocks recomputed). For each stage of the searched plan: the micro-batches Little's law
   keeps in flight on its first rank (``cost.in_flight``, without the raise the planner
   applies where memory allows), that rank's memory with no block and with every block
   recomputed (``cost.memory``), the fewest recomputed blocks that fit between the two
   (linear in the blocks, each of which keeps the same bytes; slightly conservative, as
   the all-recomputed end includes the rerun's working buffer), and the pass time that
   saves.
2. **What the raised in-flight budgets are worth.** Where memory allows, the planner
   holds more micro-batches in flight than Little's law (``planner.raised_in_flight``; all
   of them on the fully recomputed stages here); partial recompute would fit only
   Little's. The searched plan is estimated and simulated as planned, and with Little's
   budgets on its recomputed stages.
3. **Pipeline orders of the node classes**. The search tries every order of up to four
   classes and a few heuristic ones beyond (``search_units.unit_orders``: two distinct
   ones for this cluster). Here every order that crosses between the sites once is
   scanned as the search's first phases scan one (pipeline depths, cuts, the local search
   of the best depth) and its best three structures are built exactly; the table shows the
   best orders and what they leave idle.

    .venv/bin/python benchmarks/big_plan_levers.py [--cluster FILE] [--global-batch 2048]

About four minutes on this 2-core machine; analytical prices, no profile.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from piebald.api import simulate
from piebald.cost.compute import DEFAULT_CURVE
from piebald.cost.in_flight import stage_in_flight
from piebald.cost.memory import plan_rank_memory
from piebald.cost.plan_estimate import estimate_plan
from piebald.cost.rank_pass import plan_rank_pass
from piebald.planner.bounds import upper_bound_tokens_per_s
from piebald.planner.search import search
from piebald.planner.search.settings import SearchSettings
from piebald.planner.search.state import SearchState
from piebald.planner.search.structures import scan_depths
from piebald.planner.search_units import Unit, build_units
from piebald.planner.strategies import PIEBALD
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import load_cluster
from piebald.specs.job import JobSpec
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.plan import Plan
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute

CLUSTER = Path(__file__).parent / "clusters" / "six-type-1024.yaml"
GiB = 2.0**30
BUILT_PER_ORDER = 3


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", type=Path, default=CLUSTER)
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--global-batch", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args(argv)
    cluster = load_cluster(args.cluster)
    model = load_model(args.model)
    job = JobSpec(global_batch_size=args.global_batch, seq_len=args.seq_len)
    bound = upper_bound_tokens_per_s(cluster, model=model, job=job, curve=DEFAULT_CURVE)
    started = time.perf_counter()
    plan = search(cluster, model=model, job=job).best.plan
    assert plan.predicted is not None
    print(
        f"{cluster.name}, {model.name}, global batch {job.global_batch_size} x {job.seq_len}: "
        f"the search's plan {plan.predicted.tokens_per_s:,.0f} tokens/s "
        f"({plan.predicted.tokens_per_s / bound:.2f} of the bound {bound:,.0f})\n"
    )
    print_partial_recompute(plan)
    print()
    print_raised_budgets(plan)
    print()
    print_orders(cluster, model=model, job=job, bound=bound)
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


def print_partial_recompute(plan: Plan) -> None:
    """Part 1 (module docstring), one row per stage of ``plan``."""
    print(
        "Partial recompute: the fewest of a stage's blocks recomputed that fit, at Little's budget"
    )
    print(
        "| stage | GPU | blocks | TP | recompute | in flight | GiB, none recomputed | "
        "GiB, all | GiB available | fewest recomputed | pass (s): none | all | fewest |"
    )
    print("|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for index, stage in enumerate(plan.stages):
        # Without a recorded budget the stage holds Little's (the planner's raise undone).
        budget = stage_in_flight(_with_stage(plan, index, max_in_flight=None), index)[0]
        memory, pass_s = {}, {}
        for mode in (Recompute.NONE, Recompute.FULL):
            variant = _with_stage(plan, index, recompute=mode, max_in_flight=None)
            memory[mode] = plan_rank_memory(
                variant, stage_index=index, position=0, num_in_flight=budget
            ).total_bytes
            pass_s[mode] = plan_rank_pass(variant, stage_index=index, position=0).pass_s
        device = plan.cluster.device_of(stage.ranks[0])
        blocks = sum(
            1
            for layer in plan.model.layers[stage.layer_start : stage.layer_end]
            if layer.kind is LayerKind.BLOCK
        )
        fewest = _fewest_recomputed(
            none_bytes=memory[Recompute.NONE],
            all_bytes=memory[Recompute.FULL],
            available_bytes=device.memory_bytes,
            blocks=blocks,
        )
        if fewest is None:
            cells = "does not fit | |"
        else:
            saved = (pass_s[Recompute.FULL] - pass_s[Recompute.NONE]) * fewest / max(blocks, 1)
            cells = f"{fewest} | {pass_s[Recompute.NONE]:.3f} | {pass_s[Recompute.FULL]:.3f}"
            cells += f" | {pass_s[Recompute.NONE] + saved:.3f}"
        print(
            f"| {index} | {device.name} | {blocks} | {stage.tensor_parallel_degree} | "
            f"{stage.recompute.value} | {budget} | {memory[Recompute.NONE] / GiB:.1f} | "
            f"{memory[Recompute.FULL] / GiB:.1f} | {device.memory_bytes / GiB:.1f} | {cells}"
        )


def _with_stage(plan: Plan, index: int, **changes: Any) -> Plan:
    """``plan`` with stage ``index`` changed as ``dataclasses.replace`` changes it."""
    stage = replace(plan.stages[index], **changes)
    return replace(plan, stages=(*plan.stages[:index], stage, *plan.stages[index + 1 :]))


def _fewest_recomputed(
    *, none_bytes: float, all_bytes: float, available_bytes: float, blocks: int
) -> int | None:
    """The fewest of ``blocks`` recomputed blocks whose memory, linear between none and
    all recomputed, fits ``available_bytes`` (None: not even all of them)."""
    if none_bytes <= available_bytes:
        return 0
    if all_bytes > available_bytes or blocks == 0:
        return None
    per_block = (none_bytes - all_bytes) / blocks
    return min(blocks, math.ceil((none_bytes - available_bytes) / per_block))


def print_raised_budgets(plan: Plan) -> None:
    """Part 2 (module docstring)."""
    little = tuple(
        replace(stage, max_in_flight=None) if stage.recompute.checkpoints else stage
        for stage in plan.stages
    )
    print("In-flight budgets of the recomputed stages")
    print("| budgets | estimated step (s) | simulated step (s) |")
    print("|---|---:|---:|")
    for name, variant in (
        ("as planned (raised)", plan),
        ("Little's law", replace(plan, stages=little, predicted=None)),
    ):
        estimated = estimate_plan(variant).step_time_s
        simulated = simulate(variant).step_time_s
        print(f"| {name} | {estimated:.2f} | {simulated:.2f} |")


def print_orders(cluster: ClusterSpec, *, model: ModelSpec, job: JobSpec, bound: float) -> None:
    """Part 3 (module docstring): the best orders crossing between the sites once."""
    strategy = PIEBALD.for_cluster_of(cluster.num_gpus)
    settings = SearchSettings.for_cluster(cluster.num_gpus, workers=1)
    everyone = frozenset(node.index for node in cluster.nodes)
    units = build_units(cluster, precision=job.precision, nodes=everyone)
    rows: list[tuple[float, str, int]] = []
    for order in site_contiguous_orders(units):
        state = SearchState(
            cluster, model=model, job=job, strategy=strategy, curve=DEFAULT_CURVE, settings=settings
        )
        scans = scan_depths(state, order, 1, refine=False)
        best = min(scans, key=lambda scan: scan.proxy_s)
        scan_depths(state, order, 1, refine=True, depths=(best.depth,))
        finite = (c for c in state.candidates.values() if math.isfinite(c.proxy_s))
        ranked = sorted(finite)[:BUILT_PER_ORDER]
        built = [state.assemble(state.polished(candidate)) for candidate in ranked]
        fits = [plan for plan in built if plan is not None]
        names = " -> ".join(_class_names(order))
        if not fits:
            rows.append((0.0, names, 0))
            continue
        fastest = max(fits, key=lambda scored: scored.estimate.tokens_per_s)
        rows.append((fastest.estimate.tokens_per_s, names, len(fastest.plan.idle_ranks)))
    rows.sort(reverse=True)
    print(f"Orders of the node classes crossing between sites once: {len(rows)}, the best ten")
    print("| order | tokens/s | of the bound | idle GPUs |")
    print("|---|---:|---:|---:|")
    for tokens_per_s, names, idle in rows[:10]:
        print(f"| {names} | {tokens_per_s:,.0f} | {tokens_per_s / bound:.2f} | {idle} |")


def site_contiguous_orders(units: Sequence[Unit]) -> list[tuple[Unit, ...]]:
    """Every order of the units' node classes that keeps each site's classes together and
    each domain's (site and NIC class, ``Unit.domain``) together inside it, the units of a
    class in rank order."""
    by_class: dict[int, list[Unit]] = {}
    for unit in units:
        by_class.setdefault(unit.group_index, []).append(unit)
    domains: dict[tuple[str, str], list[int]] = {}
    for group_index, members in by_class.items():
        domains.setdefault(members[0].domain, []).append(group_index)
    sites: dict[str, list[tuple[str, str]]] = {}
    for domain in domains:
        sites.setdefault(domain[0], []).append(domain)

    def inside(site: str) -> list[list[int]]:
        orders = []
        for domain_order in itertools.permutations(sites[site]):
            per_domain = [itertools.permutations(domains[d]) for d in domain_order]
            for inner in itertools.product(*per_domain):
                orders.append([g for classes in inner for g in classes])
        return orders

    orders: list[tuple[Unit, ...]] = []
    for site_order in itertools.permutations(sites):
        for parts in itertools.product(*(inside(site) for site in site_order)):
            classes = [g for part in parts for g in part]
            orders.append(
                tuple(u for g in classes for u in sorted(by_class[g], key=lambda u: u.ranks))
            )
    return orders


def _class_names(order: Sequence[Unit]) -> list[str]:
    names: list[str] = []
    for unit in order:
        if not names or names[-1] != unit.device.name:
            names.append(unit.device.name)
    return names


if __name__ == "__main__":
    sys.exit(main())
