"""The exact build of the best structures: micro-batch counts, shards, ZeRO mode and
recompute per stage (``stage_builder``), priced by the plan estimate."""

from __future__ import annotations

import math

from piebald.cost.memory import stage_memory_bytes
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.planner.search.parallel import run_tasks
from piebald.planner.search.records import Candidate, ScoredPlan
from piebald.planner.search.state import SearchState
from piebald.specs.devices import DeviceType
from piebald.specs.recompute import Recompute

__all__ = ["build_exactly"]


def build_exactly(state: SearchState) -> list[ScoredPlan]:
    """Phase 5. Plans built from the candidates in the proxy's order, each with its layer split
    polished, until ``num_exact_plans`` fit (trying at most ``exact_tries_per_plan`` times
    as many); a one-stage candidate also with a micro-batch size per GPU type where the
    strategy allows it; and where all of those leave GPUs idle, the best candidate that
    uses every GPU."""
    ranked = sorted(c for c in state.candidates.values() if math.isfinite(c.proxy_s))
    settings = state.settings
    wanted = settings.num_exact_plans
    tried = ranked[: wanted * settings.exact_tries_per_plan]
    scored: list[ScoredPlan] = []
    # Built a batch at a time on the search's workers (``parallel``), each batch as many as
    # are still wanted, taken in order up to where enough fit: the plans building them one
    # by one gives.
    while tried and len(scored) < wanted:
        batch, tried = tried[: wanted - len(scored)], tried[wanted - len(scored) :]
        for built in run_tasks(state, batch, _built, workers=settings.workers):
            scored += built
            if len(scored) >= wanted:
                break
    if scored and all(s.plan.idle_ranks for s in scored):
        # The best structure that uses every GPU, built too: the plan then says how much
        # slower using them all would be, not that nothing fits (it may be the faster).
        whole = [c for c in ranked if sum(map(len, c.stages)) == state.cluster.num_gpus]
        for candidate in whole[: settings.exact_tries_per_plan]:
            plan = state.assemble(state.polished(candidate))
            if plan is not None:
                scored.append(plan)
                break
    return scored


def _built(state: SearchState, candidate: Candidate) -> list[ScoredPlan]:
    """The candidate's plans that fit, its layer split polished: as it is, and for a
    one-stage candidate where the strategy allows it, with a micro-batch size per GPU
    type."""
    candidate = state.polished(candidate)
    plans = [state.assemble(candidate)]
    if state.strategy.mixes_micro_batch_sizes(len(candidate.stages)):
        plans.append(state.assemble(candidate, _per_rank_sizes(state, candidate.stages[0])))
    return [plan for plan in plans if plan is not None]


def _per_rank_sizes(state: SearchState, ranks: tuple[int, ...]) -> dict[int, int]:
    """Cephalo: each GPU type at the micro-batch size where it is fastest per token and its
    activations for one micro-batch leave room for an even share of the state."""
    sizes: dict[int, int] = {}
    best_of: dict[DeviceType, int] = {}
    for rank in ranks:
        device = state.cluster.device_of(rank)
        if device not in best_of:
            best_of[device] = _fastest_size(state, device, len(ranks))
        sizes[rank] = best_of[device]
    return sizes


def _fastest_size(state: SearchState, device: DeviceType, num_ranks: int) -> int:
    """The micro-batch size at which ``device`` trains the most tokens per second while one
    micro-batch's activations, beside an even share of the state under the strategy's most
    frugal ZeRO mode and recompute, fit its memory."""
    rules = state.strategy.stage_rules
    best_size, best_rate = 1, 0.0
    last = state.model.num_layers
    for size in state.settings.micro_batch_sizes:
        if state.job.global_batch_size % size:
            continue
        fixed, sharded = stage_memory_bytes(
            state.model,
            shape=PassShape.for_job(
                state.job,
                device=device,
                micro_batch_size=size,
                recompute=rules.most_frugal_recompute,
            ),
            layers=(0, last),
            optimizer=state.job.optimizer,
            zero=rules.most_frugal_zero,
            num_in_flight=1,
            num_neighbor_stages=0,
            curve=state.curve,
        )
        if float(fixed) + float(sharded) / num_ranks > device.memory_bytes:
            break
        shape = PassShape.for_job(
            state.job, device=device, micro_batch_size=size, recompute=Recompute.NONE
        )
        times = pass_times(state.model, shape=shape, curve=state.curve)
        rate = size / times.pass_s(0, last)
        if rate > best_rate * state.settings.size_gain:  # a bigger one must pay for its memory
            best_size, best_rate = size, rate
    return best_size
