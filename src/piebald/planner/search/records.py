"""What a search returns, and the records its phases pass on."""

from __future__ import annotations

from dataclasses import dataclass, field

from piebald.cost.plan_estimate import PlanEstimate
from piebald.report.describe import describe_plan
from piebald.specs.plan import Plan, RunnerUp

__all__ = ["Candidate", "DepthScan", "Infeasible", "Scan", "ScoredPlan", "SearchResult", "Stages"]

Stages = tuple[tuple[int, ...], ...]  # the ranks of each stage, in pipeline order


class Infeasible(Exception):  # noqa: N818 - a planning outcome, not a programming error
    """No plan fits memory; the message says what does not fit and the smallest fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoredPlan:
    plan: Plan
    estimate: PlanEstimate
    strategy: str

    def as_runner_up(self) -> RunnerUp:
        """How a plan file lists this plan among those not chosen."""
        return RunnerUp(
            description=describe_plan(self.plan),
            tokens_per_s=self.estimate.tokens_per_s,
            step_time_s=self.estimate.step_time_s,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    best: ScoredPlan
    runners_up: tuple[ScoredPlan, ...]
    upper_bound_tokens_per_s: float
    num_structures: int  # coarse structures priced by the DP
    elapsed_s: float


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Candidate:
    """A priced structure: its stages, layer bounds and micro-batch size, ordered by the
    proxy's step time."""

    proxy_s: float
    stages: Stages = field(compare=False)
    bounds: tuple[int, ...] = field(compare=False)
    micro_batch_size: int = field(compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class DepthScan:
    """The best proxy found for one pipeline depth (of one order and micro-batch size)."""

    proxy_s: float
    depth: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Scan:
    """The best proxy of one (order, micro-batch size, depth) of the coarse scan."""

    proxy_s: float
    order_index: int
    micro_batch_size: int
    depth: int

    def key(self) -> tuple[float, int, int, int]:
        """Best first; ties to the earlier order, the smaller size, the shallower depth."""
        return (self.proxy_s, self.order_index, self.micro_batch_size, self.depth)
