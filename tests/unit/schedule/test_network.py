"""Shared links: a flow alone moves at its path's rate; flows on one resource split it
equally and the resource stays busy (work-conserving): n flows of S bytes on capacity B
all end at n S / B; uneven flows end at the running sums. Checked in the engine too: two
GPUs of a node sending over the node's one NIC take twice as long as one."""

from __future__ import annotations

import pytest

from piebald.cost.comm import p2p_time_s
from piebald.schedule.network import Network
from piebald.schedule.prices import Prices
from piebald.simulator.engine import simulate
from piebald.simulator.result import Lane
from sim_plans import cluster, pipeline


def _run(network: Network, flows: dict[int, float], capacity: float) -> dict[int, float]:
    """Start every flow at t=0 on one shared resource; return each one's completion."""
    pending: dict[int, tuple[float, int]] = {}
    for flow_id, num_bytes in flows.items():
        for fid, time_s, version in network.start(
            flow_id,
            now_s=0.0,
            num_bytes=num_bytes,
            path_bytes_per_s=capacity,
            resources=(("nic", capacity),),
        ):
            pending[fid] = (time_s, version)
    done: dict[int, float] = {}
    while pending:
        fid, (time_s, version) = min(pending.items(), key=lambda item: item[1][0])
        del pending[fid]
        assert network.is_current(fid, version)
        done[fid] = time_s
        for other, other_s, other_version in network.finish(fid, now_s=time_s):
            pending[other] = (other_s, other_version)
    return done


def test_equal_flows_share_a_resource_equally() -> None:
    done = _run(Network(), {1: 100.0, 2: 100.0, 3: 100.0}, capacity=10.0)
    assert done == pytest.approx({1: 30.0, 2: 30.0, 3: 30.0}, rel=1e-12)


def test_uneven_flows_finish_at_the_running_sums() -> None:
    # 10, 20, 40 bytes at 10 B/s: the small one ends at 3 x 10 / 10 = 3 s, the middle one
    # at 3 + 2 x 10 / 10 = 5 s, the last at 70 / 10 = 7 s.
    done = _run(Network(), {1: 10.0, 2: 20.0, 3: 40.0}, capacity=10.0)
    assert done == pytest.approx({1: 3.0, 2: 5.0, 3: 7.0}, rel=1e-12)


def test_a_flow_is_capped_by_its_path() -> None:
    network = Network()
    ((_, time_s, _),) = network.start(
        1, now_s=2.0, num_bytes=50.0, path_bytes_per_s=5.0, resources=(("nic", 100.0),)
    )
    assert time_s == pytest.approx(12.0) and network.rate_bytes_per_s(1) == 5.0


def test_transfers_cost_what_the_estimate_charges_when_alone() -> None:
    c = cluster(("round", 2), ("half", 2), nic="100Gb/s")
    plan = pipeline(c, stage_ranks=[[0], [2]], counts=[[2], [2]], routes=[[0, 2], [0, 2]])
    transfer = Prices(plan).transfer(0, 2)
    num_bytes = 1 * plan.job.seq_len * plan.model.arch.hidden_size * 2
    assert transfer.num_bytes == num_bytes
    assert transfer.alone_s == p2p_time_s(num_bytes=num_bytes, link=c.link_between(0, 2))
    keys = [key for key, _ in transfer.resources]
    assert keys == [("nic-out", 0, "rdma"), ("nic-in", 1, "rdma")]


def test_two_gpus_sending_through_one_nic_take_twice_as_long() -> None:
    # Stage 0: ranks 0, 1 on node 0; stage 1: ranks 2, 3 on node 1; a slow NIC so the
    # transfers dominate. Micro-batches 0 and 1 leave node 0 at the same moment.
    c = cluster(("round", 2), ("round", 2), nic="1Gb/s")
    plan = pipeline(
        c,
        stage_ranks=[[0, 1], [2, 3]],
        counts=[[1, 1], [1, 1]],
        routes=[[0, 2], [1, 3]],
        micro_batch_size=8,
    )
    prices = Prices(plan)
    alone = prices.transfer(0, 2)
    result = simulate(plan, prices=prices)
    sends = [i for i in result.intervals if i.lane is Lane.P2P and i.kind == "send activation"]
    assert len(sends) == 2 and sends[0].start_s == sends[1].start_s
    for send in sends:
        shared_s = alone.link.latency_s + 2 * alone.num_bytes / alone.link.bandwidth_bytes_per_s
        assert send.end_s - send.start_s == pytest.approx(shared_s, rel=1e-9)
