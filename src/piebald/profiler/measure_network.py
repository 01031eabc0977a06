"""Measure links and collectives with torch.distributed and fit alpha-beta to them.

Imports torch: only ``piebald profile network`` and tests load this module.

Which measurements (:func:`network_measurements`): point-to-point between one GPU of every
pair of node groups (two nodes of the same group too, when it has two), between two GPUs
inside a node of each group, and all-reduce / reduce-scatter / all-gather over the GPUs of
a node, of a node group, and of the whole cluster (the data-parallel groups plans build).
Each runs over message sizes (1 MiB .. 1 GiB on real clusters), after a warm-up, and keeps
the median of a few repetitions; a point-to-point time is half a ping-pong round trip.

Under ``torchrun`` the ranks are the cluster's global ranks (rank order of
``piebald.specs.cluster``) and every rank runs :func:`run_measurements`; with ``--emulate``
a few gloo processes on loopback play the GPUs (every pair is then the same loopback link;
it tests the machinery, not a network). Emulation opens no socket beyond loopback, as emulated
training does: the processes meet through a file store in a private temporary directory (a
``tcp://`` rendezvous would start a TCPStore listening on every interface, whatever address
it is given) and gloo's own connections use the loopback interface.
They die with the command that started them, even when it is SIGKILLed
(``runtime.parent_watch``).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn

from piebald.profiler.fit import fit_alpha_beta
from piebald.profiler.records import NetworkKey, NetworkKind, NetworkProfile, Provenance
from piebald.runtime.parent_watch import die_with_parent, exit_on_sigterm
from piebald.runtime.scratch import run_scratch
from piebald.specs.cluster import ClusterSpec, Node

__all__ = [
    "Measurement",
    "emulate_network",
    "network_measurements",
    "run_measurements",
    "torchrun_network",
]

MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    key: NetworkKey
    ranks: tuple[int, ...]  # global ranks taking part; the first one records the times


def network_measurements(cluster: ClusterSpec) -> list[Measurement]:
    """Every measurement for ``cluster``, in one order all ranks agree on."""
    out: list[Measurement] = []
    nodes_of_group: dict[int, list[Node]] = {}
    for node in cluster.nodes:
        nodes_of_group.setdefault(node.group_index, []).append(node)
    groups = cluster.node_groups
    for i, group_a in enumerate(groups):
        nodes_a = nodes_of_group[i]
        if nodes_a[0].num_gpus >= 2:
            rank = nodes_a[0].first_rank
            key = NetworkKey(
                kind=NetworkKind.P2P,
                scope="intra-node",
                groups=(group_a.name, group_a.name),
                num_ranks=2,
            )
            out.append(Measurement(key=key, ranks=(rank, rank + 1)))
        for j in range(i, len(groups)):
            nodes_b = nodes_of_group[j]
            if i == j and len(nodes_a) < 2:
                continue
            other = nodes_b[1] if i == j else nodes_b[0]
            key = NetworkKey(
                kind=NetworkKind.P2P,
                scope="inter-node",
                groups=(group_a.name, groups[j].name),
                num_ranks=2,
            )
            out.append(Measurement(key=key, ranks=(nodes_a[0].first_rank, other.first_rank)))
    rank_sets: dict[tuple[int, ...], tuple[str, ...]] = {}
    for i, group in enumerate(groups):
        node = nodes_of_group[i][0]
        rank_sets.setdefault(
            tuple(range(node.first_rank, node.first_rank + node.num_gpus)), (group.name,)
        )
        ranks = tuple(gpu.rank for gpu in cluster.gpus if gpu.group_index == i)
        rank_sets.setdefault(ranks, (group.name,))
    rank_sets.setdefault(tuple(range(cluster.num_gpus)), tuple(group.name for group in groups))
    for ranks, names in rank_sets.items():
        if len(ranks) < 2:
            continue
        for kind in (NetworkKind.ALL_REDUCE, NetworkKind.REDUCE_SCATTER, NetworkKind.ALL_GATHER):
            key = NetworkKey(kind=kind, scope="group", groups=names, num_ranks=len(ranks))
            out.append(Measurement(key=key, ranks=ranks))
    return out


def _time_once(
    measurement: Measurement, *, rank: int, num_bytes: int, group: Any, device: torch.device
) -> float:
    """One timed operation, as seen by ``rank`` (wall clock around a synchronised op)."""
    kind, ranks = measurement.key.kind, measurement.ranks
    n = len(ranks)
    elements = max(n, num_bytes // 4)
    elements -= elements % n
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if kind is NetworkKind.P2P:
        buffer = torch.empty(elements, dtype=torch.float32, device=device)
        peer = ranks[1] if rank == ranks[0] else ranks[0]
        start = time.perf_counter()
        if rank == ranks[0]:
            dist.send(buffer, peer)
            dist.recv(buffer, peer)
        else:
            dist.recv(buffer, peer)
            dist.send(buffer, peer)
        return (time.perf_counter() - start) / 2  # one way: half the round trip
    full = torch.ones(elements, dtype=torch.float32, device=device)
    shard = torch.empty(elements // n, dtype=torch.float32, device=device)
    dist.barrier(group=group)
    start = time.perf_counter()
    if kind is NetworkKind.ALL_REDUCE:
        dist.all_reduce(full, group=group)
    elif kind is NetworkKind.REDUCE_SCATTER:
        dist.reduce_scatter(shard, list(full.chunk(n)), group=group)
    else:
        dist.all_gather(list(full.chunk(n)), shard, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run_measurements(
    measurements: list[Measurement],
    *,
    message_bytes: tuple[int, ...],
    num_warmup: int,
    num_repeats: int,
    device: torch.device,
) -> list[NetworkProfile]:
    """Run every measurement on this rank (all ranks call it); rank 0 returns the profiles.

    Process groups are created by every rank, in list order (torch.distributed requires it).
    """
    rank = dist.get_rank()
    groups: dict[tuple[int, ...], Any] = {}
    for m in measurements:
        if m.key.kind is not NetworkKind.P2P and m.ranks not in groups:
            groups[m.ranks] = dist.new_group(list(m.ranks))
    mine: dict[int, list[float]] = {}
    for index, measurement in enumerate(measurements):
        if rank in measurement.ranks:
            group = groups.get(measurement.ranks)
            medians = []
            for size in message_bytes:
                times = [
                    _time_once(measurement, rank=rank, num_bytes=size, group=group, device=device)
                    for _ in range(num_warmup + num_repeats)
                ][num_warmup:]
                medians.append(statistics.median(times))
            if rank == measurement.ranks[0]:
                mine[index] = medians
        dist.barrier()
    gathered: list[dict[int, list[float]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return []
    provenance = Provenance(
        host=socket.gethostname(),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        torch_version=torch.__version__,
        timer="perf_counter",
        num_warmup=num_warmup,
        num_repeats=num_repeats,
    )
    results: dict[int, list[float]] = {}  # measurement index -> median time per size
    for part in gathered:
        results.update(part or {})
    profiles = []
    sizes = tuple(float(size) for size in message_bytes)
    for index, measurement in enumerate(measurements):
        median_s = tuple(results[index])
        fit = fit_alpha_beta(sizes, median_s)
        profiles.append(
            NetworkProfile(
                key=measurement.key,
                backend=dist.get_backend(),
                message_bytes=sizes,
                time_s=median_s,
                latency_s=fit.latency_s,
                bandwidth_bytes_per_s=fit.bandwidth_bytes_per_s,
                provenance=provenance,
            )
        )
    return profiles


def _emulated_rank(
    rank: int,
    world_size: int,
    init_method: str,
    measurements: list[Measurement],
    message_bytes: tuple[int, ...],
    num_warmup: int,
    num_repeats: int,
    out_path: str,
    parent_pid: int,
) -> None:
    # Die with the command that started us, even SIGKILLed, and take its scratch along.
    die_with_parent(parent_pid, scratch=Path(out_path).parent)
    # gloo listens on the interface this names (else on the address the host name resolves
    # to); a user who sets it chooses another.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        profiles = run_measurements(
            measurements,
            message_bytes=message_bytes,
            num_warmup=num_warmup,
            num_repeats=num_repeats,
            device=torch.device("cpu"),
        )
        if rank == 0:
            from piebald.profiler.records import profile_to_dict

            Path(out_path).write_text(json.dumps([profile_to_dict(p) for p in profiles]))
    finally:
        dist.destroy_process_group()


def emulate_network(
    cluster: ClusterSpec,
    *,
    message_bytes: tuple[int, ...] = (MIB, 4 * MIB, 16 * MIB),
    num_warmup: int = 1,
    num_repeats: int = 3,
    max_processes: int = 4,
) -> list[NetworkProfile]:
    """The measurements of ``cluster`` run by gloo processes on loopback: each pair on
    processes 0 and 1, each collective over its first ``min(n, max_processes)`` processes
    (the key keeps the cluster's group names and says how many processes ran it)."""
    from piebald.profiler.records import network_from_dict
    from piebald.specs.fields import Fields

    planned = network_measurements(cluster)
    world_size = min(max_processes, max(2, max(len(m.ranks) for m in planned)))
    local = []
    for m in planned:
        ranks = tuple(range(min(len(m.ranks), world_size)))
        local.append(Measurement(key=replace(m.key, num_ranks=len(ranks)), ranks=ranks))
    # Clean-up: SIGTERM (and SIGINT, any error) stops the workers, then removes the scratch
    # directory; a SIGKILLed parent's workers remove it themselves (``die_with_parent``).
    # ``kill -9`` of the whole process group (a scheduler ending the job) kills the parent
    # and every worker at once, so no process is left to remove ``$TMPDIR/piebald-network-*``:
    # the next run does (``run_scratch``); multiprocessing's ``pymp-*`` stays until the
    # machine's tmp cleaner or a reboot removes it.
    with exit_on_sigterm(), run_scratch("piebald-network-") as scratch:
        out_path = os.path.join(scratch, "profiles.json")
        context = spawn(  # type: ignore[no-untyped-call]
            _emulated_rank,
            args=(
                world_size,
                f"file://{Path(scratch) / 'store'}",
                local,
                message_bytes,
                num_warmup,
                num_repeats,
                out_path,
                os.getpid(),
            ),
            nprocs=world_size,
            join=False,
        )
        try:
            while not context.join():
                pass
        finally:  # stopped early: the workers go before their scratch directory does
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            for process in context.processes:
                process.join()
        data = json.loads(Path(out_path).read_text())
    return [network_from_dict(Fields(entry, source="emulation")) for entry in data]


def torchrun_network(
    cluster: ClusterSpec,
    *,
    message_bytes: tuple[int, ...],
    num_warmup: int = 1,
    num_repeats: int = 3,
) -> list[NetworkProfile]:
    """Under ``torchrun`` with one process per GPU of ``cluster`` (global ranks in the
    cluster's rank order): NCCL on GPUs, gloo otherwise. Rank 0 returns the profiles."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    try:
        if dist.get_world_size() != cluster.num_gpus:
            raise ValueError(
                f"torchrun started {dist.get_world_size()} processes; cluster "
                f"{cluster.name!r} has {cluster.num_gpus} GPUs (one process per GPU)"
            )
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        return run_measurements(
            network_measurements(cluster),
            message_bytes=message_bytes,
            num_warmup=num_warmup,
            num_repeats=num_repeats,
            device=device,
        )
    finally:
        dist.destroy_process_group()
