"""Which process groups a plan needs, who owns what in each, and the order they are made in.

Pure (no torch): :mod:`piebald.runtime.distributed.groups` turns this into ``new_group`` calls.

Groups, each one explicit rank tuple (stages may have any size; nothing assumes a grid):

* **used** — every rank the plan uses (the "world" of gradient-norm and overflow
  all-reduces; it equals the whole world unless the plan leaves GPUs idle).
* **stage i** — the data-parallel group of stage i: it reduce-scatters the stage's flat
  gradient and all-gathers its parameters.
* **tensor** — at tensor-parallel degree t > 1, each tensor group of a stage (t ranks of
  one node, ``Stage.tensor_groups``): the collectives inside every split block (gathers
  and reduce-scatters sequence parallel, all-reduces not: ``models.tensor_ops``) and the
  leader handing received activations and gradients to its members.
* **data-parallel** — at degree t > 1, the ranks at position p of every tensor group of a
  stage (``Stage.data_parallel_group``): they hold the same slice of the split block
  weights, so that slice's flat buffer is sharded over them, each owning t times its plan
  fraction (the group's fraction, so the shares sum to 1 over the group).
* **tied** — when the model ties its LM head to its embedding and the plan has more than
  one stage: every rank of the first stage (each holds the embedding) and of the last
  stage (each holds the head, a replica of the same weight).

The tied weight's choice. Micro-batch j uses the embedding on its first-stage rank and the
head on its last-stage rank; for the two to be one weight, every replica on those ranks
must hold the same values after every step, and its gradient must be the sum of all
embedding uses and all head uses. piebald keeps the tied weight out of the stage buffers
and gives it a flat buffer of its own, sharded over the tied group (fractions: each first
stage rank's stage fraction times 1/2, each last stage rank's times 1/2). Then one
uneven reduce-scatter over the tied group sums every rank's local gradient (embedding and
head contributions alike) straight onto the owners, each element of the weight is owned
exactly once (so the global gradient norm counts it once), and one all-gather returns the
same updated values to every replica. Its parameters are never released between passes:
the two stages run their passes at different times, so a per-pass gather over the tied
group would couple them (and could deadlock a pipeline).

Weights a tensor group replicates (norms, embedding, head; ``models.tensor_parallel``). Its
members compute the same gradient for them, so summing every member's copy would count it
t times. Their bucket (the stage's, or the tied one) is therefore sharded over the tensor
groups' leaders only, each owning its group's fraction; the other members are
``replicas``: they add nothing to the sum, own nothing (so the global gradient norm counts
each element once, as single-process training does) and receive the updated values from
the owners like everyone else, so the copies stay bit for bit equal. (Under ZeRO-2/3 the
streamed buckets of those weights run their collectives among the leaders alone, who pass
the gathered values on over their tensor groups: ``flat_bucket``'s routed buckets.)

Creation order: every rank calls ``new_group`` for every distinct rank tuple of size > 1
(a group of one rank communicates with nobody), in one global sorted order, so the calls
cannot interleave differently on different ranks and hang.
"""

from __future__ import annotations

from dataclasses import dataclass

from piebald.specs.plan import Plan, Stage, ZeroMode

