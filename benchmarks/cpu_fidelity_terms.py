"""Where a simulated step goes: per rank, compute, communication and bubble, and the
forward, backward and optimizer times inside compute -- the simulator's side of
``benchmarks/cpu_fidelity.py``, torch-free and unit-tested."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from piebald.simulator.result import SimulationResult

__all__ = ["SimulatedTerms", "dominant_terms", "simulated_terms"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedTerms:
    """One simulated step split per rank into compute, communication and bubble."""

    step_s: float
    busy_s: tuple[float, ...]  # per used rank: forward, backward, optimizer
    comm_s: tuple[float, ...]  # per used rank: blocked on its own data-parallel traffic
    bubble_s: tuple[float, ...]  # per used rank: idle, waiting for peers or done early
    optimizer_s: tuple[float, ...]
    forward_s: tuple[float, ...]  # per used rank, all its micro-batches
    backward_s: tuple[float, ...]

    @property
    def num_ranks(self) -> int:
        return len(self.busy_s)

    def share(self, term: tuple[float, ...]) -> float:
        """``term``'s part of the ranks' step time (each rank's step is busy + comm +
        bubble)."""
        return sum(term) / (self.num_ranks * self.step_s) if self.step_s > 0 else 0.0


def simulated_terms(result: SimulationResult) -> SimulatedTerms:
    """The terms of ``result``, which must keep its intervals (``simulate(record=True)``,
    ``piebald.simulate(..., timeline=True)``) for the per-kind times."""
    per_kind: dict[tuple[int, str], float] = defaultdict(float)
    for interval in result.intervals:
        per_kind[interval.rank, interval.kind] += interval.end_s - interval.start_s
    ranks = result.ranks
    return SimulatedTerms(
        step_s=result.step_time_s,
        busy_s=tuple(r.busy_s for r in ranks),
        comm_s=tuple(r.blocked_s for r in ranks),
        bubble_s=tuple(r.idle_s for r in ranks),
        optimizer_s=tuple(per_kind[r.rank, "optimizer"] for r in ranks),
        forward_s=tuple(per_kind[r.rank, "forward"] for r in ranks),
        backward_s=tuple(per_kind[r.rank, "backward"] for r in ranks),
    )


def dominant_terms(terms: SimulatedTerms) -> str:
    """ "compute 77% / bubble 23% / comm 0%": the shares of the ranks' step, largest first."""
    shares = {
        "compute": terms.share(terms.busy_s),
        "comm": terms.share(terms.comm_s),
        "bubble": terms.share(terms.bubble_s),
    }
    ordered = sorted(shares.items(), key=lambda item: -item[1])
    return " / ".join(f"{name} {value:.0%}" for name, value in ordered)
