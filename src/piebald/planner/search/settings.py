"""The search's thresholds, and the small-cluster switch decided once per search."""

from __future__ import annotations

from dataclasses import dataclass

from piebald.planner.search_units import GPU_UNITS_UP_TO

__all__ = ["ALL_SIZES_UP_TO", "MICRO_BATCH_SIZES", "SearchSettings"]

MICRO_BATCH_SIZES = (1, 2, 4, 8, 16)
ALL_SIZES_UP_TO = GPU_UNITS_UP_TO  # GPUs; small clusters get the thorough treatment


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSettings:
    """How thorough a search is. A small cluster (at most ALL_SIZES_UP_TO GPUs, where
    structures are cheap to price) gets the thorough treatment: every cut combination up to
    a larger count, neighbouring depths when refining, every micro-batch size and order for
    idle subsets, every subset of a few nodes, more plans built exactly."""

    num_gpus: int
    small_cluster: bool
    micro_batch_sizes: tuple[int, ...] = MICRO_BATCH_SIZES
    # Cut combinations per (order, depth) tried one by one: up to this many in a small
    # cluster, up to this many per stage in a large one; beyond, a local search.
    exhaustive_cuts_small: int = 64
    exhaustive_cuts_per_stage: int = 2
    depth_patience: int = 3  # stop deepening after this many depths without improvement
    size_patience: float = 1.1  # a micro-batch size this much slower than the best ends the scan
    top_refined: int = 2  # coarse results whose cuts get a local search
    # An idle subset's best scan this much slower than the best structure so far gets no
    # local search, most of a subset's time: to beat the best it would have to gain 23%,
    # where on the benchmark clusters a subset's local search gained 1-17% (the 4,096-GPU
    # scaling cluster's nine subsets; the six-type 1,024-GPU cluster's: 1-6%).
    subset_refine_margin: float = 1.3
    subsets_refined_first: int = 2  # before the others are held to the bar they leave
    local_search_rounds: int = 2
    all_node_subsets_up_to: int = 4  # nodes; small clusters also try leaving any nodes idle
    # Best structures (by the DP's estimate) built and priced exactly: this many, times
    # small_exact_factor in a small cluster. Pricing a plan exactly takes time in its GPUs
    # times its stages (every micro-batch's hop over every boundary): beyond
    # exact_full_up_to_gpus GPUs, fewer, so that work stays about what it is there (at
    # least min_exact).
    num_exact: int = 8
    small_exact_factor: int = 3
    exact_full_up_to_gpus: int = 4096
    min_exact: int = 2
    # Candidates built at most per plan wanted (the others do not fit memory when built).
    exact_tries_per_plan: int = 2
    num_runners_up: int = 4
    # A bigger per-GPU micro-batch must be this much faster per token to pay for its memory.
    size_gain: float = 1.01
    # Processes the scan, refinement, idle subsets and exact build run on
    # (``search.parallel``): small clusters price in a fraction of a second, less than
    # forking costs, so one there.
    workers: int = 1

    @classmethod
    def for_cluster(cls, num_gpus: int, *, workers: int = 1) -> SearchSettings:
        """The settings for ``num_gpus`` GPUs, using up to ``workers`` processes where the
        cluster is large."""
        if workers < 1:
            raise ValueError(f"workers = {workers}; expected at least 1")
        small = num_gpus <= ALL_SIZES_UP_TO
        return cls(num_gpus=num_gpus, small_cluster=small, workers=1 if small else workers)

    def most_exhaustive_cuts(self, depth: int) -> int:
        """Cut combinations of a pipeline of ``depth`` stages tried one by one."""
        if self.small_cluster:
            return self.exhaustive_cuts_small
        return self.exhaustive_cuts_per_stage * depth

    @property
    def num_exact_plans(self) -> int:
        """Plans built and priced exactly."""
        wanted = self.num_exact * (self.small_exact_factor if self.small_cluster else 1)
        if self.num_gpus > self.exact_full_up_to_gpus:
            wanted = max(
                self.min_exact, self.num_exact * self.exact_full_up_to_gpus // self.num_gpus
            )
        return wanted

    def refined_depths(self, depth: int) -> tuple[int, ...]:
        """Depths whose cuts get a local search around a winning ``depth``: its neighbours
        too where structures are cheap to price."""
        return (depth - 1, depth, depth + 1) if self.small_cluster else (depth,)