__all__ = ["BucketPlacement", "GroupLayout", "build_group_layout"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BucketPlacement:
    """A flat buffer's group and ownership: ``fractions[i]`` belongs to ``ranks[i]``.

    Ranks are sorted ascending, which is the order ``new_group`` numbers them in, so shard
    i of the buffer belongs to group rank i and collectives need no permutation.
    """

    ranks: tuple[int, ...]
    fractions: tuple[float, ...]
    zero: ZeroMode
    # Ranks whose gradient is a copy of a tensor-group leader's: they add nothing to the sum
    # and own nothing (module docstring).
    replicas: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if list(self.ranks) != sorted(set(self.ranks)):
            raise ValueError(f"BucketPlacement ranks {list(self.ranks)}: expected sorted, unique")
        if len(self.fractions) != len(self.ranks):
            raise ValueError(
                f"BucketPlacement: {len(self.fractions)} fractions for {len(self.ranks)} ranks"
            )
        if any(self.fraction_of(rank) for rank in self.replicas if rank in self.ranks):
            raise ValueError(f"BucketPlacement: replicas {sorted(self.replicas)} own nothing")

    def fraction_of(self, rank: int) -> float:
        return self.fractions[self.ranks.index(rank)]


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLayout:
    world_size: int
    used_ranks: tuple[int, ...]  # sorted
    stages: tuple[BucketPlacement, ...]  # one per stage, in stage order
    tied: BucketPlacement | None  # the tied embedding/head weight, when it spans stages
    # Per stage, its tensor groups (sorted ranks) and, by position, the placement of the
    # split block weights over each data-parallel group; both empty at degree 1.
    tensor: tuple[tuple[tuple[int, ...], ...], ...] = ()
    data_parallel: tuple[tuple[BucketPlacement, ...], ...] = ()

    def rank_tuples(self) -> tuple[tuple[int, ...], ...]:
        """Every distinct group of more than one rank, in the one global creation order."""
        tuples = {self.used_ranks, *(stage.ranks for stage in self.stages)}
        for groups in self.tensor:
            tuples.update(groups)
        for placements in self.data_parallel:
            tuples.update(placement.ranks for placement in placements)
        if self.tied is not None:
            tuples.add(self.tied.ranks)
        return tuple(sorted(t for t in tuples if len(t) > 1))

    def tensor_group_of(self, rank: int) -> tuple[int, ...] | None:
        """The sorted ranks of ``rank``'s tensor group (None at degree 1 or when idle)."""
        for groups in self.tensor:
            for group in groups:
                if rank in group:
                    return group
        return None

    def data_parallel_of(self, rank: int) -> BucketPlacement | None:
        """Where ``rank``'s slice of the split block weights is sharded (None at degree 1)."""
        for placements in self.data_parallel:
            for placement in placements:
                if rank in placement.ranks:
                    return placement
        return None

    def stage_index_of(self, rank: int) -> int | None:
        for index, stage in enumerate(self.stages):
            if rank in stage.ranks:
                return index
        return None


def _owned_shares(stage: Stage, scale: float = 1.0) -> dict[int, float]:
    """Each rank's share of a weight every rank of the stage holds whole: its fraction, or
    under tensor parallelism its group's (t x its own) on the leader and 0 on the members
    (module docstring)."""
    t = stage.tensor_parallel_degree
    leaders = set(stage.leaders)
    return {
        rank: scale * t * f if rank in leaders else 0.0
        for rank, f in zip(stage.ranks, stage.shard_fraction, strict=True)
    }


def _replicas(stage: Stage) -> frozenset[int]:
    return frozenset(stage.ranks) - set(stage.leaders)


def _placement(
    shares: dict[int, float], zero: ZeroMode, replicas: frozenset[int]
) -> BucketPlacement:
    ranks = tuple(sorted(shares))
    return BucketPlacement(
        ranks=ranks, fractions=tuple(shares[r] for r in ranks), zero=zero, replicas=replicas
    )


def _stage_placement(plan: Plan, index: int) -> BucketPlacement:
    stage = plan.stages[index]
    return _placement(_owned_shares(stage), stage.zero, _replicas(stage))


def _data_parallel_placements(stage: Stage) -> tuple[BucketPlacement, ...]:
    """By position: the split block weights over that position's data-parallel group."""
    t = stage.tensor_parallel_degree
    if t == 1:
        return ()
    fraction = dict(zip(stage.ranks, stage.shard_fraction, strict=True))
    return tuple(
        _placement(
            {rank: t * fraction[rank] for rank in stage.data_parallel_group(stage.ranks[p])},
            stage.zero,
            frozenset(),
        )
        for p in range(t)
    )


def _tied_placement(plan: Plan) -> BucketPlacement | None:
    if not plan.model.arch.tie_embeddings or plan.num_stages == 1:
        return None
    first, last = plan.stages[0], plan.stages[-1]
    share = _owned_shares(first, 0.5) | _owned_shares(last, 0.5)
    # Optimizer state sharded, parameters resident on every holder (module docstring).
    return _placement(share, ZeroMode.OPTIMIZER, _replicas(first) | _replicas(last))


def build_group_layout(plan: Plan) -> GroupLayout:
    return GroupLayout(
        world_size=plan.cluster.num_gpus,
        used_ranks=tuple(sorted(plan.used_ranks)),
        stages=tuple(_stage_placement(plan, i) for i in range(plan.num_stages)),
        tied=_tied_placement(plan),
        tensor=tuple(
            tuple(tuple(sorted(group)) for group in stage.tensor_groups)
            if stage.tensor_parallel_degree > 1
            else ()
            for stage in plan.stages
        ),
        data_parallel=tuple(_data_parallel_placements(stage) for stage in plan.stages),
    )
