"""``--profiles DIR`` that matches nothing, ``--device-name`` of a catalog type, and errors
in recorded profile data naming the file (findings 31, 32, 34).

The DBs are synthetic profiles (no measuring): which of them a cluster can use is decided
by their device type and dtype alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run_cli
from piebald.profiler.db import write_profile
from piebald.specs.model import LayerKind

from .conftest import make_profile

CPU_TYPE = "{name: %s, memory: 8GiB, fp32_tflops: 0.05, memory_bandwidth: 5GB/s%s}"


def _cluster(path: Path, *names: str, bf16: bool = False) -> Path:
    """Two 'GPUs' per node of each named type; with ``bf16`` they train in bf16."""
    extra = ", bf16_tflops: 0.1" if bf16 else ""
    types = "\n".join(f"  - {CPU_TYPE % (name, extra)}" for name in names)
    nodes = "\n".join(
        f"  - {{name: box-{name}, gpu: {name}, gpus_per_node: 2, intra_link: 2GB/s}}"
        for name in names
    )
    path.write_text(f"name: cpus\ngpu_types:\n{types}\nnodes:\n{nodes}\n")
    return path


def _db(path: Path, device: str) -> Path:
    """Every layer kind of tiny at seq 32 on ``device`` (fp32), micro-batch sizes 1, 2."""
    for kind in LayerKind:
        write_profile(make_profile(device=device, kind=kind), path)
    return path


def _plan(cluster: Path, profiles: Path | None, *extra: str) -> tuple[int, str]:
    args = ["plan", "--cluster", str(cluster), "--model", "tiny", "--global-batch", "4"]
    args += ["--seq-len", "32", *extra]
    return run_cli(*args, *(["--profiles", str(profiles)] if profiles else []))


def _warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("warning:")]


def _plan_json(output: str) -> dict[str, object]:
    document: dict[str, object] = json.loads(output[output.index("{") :])
    return document


def test_finding_31_a_directory_without_profiles_is_refused(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path / "c.yaml", "cpu-a")
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not a profile\n")
    for directory in (empty, other):
        for command in (["plan"], ["compare"]):
            code, output = run_cli(
                *command, "--cluster", str(cluster), "--model", "tiny", "--global-batch", "4",
                "--seq-len", "32", "--profiles", str(directory),
            )  # fmt: skip
            assert code == 2, output
            (line,) = output.strip().splitlines()
            assert "--profiles" in line and str(directory) in line and "holds none" in line
    # A JSON file that is not a profile: refused, naming the file.
    (other / "plan.json").write_text('{"format": "piebald-plan"}')
    code, output = _plan(cluster, other)
    assert code == 2 and "plan.json" in output and "Traceback" not in output


def test_finding_31_profiles_of_another_device_warn_and_price_analytically(
    tmp_path: Path,
) -> None:
    cluster = _cluster(tmp_path / "c.yaml", "cpu-a")
    db = _db(tmp_path / "db", "cpu-b")
    code, analytic = _plan(cluster, None, "--json")
    assert code == 0, analytic
    code, output = _plan(cluster, db, "--json")
    assert code == 0, output
    (warning,) = _warnings(output)
    assert str(db) in warning and "cpu-a in fp32" in warning and "cpu-b in fp32" in warning
    assert "compute is priced from the analytic model" in warning
    # Nothing measured priced it: the same plan and prediction as without --profiles.
    with_db, without = _plan_json(output), _plan_json(analytic)
    assert with_db["stages"] == without["stages"]
    assert with_db["predicted"] == without["predicted"]


def test_finding_31_profiles_of_another_dtype_warn(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path / "c.yaml", "cpu-a", bf16=True)  # trains in bf16
    db = _db(tmp_path / "db", "cpu-a")  # measured in fp32
    code, output = _plan(cluster, db)
    assert code == 0, output
    (warning,) = _warnings(output)
    assert "cpu-a in bf16" in warning and "cpu-a in fp32" in warning


@pytest.mark.slow
def test_finding_31_partly_matching_profiles_name_the_unmeasured_types(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path / "c.yaml", "cpu-a", "cpu-b")
    db = _db(tmp_path / "db", "cpu-a")
    code, output = _plan(cluster, db)
    assert code == 0, output
    (warning,) = _warnings(output)
    assert "cpu-b in fp32" in warning and "those GPUs are priced" in warning
    assert "cpu-a in fp32" not in warning.split("the DB measured")[0]
    # Matching profiles: no warning at all.
    code, output = _plan(_cluster(tmp_path / "one.yaml", "cpu-a"), db)
    assert code == 0 and not _warnings(output), output


def test_finding_31_simulate_profiles_warn_too(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path / "c.yaml", "cpu-a")
    plan = tmp_path / "plan.json"
    code, output = _plan(cluster, None, "--out", str(plan))
    assert code == 0, output
    db = _db(tmp_path / "db", "cpu-b")
    code, output = run_cli("simulate", "--plan", str(plan), "--profiles", str(db))
    assert code == 0, output
    (warning,) = _warnings(output)
    assert "cpu-a in fp32" in warning and "analytic" in warning
    empty = tmp_path / "empty"
    empty.mkdir()
    code, output = run_cli("simulate", "--plan", str(plan), "--profiles", str(empty))
    assert code == 2 and len(output.strip().splitlines()) == 1, output


def test_finding_32_a_catalog_device_name_on_a_cpu_is_refused_before_measuring(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "db"
    code, output = run_cli(
        "profile", "compute", "--model", "tiny", "--seq-len", "16", "--micro-batch-sizes", "1",
        "--device", "cpu", "--device-name", "A100-80GB", "--out", str(out),
    )  # fmt: skip
    assert code == 2, output
    (line,) = output.strip().splitlines()
    assert "--device-name" in line and "A100-80GB" in line and "CPU timings" in line
    assert "not in the catalog" not in output and not out.exists()


def _recorded_plan(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    cluster = _cluster(tmp_path / "c.yaml", "cpu-a")
    db = _db(tmp_path / "db", "cpu-a")
    plan = tmp_path / "plan.json"
    code, output = _plan(cluster, db, "--out", str(plan))
    assert code == 0, output
    data: dict[str, object] = json.loads(plan.read_text())
    assert isinstance(data["cost_inputs"], dict) and data["cost_inputs"]["layer_times"]
    return plan, data


@pytest.mark.parametrize(
    ("field", "value"),
    [("layer_kind", "bogus"), ("dtype", "fp7")],
)
def test_finding_34_bad_recorded_profile_data_names_the_plan_file(
    tmp_path: Path, field: str, value: str
) -> None:
    _, data = _recorded_plan(tmp_path)
    cost_inputs = data["cost_inputs"]
    assert isinstance(cost_inputs, dict)
    cost_inputs["layer_times"][0][field] = value
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    for command in (["explain", str(edited)], ["simulate", "--plan", str(edited)]):
        code, output = run_cli(*command)
        assert code == 2, output
        (line,) = output.strip().splitlines()
        assert line.startswith(f"error: {edited}:"), line
        assert value in line and "Traceback" not in output
