"""The simulator's side of benchmarks/cpu_fidelity.py against the closed form of a uniform
pipeline: each rank busy m (f + b), the bubble (p-1)/(m+p-1) of its step (Huang et al.
2019), forward and backward split out of the recorded timeline."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from cpu_fidelity_terms import dominant_terms, simulated_terms
from piebald.simulator.engine import simulate
from piebald.specs.plan import Schedule
from sim_plans import FixedPrices, cluster, pipeline


@pytest.mark.parametrize(("num_stages", "num_micro_batches"), [(2, 8), (3, 4), (2, 1)])
def test_uniform_pipeline_terms_are_busy_and_the_closed_form_bubble(
    num_stages: int, num_micro_batches: int
) -> None:
    p, m = num_stages, num_micro_batches
    plan = pipeline(
        cluster(("round", p)),
        stage_ranks=[[s] for s in range(p)],
        counts=[[m]] * p,
        routes=[list(range(p))] * m,
        schedule=Schedule.ONE_F_ONE_B,
    )
    f, b = 0.25, 0.5  # exact in binary
    prices = FixedPrices(
        plan, forward_s=dict.fromkeys(range(p), f), backward_s=dict.fromkeys(range(p), b)
    )
    terms = simulated_terms(simulate(plan, prices=prices, record=True))
    assert terms.step_s == (m + p - 1) * (f + b)
    assert terms.forward_s == (m * f,) * p
    assert terms.backward_s == (m * b,) * p
    assert terms.busy_s == (m * (f + b),) * p
    assert terms.optimizer_s == (0.0,) * p
    assert terms.comm_s == (0.0,) * p
    bubble = (p - 1) / (m + p - 1)
    assert terms.share(terms.bubble_s) == pytest.approx(bubble, rel=1e-12)
    assert terms.share(terms.busy_s) == pytest.approx(1 - bubble, rel=1e-12)
    compute, rest = f"compute {1 - bubble:.0%}", f"bubble {bubble:.0%}"
    first, second = (compute, rest) if 1 - bubble >= bubble else (rest, compute)
    assert dominant_terms(terms) == f"{first} / {second} / comm 0%"


def test_terms_need_the_recorded_timeline() -> None:
    plan = pipeline(
        cluster(("round", 2)), stage_ranks=[[0], [1]], counts=[[2]] * 2, routes=[[0, 1]] * 2
    )
    prices = FixedPrices(plan, forward_s={0: 1.0, 1: 1.0}, backward_s={0: 2.0, 1: 2.0})
    without = simulated_terms(simulate(plan, prices=prices, record=False))
    assert without.forward_s == (0.0, 0.0)
    assert without.busy_s == (6.0, 6.0)  # the rank statistics do not need them
