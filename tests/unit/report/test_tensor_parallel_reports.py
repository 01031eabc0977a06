"""Reports name a stage's tensor parallelism: its degree and tensor groups in the one-line
description, the explanation's stage times and the plan table's rows (whole tensor groups)."""

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
    cells = {column.header: list(column.cells) for column in table.columns}
    # A row per run of alike tensor groups (ranks at degree 1): every rank once, in order,
    # the degree on each of the first stage's rows.
    stage_of_row, stage = [], -1
    for cell in cells["stage"]:
        stage = int(cell) if cell else stage
        stage_of_row.append(stage)
    ranks = [_ranks(cell) for cell in cells["rank"]]
    for index, planned in enumerate(plan.stages):
        rows = [r for r, s in enumerate(stage_of_row) if s == index]
        assert [rank for r in rows for rank in ranks[r]] == list(planned.ranks)
        assert {cells["tp"][r] for r in rows} == {"2" if index == 0 else "-"}
        assert all(len(ranks[r]) % planned.tensor_parallel_degree == 0 for r in rows)
    assert len(cells["rank"]) < sum(len(s.ranks) for s in plan.stages)
    times = explanation_tables(plan, explanation)[0]
    assert not isinstance(times, str)
    assert list(next(c for c in times.columns if c.header == "tp").cells) == ["2 x 4", "-"]


def _ranks(cell: str) -> list[int]:
    """The ranks a plan-table cell names: ``4``, ``4-7`` or ``4,6``."""
    if "-" in cell:
        first, last = map(int, cell.split("-"))
        return list(range(first, last + 1))
    return [int(rank) for rank in cell.split(",")]
