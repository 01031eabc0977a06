"""Activations that share a node's NIC: the estimate prices each hop at the NIC's rate
split among the ranks sending at once, as the simulator's network does.

Two nodes of four GPUs, stage 0 on one and stage 1 on the other, micro-batch j from rank
j mod 4 to rank 4 + j mod 4. The four ranks of stage 0 finish their forwards together and
send at once, so each activation takes alpha + 4 S / B (S its bytes, B the NIC's rate),
and so does each gradient back: the hop the round trips and the fill pay is
2 (alpha + 4 S / B). The NIC carries every micro-batch's activation: busy N S / B.
"""

from __future__ import annotations

import pytest
from sim_plans import cluster, pipeline

from piebald.cost.plan_estimate import estimate_plan
from piebald.simulator.engine import simulate
from piebald.simulator.result import Lane


def test_four_senders_on_one_nic_each_get_a_quarter_of_it() -> None:
    per_rank = 3
    spec = cluster(("round", 4), ("round", 4), nic="10Gb/s")
    plan = pipeline(
        spec,
        stage_ranks=[[0, 1, 2, 3], [4, 5, 6, 7]],
        counts=[[per_rank] * 4] * 2,
        routes=[[j % 4, 4 + j % 4] for j in range(4 * per_rank)],
    )
    link = spec.link_between(0, 4)
    num_bytes = plan.job.seq_len * plan.model.arch.hidden_size * plan.job.precision.num_bytes
    one_s = num_bytes / link.bandwidth_bytes_per_s
    estimate = estimate_plan(plan)
    assert estimate.stages[0].hop_s == pytest.approx(2 * (link.latency_s + 4 * one_s))
    assert estimate.stages[0].boundary_s == pytest.approx(4 * per_rank * one_s)
    result = simulate(plan)
    first_wave = sorted(
        i.end_s - i.start_s
        for i in result.intervals
        if i.lane is Lane.P2P and i.kind == "send activation" and i.label.startswith("act ")
    )[:4]
    assert first_wave == pytest.approx([link.latency_s + 4 * one_s] * 4)


def test_the_planners_proxy_prices_the_hop_and_the_nic_as_the_estimate() -> None:
    from piebald.cost.compute import DEFAULT_CURVE
    from piebald.planner.search import _Search
    from piebald.planner.strategies import PIEBALD

    per_rank = 3
    spec = cluster(("round", 4), ("round", 4), nic="10Gb/s")
    plan = pipeline(
        spec,
        stage_ranks=[[0, 1, 2, 3], [4, 5, 6, 7]],
        counts=[[per_rank] * 4] * 2,
        routes=[[j % 4, 4 + j % 4] for j in range(4 * per_rank)],
    )
    state = _Search(spec, model=plan.model, job=plan.job, strategy=PIEBALD, curve=DEFAULT_CURVE)
    hops, busy = state.links(((0, 1, 2, 3), (4, 5, 6, 7)), 1)
    estimate = estimate_plan(plan)
    passes = [stage.micro_batch_s - stage.hop_s for stage in estimate.stages]
    assert hops[0].seconds(passes) == pytest.approx(estimate.stages[0].hop_s)
    assert busy[0] == pytest.approx(estimate.stages[0].boundary_s)
