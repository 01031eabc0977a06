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

from piebald.cost.plan_estimate import estimate_plan
from piebald.cost.traffic import MAX_BACKGROUND
from piebald.planner.structure_traffic import NodeSignatures, StructureTraffic
from piebald.schedule.build import one_f_one_b_dry_run
from piebald.schedule.prices import Prices
from piebald.simulator.engine import simulate
from piebald.simulator.result import Lane
from piebald.specs.plan import Plan
from sim_plans import cluster, pipeline


def _two_nodes(per_rank: int, *, nic: str = "10Gb/s") -> Plan:
    """Two stages of four GPUs on two nodes, micro-batch j from rank j mod 4 to 4 + j mod 4."""
    return pipeline(
        cluster(("round", 4), ("round", 4), nic=nic),
        stage_ranks=[[0, 1, 2, 3], [4, 5, 6, 7]],
        counts=[[per_rank] * 4] * 2,
        routes=[[j % 4, 4 + j % 4] for j in range(4 * per_rank)],
    )


def test_four_senders_on_one_nic_each_get_a_quarter_of_it() -> None:
    per_rank = 3
    plan = _two_nodes(per_rank)
    link = plan.cluster.link_between(0, 4)
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


def _three_nodes(per_rank: int, *, nic: str = "10Gb/s") -> Plan:
    """Three stages of four GPUs on three nodes, micro-batch j along ranks j mod 4."""
    return pipeline(
        cluster(("round", 4), ("round", 4), ("round", 4), nic=nic),
        stage_ranks=[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]],
        counts=[[per_rank] * 4] * 3,
        routes=[[j % 4, 4 + j % 4, 8 + j % 4] for j in range(4 * per_rank)],
    )


def test_a_nics_other_traffic_stretches_a_hop_by_one_over_one_minus_its_load() -> None:
    """The middle node's NIC takes stage 0's activations in and stage 2's gradients in.
    Each way's four streams run at once (4 S / B), and the other way keeps the NIC busy
    N S / B of the pipeline T: processor sharing stretches the way by 1 / (1 - rho),
    rho = N S / B / T, with T the estimate's own pipeline (its fixed point)."""
    per_rank = 3
    plan = _three_nodes(per_rank)
    link = plan.cluster.link_between(0, 4)
    num_bytes = plan.job.seq_len * plan.model.arch.hidden_size * plan.job.precision.num_bytes
    one_s = num_bytes / link.bandwidth_bytes_per_s
    estimate = estimate_plan(plan)
    rho = 4 * per_rank * one_s / estimate.pipeline_s
    assert 0 < rho < MAX_BACKGROUND
    way_s = link.latency_s + 4 * one_s / (1 - rho)
    assert estimate.stages[0].hop_s == pytest.approx(2 * way_s)
    assert estimate.stages[1].hop_s == pytest.approx(2 * way_s)


@pytest.mark.parametrize("num_nodes", [2, 3])
def test_the_planners_structure_traffic_prices_the_hop_and_the_nic_as_the_estimate(
    num_nodes: int,
) -> None:
    """The planner builds a structure's traffic from node signatures, the estimate from the
    plan's routes: the same hops and busy NICs here, where each pair crosses alike."""
    plan = _two_nodes(3) if num_nodes == 2 else _three_nodes(3)
    traffic = StructureTraffic(
        plan.cluster, model=plan.model, job=plan.job, signatures=NodeSignatures(plan.cluster)
    )
    boundaries = traffic.boundaries(tuple(stage.ranks for stage in plan.stages), 1)
    estimate = estimate_plan(plan)
    for index, boundary in enumerate(boundaries):
        hop_s = boundary.hop_s(horizon_s=estimate.pipeline_s)
        assert hop_s == pytest.approx(estimate.stages[index].hop_s)
        assert boundary.busy_s == pytest.approx(estimate.stages[index].boundary_s)


@pytest.mark.parametrize("num_nodes", [2, 3])
def test_the_1f1b_dry_run_foresees_the_engines_timeline_on_a_shared_nic(num_nodes: int) -> None:
    """The order of each rank's passes comes from a dry run whose transfers share NICs and
    wait for their receives as the engine's do. Where hops, four to a NIC, are long against
    the passes, the engine runs every pass exactly when the dry run started it: no rank
    waits for an input the dry run expected sooner (with hops priced alone, ranks did,
    holding activations they could have run)."""
    plan = (_two_nodes if num_nodes == 2 else _three_nodes)(per_rank=4, nic="100Mb/s")
    prices = Prices(plan)
    hop_s = prices.transfer(0, 4).alone_s
    assert 4 * hop_s > prices.forward_s(0) + prices.backward_s(0)  # the NIC is what waits
    dry_run = one_f_one_b_dry_run(plan, prices)
    result = simulate(plan, prices=prices)
    started: dict[int, list[float]] = {rank: [] for rank in plan.used_ranks}
    for interval in result.intervals:
        if interval.lane is Lane.COMPUTE and interval.kind in ("forward", "backward"):
            started[interval.rank].append(interval.start_s)
    for rank in plan.used_ranks:
        assert sorted(started[rank]) == pytest.approx(list(dry_run.start_s[rank]), abs=1e-9)
