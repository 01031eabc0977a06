"""Which process groups a plan needs, who owns what in each, and the order they are made in.

Pure (no torch): :mod:`piebald.runtime.distributed.groups` turns this into ``new_group`` calls.

Groups, each one explicit rank tuple (stages may have any size; nothing assumes a grid):

* **used** — every rank the plan uses (the "world" of gradient-norm and overflow
  all-reduces; it equals the whole world unless the plan leaves GPUs idle).
* **stage i** — the data-parallel group of stage i: it reduce-scatters the stage's flat
  gradient and all-gathers its parameters.
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

Creation order: every rank calls ``new_group`` for every distinct rank tuple of size > 1
(a group of one rank communicates with nobody), in one global sorted order, so the calls
cannot interleave differently on different ranks and hang.
"""

from __future__ import annotations

from dataclasses import dataclass

from piebald.specs.plan import Plan, ZeroMode

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

    def __post_init__(self) -> None:
        if list(self.ranks) != sorted(set(self.ranks)):
            raise ValueError(f"BucketPlacement ranks {list(self.ranks)}: expected sorted, unique")
        if len(self.fractions) != len(self.ranks):
            raise ValueError(
                f"BucketPlacement: {len(self.fractions)} fractions for {len(self.ranks)} ranks"
            )

    def fraction_of(self, rank: int) -> float:
        return self.fractions[self.ranks.index(rank)]


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLayout:
    world_size: int
    used_ranks: tuple[int, ...]  # sorted
    stages: tuple[BucketPlacement, ...]  # one per stage, in stage order
    tied: BucketPlacement | None  # the tied embedding/head weight, when it spans stages

    def rank_tuples(self) -> tuple[tuple[int, ...], ...]:
        """Every distinct group of more than one rank, in the one global creation order."""
        tuples = {self.used_ranks, *(stage.ranks for stage in self.stages)}
        if self.tied is not None:
            tuples.add(self.tied.ranks)
        return tuple(sorted(t for t in tuples if len(t) > 1))

    def stage_index_of(self, rank: int) -> int | None:
        for index, stage in enumerate(self.stages):
            if rank in stage.ranks:
                return index
        return None


def _stage_placement(plan: Plan, index: int) -> BucketPlacement:
    stage = plan.stages[index]
    pairs = sorted(zip(stage.ranks, stage.shard_fraction, strict=True))
    return BucketPlacement(
        ranks=tuple(rank for rank, _ in pairs),
        fractions=tuple(fraction for _, fraction in pairs),
        zero=stage.zero,
    )


def _tied_placement(plan: Plan) -> BucketPlacement | None:
    if not plan.model.arch.tie_embeddings or plan.num_stages == 1:
        return None
    first, last = plan.stages[0], plan.stages[-1]
    share = {rank: 0.5 * f for rank, f in zip(first.ranks, first.shard_fraction, strict=True)}
    share.update({rank: 0.5 * f for rank, f in zip(last.ranks, last.shard_fraction, strict=True)})
    ranks = tuple(sorted(share))
    # Optimizer state sharded, parameters resident on every holder (module docstring).
    return BucketPlacement(
        ranks=ranks, fractions=tuple(share[r] for r in ranks), zero=ZeroMode.OPTIMIZER
    )


def build_group_layout(plan: Plan) -> GroupLayout:
    return GroupLayout(
        world_size=plan.cluster.num_gpus,
        used_ranks=tuple(sorted(plan.used_ranks)),
        stages=tuple(_stage_placement(plan, i) for i in range(plan.num_stages)),
        tied=_tied_placement(plan),
    )
