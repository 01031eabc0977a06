"""Reports name a stage's tensor parallelism: its degree and tensor groups in the one-line
description, the explanation's stage times and the plan table's rows (leaders marked)."""

from __future__ import annotations

from piebald.cli.render import explanation_tables, plan_table
from piebald.cost.plan_estimate import estimate_plan
from piebald.report.describe import describe_plan
from piebald.report.explain import explain_plan
from tensor_plans import two_node_plan


def test_reports_show_each_stages_degree_and_groups() -> None:
    plan = two_node_plan("gpt2", cut=5, num_micro_batches=8)
    first, second = describe_plan(plan).split(" | ")
    assert "tp 2 x 4 groups" in first
    assert "tp" not in second
    explanation = explain_plan(plan)
    assert [(s.tensor_parallel_degree, s.num_tensor_groups) for s in explanation.stages] == [
        (2, 4),
        (1, 8),
    ]
    table = plan_table(plan, estimate_plan(plan))
    tp = next(column for column in table.columns if column.header == "tp")
    assert list(tp.cells) == ["2 (leader)", "2"] * 4 + ["-"] * 8
    times = explanation_tables(plan, explanation)[0]
    assert not isinstance(times, str)
    assert list(next(c for c in times.columns if c.header == "tp").cells) == ["2 x 4", "-"]
