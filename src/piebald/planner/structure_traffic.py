"""The boundary traffic of a structure, built from its stages' node signatures.

The planner prices thousands of structures before any has routes, so it cannot follow a
plan's pairs as the estimate does (``cost.traffic.plan_traffic``). It builds the same
records from what a structure fixes: per boundary, the slowest link between the two stages
(one GPU per node class on each side), whether the boundary leaves the node, and per stage
its nodes and its GPUs on its fullest node. The GPUs of a stage run in step, so those
sharing a node's NIC (or a receiver's port) send at once and split it; and a node's NIC
carries both of its stage's boundaries (activations out to the next stage, gradients out
to the previous one; in, the other way round). ``cost.traffic`` prices the hops.
"""

from __future__ import annotations

from dataclasses import dataclass

from piebald.cost.comm import p2p_time_s
from piebald.cost.precision import activation_message_bytes
from piebald.cost.traffic import BoundaryTraffic, Crossing, PairHop, Way
from piebald.planner.search_units import node_classes
from piebald.specs.cluster import ClusterSpec
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec

__all__ = ["NodeSignatures", "Signature", "SlowestLink", "StructureTraffic"]

Signature = tuple[tuple[int, int], ...]  # (node class, GPUs of the node in the stage)
Stages = tuple[tuple[int, ...], ...]


class NodeSignatures:
    """Per stage (its ranks), (node class, GPUs of the node in the stage) for each node, in
    rank order: identical node groups price the same, so the planner keys its caches by
    this."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.class_of = node_classes(cluster)
        self._cache: dict[tuple[int, ...], Signature] = {}

    def __call__(self, ranks: tuple[int, ...]) -> Signature:
        found = self._cache.get(ranks)
        if found is None:
            per_node: dict[int, int] = {}
            for rank in sorted(ranks):
                node = self.cluster.gpus[rank].node_index
                per_node[node] = per_node.get(node, 0) + 1
            found = self._cache[ranks] = tuple(
                (self.class_of[self.cluster.nodes[node].group_index], count)
                for node, count in per_node.items()
            )
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowestLink:
    """The slowest link between two neighbouring stages, and one activation's bytes."""

    latency_s: float
    bandwidth_bytes_per_s: float
    num_bytes: float

    @property
    def alone_s(self) -> float:
        """One activation over the link with nothing else on it."""
        return self.num_bytes / self.bandwidth_bytes_per_s


