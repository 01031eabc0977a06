"""Fallback plans (piebald.planner.fallback): one per node group, keyed by the shape of the
cluster a loss leaves, found again for the loss of any node of the group, and each the
plan a fresh ``replan`` makes for that loss."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import piebald
from cluster_builders import cluster, group
from piebald.api import fallback_plans
from piebald.errors import ArgumentError
from piebald.examples import example_path
from piebald.outputs import OutputError
from piebald.planner.fallback import (
    FallbackPlans,
    fallback_file_name,
    fallback_key,
    find_fallback_plan,
    single_loss_memberships,
    write_fallback_plans,
)
from piebald.planner.replan import replan
from piebald.specs.cluster import ClusterSpec
from piebald.specs.membership import Membership
from piebald.specs.plan import Plan

JOB = piebald.build_job(global_batch=8, seq_len=64)


def _two_groups() -> ClusterSpec:
    """Two A100 nodes and two V100 nodes, two GPUs each, on named hosts."""
    a100 = group("a100", "A100-80GB", 2, count=2, nic=("infiniband", "200Gb/s"))
    a100["hosts"] = ["gpu-a", "gpu-b"]
    v100 = group("v100", "V100-32GB", 2, count=2, nic=("infiniband", "100Gb/s"))
    v100["hosts"] = ["old-a", "old-b"]
    return cluster("two-groups", a100, v100)


@pytest.fixture(scope="module")
def example_plan() -> Plan:
    return piebald.plan(example_path(), "tiny", JOB)


@pytest.fixture(scope="module")
def other_job_plan() -> Plan:
    """The example's plan for twice the batch: other fallback plans."""
    return piebald.plan(example_path(), "tiny", piebald.build_job(global_batch=16, seq_len=64))


@pytest.fixture(scope="module")
def two_group_plan() -> Plan:
    return piebald.plan(_two_groups(), "tiny", JOB)


@pytest.fixture(scope="module")
def example_fallbacks(
    example_plan: Plan, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, FallbackPlans]:
    directory = tmp_path_factory.mktemp("example") / "fallbacks"  # created by the writer
    return directory, write_fallback_plans(example_plan, directory)


def test_losing_any_node_of_a_group_has_one_key_and_groups_differ() -> None:
    spec = _two_groups()
    everyone = Membership.everyone(spec)
    a100 = {fallback_key(everyone.without([f"a100-{i}"]).sub_cluster()) for i in range(2)}
    v100 = {fallback_key(everyone.without([f"v100-{i}"]).sub_cluster()) for i in range(2)}
    assert len(a100) == 1 and len(v100) == 1
    assert a100 != v100
    # The sub-clusters' names (and hosts) differ; their keys do not.
    assert everyone.without(["a100-0"]).sub_cluster().name != (
        everyone.without(["a100-1"]).sub_cluster().name
    )
    assert fallback_key(spec) not in a100 | v100
    assert fallback_key(everyone.without(["a100-0", "a100-1"]).sub_cluster()) not in a100


def test_the_key_is_the_shape_not_the_name() -> None:
    spec = _two_groups()
    renamed = cluster(
        "other-name",
        group("a100", "A100-80GB", 2, count=2, nic=("infiniband", "200Gb/s")),
        group("v100", "V100-32GB", 2, count=2, nic=("infiniband", "100Gb/s")),
    )
    slower = cluster(
        "two-groups",
        group("a100", "A100-80GB", 2, count=2, nic=("infiniband", "100Gb/s")),
        group("v100", "V100-32GB", 2, count=2, nic=("infiniband", "100Gb/s")),
    )
    assert fallback_key(renamed) == fallback_key(spec)  # only the name and hosts differ
    assert fallback_key(slower) != fallback_key(spec)
    assert fallback_file_name(spec) == f"fallback-{fallback_key(spec)}.json"


def test_one_single_loss_per_group_and_none_for_one_node() -> None:
    spec = _two_groups()
    losses = single_loss_memberships(spec)
    assert [set(n.name for n in spec.nodes) - set(m.live) for m in losses] == [
        {"a100-1"},
        {"v100-1"},
    ]
    example = piebald.load_cluster(example_path())  # three groups of one node each
    assert len(single_loss_memberships(example)) == 3
    assert single_loss_memberships(cluster("one", group("a", "A100-80GB", 2))) == ()


def test_written_plans_are_found_and_are_replans(
    example_plan: Plan, example_fallbacks: tuple[Path, FallbackPlans]
) -> None:
    directory, made = example_fallbacks
    assert made.infeasible == ()
    assert len(made.written) == 3 and len(set(made.written)) == 3
    assert sorted(directory.iterdir()) == sorted(made.written)
    for membership in single_loss_memberships(example_plan.cluster):
        found = find_fallback_plan(directory, membership, plan=example_plan)
        fresh = replan(example_plan, membership)
        assert found is not None and found.predicted is not None
        assert fresh.predicted is not None
        assert found.stages == fresh.stages
        assert found.predicted.step_time_s == fresh.predicted.step_time_s
        assert found == fresh  # the sub-cluster itself too, name and all


