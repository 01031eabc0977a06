"""Fallback plans made ahead of time: the plan for each single node loss, written next to
the plan, so that elastic training recovers from a lost node by reading a file instead of
searching (a search of a 1,024-GPU cluster takes seconds to minutes; reading its plan back
well under one).

Nodes of one group are identical, so the sub-cluster left after losing any one node of
group g has the same shape (the same groups with the same counts, devices and links; only
its name and hosts differ), and so the same plan: one fallback plan per node group stands
for the loss of every node of the group. Each is :func:`~piebald.planner.replan.replan`'s
answer for that loss, stored as ``fallback-<key>.json``, the key a hash of the
sub-cluster's shape (:func:`fallback_key`); :func:`find_fallback_plan` finds the file for a
membership by the same key.

Pure planning besides the files: no torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from piebald.errors import SpecError
from piebald.planner.replan import Infeasible, replan
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import cluster_to_dict
from piebald.specs.membership import Membership
from piebald.specs.plan import Plan
from piebald.specs.plan_io import load_plan, plan_to_dict, save_plan

__all__ = [
    "FALLBACK_PREFIX",
    "FallbackPlans",
    "fallback_file_name",
    "fallback_key",
    "find_fallback_plan",
    "plan_for_live_nodes",
    "single_loss_memberships",
    "write_fallback_plans",
]

log = logging.getLogger(__name__)

FALLBACK_PREFIX = "fallback-"

# What a refusal to replace a fallback file says to do (there is no --force for them).
_KEEP_HINT = "it holds another plan: remove it, or write the fallback plans to another directory"


def _shape(cluster: ClusterSpec) -> dict[str, Any]:
    """``cluster`` as its file says it, without its name, hosts and custom GPU types no
    group uses (a plan file keeps only those used): what its plan depends on (groups
    with counts, devices and links; the custom types they use; site links)."""
    data = cluster_to_dict(cluster)
    del data["name"]
    for group in data["nodes"]:
        group.pop("hosts", None)
    used = {group["gpu"] for group in data["nodes"]}
    types = [device for device in data.pop("gpu_types", ()) if device["name"] in used]
    if types:
        data["gpu_types"] = types
    return data


def fallback_key(cluster: ClusterSpec) -> str:
    """A short stable key of ``cluster``'s shape: equal for the sub-clusters left after
    losing any one node of the same group (their names and hosts are not part of it), and
    different where a group's count, device, GPUs per node or links differ."""
    text = json.dumps(_shape(cluster), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def fallback_file_name(cluster: ClusterSpec) -> str:
    """The file name of the fallback plan for the (sub-)cluster ``cluster``."""
    return f"{FALLBACK_PREFIX}{fallback_key(cluster)}.json"


def single_loss_memberships(cluster: ClusterSpec) -> tuple[Membership, ...]:
    """One membership per node group of ``cluster``: every node but the group's last (by
    symmetry, the loss of any node of the group), in group order; none where no node would
    remain (a cluster of one node)."""
    if len(cluster.nodes) < 2:
        return ()
    everyone = Membership.everyone(cluster)
    last_of_group = {node.group_index: node.name for node in cluster.nodes}
    return tuple(
        everyone.without([last_of_group[index]]) for index in range(len(cluster.node_groups))
    )


def _lost(membership: Membership) -> str:
    """The names of the nodes ``membership`` lacks, comma-separated."""
    live = set(membership.live)
    return ", ".join(node.name for node in membership.cluster.nodes if node.name not in live)


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackPlans:
    """What :func:`write_fallback_plans` did: ``written``, the fallback plan files (one per
    node group whose loss leaves a feasible cluster, in group order); ``infeasible``, the
    node (one per group) whose loss leaves nodes that cannot hold the model."""

    written: tuple[Path, ...]
    infeasible: tuple[str, ...]


def write_fallback_plans(
    plan: Plan,
    directory: str | Path,
    *,
    progress: Callable[[float, str], None] | None = None,
    workers: int | None = None,
    flag: str = "directory",
) -> FallbackPlans:
    """For each single node loss of ``plan.cluster`` (:func:`single_loss_memberships`),
    ``replan(plan, membership)`` saved as ``directory/fallback-<key>.json`` (the directory
    is created). A file already there is kept where it holds the same plan, and is an
    :class:`~piebald.outputs.OutputError` naming ``flag`` where it holds another (never
    replaced). A loss no plan fits is skipped and listed in ``infeasible``.
    ``progress(fraction, message)``: called after each fallback plan (the lost node and
    the plan's tokens/s); ``workers``: as in the search."""
    folder = Path(directory)
    memberships = single_loss_memberships(plan.cluster)
    written: list[Path] = []
    infeasible: list[str] = []
    for index, membership in enumerate(memberships):
        lost = _lost(membership)
        try:
            fallback = replan(plan, membership, workers=workers)
        except Infeasible:
            infeasible.append(lost)
            message = f"without {lost}: no plan fits"
        else:
            path = folder / fallback_file_name(membership.sub_cluster())
            _save_once(fallback, path, flag=flag)
            written.append(path)
            rate = fallback.predicted.tokens_per_s if fallback.predicted is not None else 0.0
            message = f"without {lost}: {rate:,.0f} tokens/s, {path.name}"
        if progress is not None:
            progress((index + 1) / len(memberships), message)
    return FallbackPlans(written=tuple(written), infeasible=tuple(infeasible))


def _save_once(plan: Plan, path: Path, *, flag: str) -> None:
    """Save ``plan`` at ``path`` unless that file already holds exactly it."""
    text = json.dumps(plan_to_dict(plan), indent=1) + "\n"
    if path.is_file() and not path.is_symlink():
        try:
            if path.read_text(encoding="utf-8") == text:
                return
        except (OSError, UnicodeDecodeError):
            pass  # unreadable: save_plan refuses it, naming the file
    save_plan(plan, path, flag=flag, hint=_KEEP_HINT)


def find_fallback_plan(
    directory: str | Path, membership: Membership, *, plan: Plan | None = None
) -> Plan | None:
    """The fallback plan in ``directory`` for ``membership``'s live nodes
    (:func:`write_fallback_plans`), on ``membership.sub_cluster()`` itself (its name and
    hosts); None where there is none. A file that cannot be read or parsed, or whose plan
    is for a cluster of another shape (or, given ``plan``, the plan the fallbacks were
    made from, for another model or job) is None too, with a logged warning: never an
    exception, since the caller can always search instead."""
    sub = membership.sub_cluster()
    path = Path(directory) / fallback_file_name(sub)
    try:
        if not path.exists():
            return None
        stored = load_plan(path)
    except (SpecError, OSError, ValueError) as error:
        log.warning("fallback plan %s not used: %s", path, error)
        return None
    if _shape(stored.cluster) != _shape(sub):
        log.warning(
            "fallback plan %s not used: it is for cluster %s, not one shaped like %s",
            path,
            stored.cluster.name,
            sub.name,
        )
        return None
    if plan is not None and (stored.model != plan.model or stored.job != plan.job):
        log.warning(
            "fallback plan %s not used: it is for model %s and job %s, not %s and %s",
            path,
            stored.model.name,
            stored.job,
            plan.model.name,
            plan.job,
        )
        return None
    try:
        return replace(stored, cluster=sub)
    except ValueError as error:  # cannot be, for a cluster of the same shape: say so
        log.warning("fallback plan %s not used: %s", path, error)
        return None


def plan_for_live_nodes(
    plan: Plan, membership: Membership, *, fallback_dir: str | Path | None = None
) -> Plan:
    """What elastic training runs on ``membership``'s live nodes: ``plan`` itself when
    every node is live, else the stored fallback plan in ``fallback_dir``
    (:func:`find_fallback_plan`), else a search (``replan``; :class:`Infeasible` when the
    live nodes cannot hold the model)."""
    if membership.is_everyone:
        return plan
    stored = (
        find_fallback_plan(fallback_dir, membership, plan=plan)
        if fallback_dir is not None
        else None
    )
    return stored if stored is not None else replan(plan, membership)
