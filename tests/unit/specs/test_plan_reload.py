"""Plans are re-validated on load: unknown keys anywhere in a
plan file are refused with a suggestion, and a plan whose embedded cluster no longer has
the memory its ranks need is refused by every command that reads plans, naming the rank,
what it needs and what its GPU has."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli_runner import run_cli
from piebald.cli.common import load_checked_plan
from piebald.errors import SpecError
from piebald.examples import example_path
from piebald.specs.plan_io import load_plan

SMALL = ["--model", "tiny", "--global-batch", "8", "--seq-len", "64"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    code, output = run_cli("plan", "--cluster", str(example_path()), *SMALL, "--out", str(out))
    assert code == 0, output
    return out


def _edited(tmp_path: Path, plan_file: Path, edit: object) -> Path:
    data = json.loads(plan_file.read_text())
    edit(data)  # type: ignore[operator]
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return path


def _one_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


# -- unknown keys (finding 18) ---------------------------------------------------------------


def _set(path: tuple[object, ...], key: str, value: object) -> object:
    def edit(data: dict[str, object]) -> None:
        target: object = data
        for part in path:
            target = target[part]  # type: ignore[index]
        target[key] = value  # type: ignore[index]

    return edit


@pytest.mark.parametrize(
    ("where", "key", "value", "suggestion"),
    [
        ((), "shedule", "gpipe", "schedule"),
        (("stages", 0), "zer0", "full", "zero"),
        (("stages", 0), "recompte", True, "recompute"),
        (("predicted",), "step_time", 1.0, "step_time_s"),
        (("job",), "sequence_len", 64, "seq_len"),
        (("cluster", "nodes", 0), "gpus_per_nod", 2, "gpus_per_node"),
    ],
)
@pytest.mark.slow
def test_unknown_plan_keys_are_refused_with_a_suggestion(
    tmp_path: Path,
    plan_file: Path,
    where: tuple[object, ...],
    key: str,
    value: object,
    suggestion: str,
) -> None:
    """Finding 18: "zer0": "full" loaded as ZeRO none, "recompte": true as no recompute."""
    path = _edited(tmp_path, plan_file, _set(where, key, value))
    with pytest.raises(SpecError) as error:
        load_plan(path)
    message = str(error.value)
    assert key in message and f"did you mean {suggestion!r}" in message and str(path) in message
    code, output = run_cli("explain", str(path))
    assert code == 2 and key in _one_line(output)


def test_unknown_keys_in_cost_inputs_entries_are_refused(tmp_path: Path, plan_file: Path) -> None:
    def add_cost_inputs(data: dict[str, object]) -> None:
        data["cost_inputs"] = {
            "profile_db": "db",
            "profile_db_digest": "0" * 64,
            "links": [
                {
                    "between": ["a100", "v100"],
                    "scope": "inter-node",
                    "latency_s": 1e-5,
                    "bandwith_bytes_per_s": 1e10,
                }
            ],
        }

    path = _edited(tmp_path, plan_file, add_cost_inputs)
    with pytest.raises(SpecError, match=r"bandwith_bytes_per_s.*did you mean 'bandwidth_bytes"):
        load_plan(path)


def test_plans_without_optional_keys_still_load(tmp_path: Path, plan_file: Path) -> None:
    """Older plans: no max_in_flight, predicted, runners_up, notes or derived keys."""

    def strip(data: dict[str, object]) -> None:
        for key in ("predicted", "runners_up", "notes", "num_layers", "idle_ranks"):
            data.pop(key, None)
        for stage in data["stages"]:  # type: ignore[attr-defined]
            stage.pop("max_in_flight", None)
            stage.pop("devices", None)

    load_checked_plan(_edited(tmp_path, plan_file, strip))


# -- memory re-checked on load (finding 16) ----------------------------------------------------


def _redefine_gpu(name: str, memory: str) -> object:
    """The cluster edited so that GPU type ``name`` has ``memory`` (a custom type may
    redefine a catalog name)."""

    def edit(data: dict[str, object]) -> None:
        cluster = data["cluster"]
        assert isinstance(cluster, dict)
        custom = [t for t in cluster.get("gpu_types", []) if t["name"] != name]
        custom.append(
            {
                "name": name,
                "memory": memory,
                "bf16_tflops": 100,
                "fp32_tflops": 20,
                "memory_bandwidth": "1TB/s",
            }
        )
        cluster["gpu_types"] = custom

    return edit


def _ranks_on(plan_file: Path, device: str) -> list[int]:
    data = json.loads(plan_file.read_text())
    return [
        rank
        for stage in data["stages"]
        for rank, name in zip(stage["ranks"], stage["devices"], strict=True)
        if name == device
    ]


def test_a_plan_the_planner_made_loads_checked(plan_file: Path) -> None:
    assert load_checked_plan(plan_file).stages


@pytest.mark.parametrize(
    "command",
    [
        ["explain", "{plan}"],
        ["simulate", "--plan", "{plan}"],
        ["launch", "--plan", "{plan}"],
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1"],
    ],
)
def test_a_plan_that_no_longer_fits_its_cluster_is_refused_by_every_command(
    tmp_path: Path, plan_file: Path, command: list[str]
) -> None:
    """Finding 16: with a GPU type's memory edited below what its stage needs, explain
    said "memory-bound" and simulate, launch and train exited 0. 1 GiB cannot fit any
    rank: the framework reserve alone is 1 GiB + 5% of the capacity (cost.memory)."""
    gpu = json.loads(plan_file.read_text())["stages"][0]["devices"][0]
    ranks = _ranks_on(plan_file, gpu)
    path = _edited(tmp_path, plan_file, _redefine_gpu(gpu, "1GiB"))
    code, output = run_cli(*(part.format(plan=path) for part in command))
    assert code == 2
    line = _one_line(output)
    assert str(path) in line and gpu in line and "1.0 GiB" in line
    named = re.search(rf"rank (\d+) \({re.escape(gpu)}\) needs", line)
    assert named is not None and int(named.group(1)) in ranks, line