class StructureTraffic:
    """The boundaries of structures over one cluster, model and job (links cached by the
    stages' signatures)."""

    def __init__(
        self, cluster: ClusterSpec, *, model: ModelSpec, job: JobSpec, signatures: NodeSignatures
    ) -> None:
        self.cluster, self.model, self.job = cluster, model, job
        self.signatures = signatures
        self._links: dict[tuple[Signature, Signature, int, bool], SlowestLink] = {}

    def boundaries(self, stages: Stages, micro_batch_size: int) -> tuple[BoundaryTraffic, ...]:
        """Per boundary: its hop's pair (there over stage i's way out and stage i+1's way
        in, back the other way round) and the busy time of its busiest NIC or GPU port
        over the step."""
        num_micro_batches = self.job.global_batch_size / micro_batch_size
        p = len(stages)
        signatures = [self.signatures(ranks) for ranks in stages]
        num_nodes = [len(signature) for signature in signatures]
        most_per_node = [max(count for _, count in signature) for signature in signatures]
        node_of = [self.cluster.gpus[ranks[0]].node_index for ranks in stages]
        inter = [  # not both stages on one and the same node
            not (num_nodes[i] == num_nodes[i + 1] == 1 and node_of[i] == node_of[i + 1])
            for i in range(p - 1)
        ]
        links = [
            self.slowest_link(stages[i], stages[i + 1], micro_batch_size, inter=inter[i])
            for i in range(p - 1)
        ]

        def crossing(i: int, kind: bool) -> bool:
            """Boundary i exists and is inter-node (``kind``) or intra-node (not)."""
            return 0 <= i < p - 1 and inter[i] == kind

        # Streams one way over a resource: its senders, each sending at once, but no more
        # than its receivers, each receiving one at a time (cost.traffic).
        def out_streams(s: int, kind: bool, to: int) -> int:  # a NIC out, or a GPU's port
            return min(most_per_node[s], len(stages[to])) if kind else 1

        def in_streams(sender: int, receiver: int, kind: bool) -> int:  # into a NIC or GPU
            if not kind:
                return 1
            return min(len(stages[sender]), most_per_node[receiver])

        def load(i: int, s: int, kind: bool) -> float:
            """Seconds boundary i's activations (or gradients) keep one direction of a NIC
            of stage s (or a GPU's port) busy over the step, if it crosses that way."""
            if not crossing(i, kind):
                return 0.0
            per = num_nodes[s] if kind else len(stages[s])
            return links[i].alone_s * num_micro_batches / per

        nic = [0.0] * p  # per stage: one direction of each of its nodes' NICs
        port = [0.0] * p  # ... of each of its GPUs' ports
        for i, link in enumerate(links):
            for s in (i, i + 1):
                if inter[i]:
                    nic[s] += link.alone_s * num_micro_batches / num_nodes[s]
                else:
                    port[s] += link.alone_s * num_micro_batches / len(stages[s])
        boundaries = []
        for i, link in enumerate(links):
            k = inter[i]
            # Activations: stage i's way out, stage i+1's way in.
            there = _way(
                link,
                (out_streams(i, k, i + 1), load(i - 1, i, k)),
                (in_streams(i, i + 1, k), load(i + 1, i + 1, k)),
            )
            # Gradients: stage i+1's way out, stage i's way in.
            back = _way(
                link,
                (out_streams(i + 1, k, i), load(i + 1, i + 1, k)),
                (in_streams(i + 1, i, k), load(i - 1, i, k)),
            )
            busy_s = max(nic[i], nic[i + 1]) if k else max(port[i], port[i + 1])
            boundaries.append(
                BoundaryTraffic(
                    busy_s=busy_s,
                    pairs=(PairHop(num_bytes=link.num_bytes, there=there, back=back),),
                )
            )
        return tuple(boundaries)

    def slowest_link(
        self,
        sender: tuple[int, ...],
        receiver: tuple[int, ...],
        micro_batch_size: int,
        *,
        inter: bool,
    ) -> SlowestLink:
        """The slowest link between two neighbouring stages (one GPU per node class on each
        side), with one micro-batch's activation from its sender."""
        key = (self.signatures(sender), self.signatures(receiver), micro_batch_size, inter)
        found = self._links.get(key)
        if found is None:
            class_of = self.signatures.class_of
            left = {class_of[self.cluster.gpus[r].group_index]: r for r in sender}
            right = {class_of[self.cluster.gpus[r].group_index]: r for r in receiver}
            hops = [
                (
                    activation_message_bytes(
                        self.cluster.device_of(a),
                        precision=self.job.precision,
                        micro_batch_size=micro_batch_size,
                        seq_len=self.job.seq_len,
                        hidden_size=self.model.arch.hidden_size,
                    ),
                    self.cluster.link_between(a, b),
                )
                for a in left.values()
                for b in right.values()
            ]
            num_bytes, slowest = max(
                hops, key=lambda hop: p2p_time_s(num_bytes=hop[0], link=hop[1])
            )
            found = self._links[key] = SlowestLink(
                latency_s=slowest.latency_s,
                bandwidth_bytes_per_s=slowest.bandwidth_bytes_per_s,
                num_bytes=num_bytes,
            )
        return found


def _way(link: SlowestLink, out: tuple[int, float], into: tuple[int, float]) -> Way:
    """A way over ``link`` crossing the sender's resource out and the receiver's in, each
    given as (streams, the seconds its other traffic keeps it busy)."""
    return Way(
        latency_s=link.latency_s,
        bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
        crossings=tuple(
            Crossing(
                streams=streams,
                capacity_bytes_per_s=link.bandwidth_bytes_per_s,
                background_s=background_s,
            )
            for streams, background_s in (out, into)
        ),
    )