@pytest.mark.slow
def test_the_loss_of_another_node_of_the_group_finds_the_stored_plan(
    two_group_plan: Plan, tmp_path: Path
) -> None:
    made = write_fallback_plans(two_group_plan, tmp_path)
    assert len(made.written) == 2
    lost_first = Membership.everyone(two_group_plan.cluster).without(["a100-0"])
    found = find_fallback_plan(tmp_path, lost_first)
    fresh = replan(two_group_plan, lost_first)
    assert found is not None and found.predicted is not None and fresh.predicted is not None
    assert found.cluster == lost_first.sub_cluster()  # its own hosts
    assert found.cluster.node_groups[0].hosts == ("gpu-b",)
    assert found.stages == fresh.stages
    assert found.predicted.step_time_s == fresh.predicted.step_time_s


def test_nothing_stored_is_none(example_plan: Plan, tmp_path: Path) -> None:
    two_lost = Membership.everyone(example_plan.cluster).without(["a100-0", "v100-0"])
    assert find_fallback_plan(tmp_path, two_lost) is None
    assert find_fallback_plan(tmp_path / "absent", two_lost) is None


def test_a_corrupt_or_foreign_file_is_none_and_a_warning(
    example_plan: Plan,
    other_job_plan: Plan,
    two_group_plan: Plan,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    membership = single_loss_memberships(example_plan.cluster)[0]
    path = tmp_path / fallback_file_name(membership.sub_cluster())
    caplog.set_level(logging.WARNING, logger="piebald.planner.fallback")
    for text in ("{not json", '{"version": 1}', "[]", "\0\xff"):
        path.write_text(text)
        assert find_fallback_plan(tmp_path, membership) is None
        assert str(path) in caplog.text
        caplog.clear()
    # A plan of another cluster under this name.
    piebald.save_plan(two_group_plan, path, overwrite=True)
    assert find_fallback_plan(tmp_path, membership) is None
    assert "not one shaped like" in caplog.text
    caplog.clear()
    # The right cluster's plan for another job, where the caller says which plan it runs.
    piebald.save_plan(replan(other_job_plan, membership), path, overwrite=True)
    assert find_fallback_plan(tmp_path, membership) is not None
    assert find_fallback_plan(tmp_path, membership, plan=example_plan) is None
    assert "not used" in caplog.text
    # A directory where the file should be.
    path.unlink()
    path.mkdir()
    assert find_fallback_plan(tmp_path, membership) is None


@pytest.mark.slow
def test_same_plans_again_are_kept_other_plans_refused(
    example_plan: Plan, other_job_plan: Plan, example_fallbacks: tuple[Path, FallbackPlans]
) -> None:
    directory, made = example_fallbacks
    before = {path: path.read_bytes() for path in made.written}
    again = write_fallback_plans(example_plan, directory)
    assert again == made
    assert {path: path.read_bytes() for path in made.written} == before
    with pytest.raises(OutputError, match="already exists"):
        write_fallback_plans(other_job_plan, directory)
    assert {path: path.read_bytes() for path in made.written} == before


def test_progress_once_per_fallback_plan(example_plan: Plan, tmp_path: Path) -> None:
    calls: list[tuple[float, str]] = []
    write_fallback_plans(example_plan, tmp_path, progress=lambda f, m: calls.append((f, m)))
    assert [fraction for fraction, _ in calls] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert [message.split(":")[0] for _, message in calls] == [
        "without a100-0",
        "without v100-0",
        "without ws-0",
    ]


def test_a_loss_no_plan_fits_is_skipped(tmp_path: Path) -> None:
    # llama-3-8b's training state needs both 80 GB GPUs: one alone cannot hold it.
    pair = cluster("pair", group("a", "A100-80GB", 1, count=2, nic=("infiniband", "200Gb/s")))
    plan = piebald.plan(pair, "llama-3-8b", piebald.build_job(global_batch=8, seq_len=256))
    made = write_fallback_plans(plan, tmp_path)
    assert made == FallbackPlans(written=(), infeasible=("a-1",))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_api_writes_the_same_files(
    example_plan: Plan, example_fallbacks: tuple[Path, FallbackPlans], tmp_path: Path
) -> None:
    _, made = example_fallbacks
    from_api = fallback_plans(example_plan, tmp_path / "api")
    assert [path.name for path in from_api.written] == [path.name for path in made.written]
    assert [path.read_bytes() for path in from_api.written] == [
        path.read_bytes() for path in made.written
    ]


@pytest.mark.parametrize(
    ("arguments", "name"),
    [
        ({"plan": None}, "plan"),
        ({"directory": None}, "directory"),
        ({"directory": ""}, "directory"),
        ({"workers": 0}, "workers"),
        ({"progress": "x"}, "progress"),
    ],
)
def test_api_bad_arguments_name_the_argument(
    example_plan: Plan, tmp_path: Path, arguments: dict[str, object], name: str
) -> None:
    call: dict[str, object] = {"plan": example_plan, "directory": tmp_path, **arguments}
    with pytest.raises(ArgumentError) as raised:
        fallback_plans(**call)  # type: ignore[arg-type]
    assert raised.value.argument == name


def test_api_refuses_a_file_as_directory_before_planning(
    example_plan: Plan, tmp_path: Path
) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(OutputError, match="a directory"):
        fallback_plans(example_plan, file)
