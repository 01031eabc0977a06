"""``piebald simulate --profiles DIR`` and a plan's recorded ``cost_inputs``: the simulator
and the prediction it is compared with are priced with the numbers the planner used.

The profiles are synthetic (no torch): tiny's layers on a device ``cpu-a`` measured 50x
slower than the analytic model says, so a simulation priced analytically is far from one
priced from the profiles, and an accidental fallback to the formulas shows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cli_runner import run_cli
from cluster_builders import CPU_LAB_YAML
from piebald.cost.compute import DEFAULT_CURVE, layer_backward_time_s
from piebald.cost.memory import layer_activation_bytes
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.plan_estimate import estimate_plan
from piebald.cost.profiled_curve import ProfiledCurve
from piebald.cost.recorded_curve import recorded_curve
from piebald.errors import SpecError
from piebald.profiler.apply import profiled_inputs
from piebald.profiler.db import load_profile_db, write_profile
from piebald.specs.model import LayerKind
from piebald.specs.plan import CalibratedCurve, MeasuredLayerTime
from piebald.specs.plan_io import load_plan, plan_from_dict, plan_to_dict
from piebald.specs.recompute import Recompute

from .conftest import MakeProfile

SEQ = 32


@pytest.fixture
def made(tmp_path: Path, profile_of: MakeProfile) -> tuple[Path, Path, Path]:
    """(profile DB, cluster file, plan file made with ``plan --profiles``)."""
    db = tmp_path / "db"
    # Per kind, times at micro-batch sizes 1 and 2: a fixed part and a per-sequence part,
    # tens of milliseconds where the analytic model says well under one.
    for kind, base_s in (
        (LayerKind.EMBEDDING, 5e-3),
        (LayerKind.BLOCK, 20e-3),
        (LayerKind.HEAD, 10e-3),
    ):
        write_profile(
            profile_of(
                kind=kind,
                seq_len=SEQ,
                sizes=(1, 2),
                forward_s=(base_s, 1.6 * base_s),
            ),
            db,
        )
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CPU_LAB_YAML)
    plan = tmp_path / "plan.json"
    code, output = run_cli(
        "plan", "--cluster", str(cluster), "--model", "tiny", "--global-batch", "8",
        "--seq-len", str(SEQ), "--precision", "fp32", "--profiles", str(db), "--out", str(plan),
    )  # fmt: skip
    assert code == 0, output
    return db, cluster, plan


def _simulate(*args: str) -> dict[str, object]:
    code, output = run_cli("simulate", *args, "--json")
    assert code == 0, output
    data: dict[str, object] = json.loads(output)
    return data


def test_recorded_curve_prices_the_plan_as_the_planner_did(
    made: tuple[Path, Path, Path],
) -> None:
    db, _, plan_file = made
    plan = load_plan(plan_file)
    assert plan.cost_inputs is not None and plan.cost_inputs.layer_times
    assert plan.predicted is not None
    inputs = profiled_inputs(
        load_profile_db(db), cluster=plan.cluster, model=plan.model, precision=plan.job.precision
    )
    rebuilt = recorded_curve(plan)
    # Every pass of every stage at every size the plan uses, with and without recompute.
    compared = 0
    for stage in plan.stages:
        for rank, size in zip(stage.ranks, stage.micro_batch_size, strict=True):
            device = plan.cluster.device_of(rank)
            for recompute in (Recompute.NONE, Recompute.FULL):
                times = [
                    pass_times(
                        plan.model,
                        shape=PassShape(
                            device=device,
                            dtype=device.training_dtype(plan.job.precision),
                            micro_batch_size=size,
                            seq_len=SEQ,
                            recompute=recompute,
                        ),
                        curve=curve,
                    )
                    for curve in (inputs.curve, rebuilt)
                ]
                start, end = stage.layer_start, stage.layer_end
                assert times[1].forward_s(start, end) == pytest.approx(
                    times[0].forward_s(start, end)
                )
                assert times[1].backward_s(start, end) == pytest.approx(
                    times[0].backward_s(start, end)
                )
                compared += 1
    assert compared > 0
    # The whole estimate: the recorded curve gives the plan's own prediction; the
    # analytic model gives something else entirely.
    recorded = estimate_plan(plan, curve=rebuilt).step_time_s
    assert recorded == pytest.approx(plan.predicted.step_time_s)
    assert estimate_plan(plan, curve=DEFAULT_CURVE).step_time_s < 0.5 * recorded
    assert recorded_curve(plan.__class__(**_without_cost_inputs(plan))) is DEFAULT_CURVE


def _without_cost_inputs(plan: object) -> dict[str, object]:
    fields = type(plan).__dataclass_fields__  # type: ignore[attr-defined]
    out = {name: getattr(plan, name) for name, f in fields.items() if f.init}
    out["cost_inputs"] = None
    return out


def _simulated_as_planned(plan_file: Path, db: Path) -> tuple[dict[str, object], ...]:
    """The plan simulated from its records and from ``db``: each run's prediction is the
    plan's, and the two simulated steps agree."""
    plan = load_plan(plan_file)
    assert plan.predicted is not None
    recorded = _simulate("--plan", str(plan_file))
    from_db = _simulate("--plan", str(plan_file), "--profiles", str(db))
    for data in (recorded, from_db):
        predicted = data["predicted"]
        assert isinstance(predicted, dict)
        assert predicted["step_time_s"] == pytest.approx(plan.predicted.step_time_s)
    assert recorded["step_time_s"] == pytest.approx(from_db["step_time_s"])
    return recorded, from_db


@pytest.mark.slow
def test_simulate_prices_from_the_recorded_inputs_and_from_profiles(
    made: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    db, _, plan_file = made
    recorded, from_db = _simulated_as_planned(plan_file, db)
    assert recorded["deadlock"] is None and from_db["deadlock"] is None
    # The same plan without its cost_inputs is simulated by the formulas: much faster.
    bare = tmp_path / "bare.json"
    text = json.loads(plan_file.read_text())
    del text["cost_inputs"]
    bare.write_text(json.dumps(text))
    analytic = _simulate("--plan", str(bare))
    assert isinstance(analytic["step_time_s"], float)
    assert isinstance(recorded["step_time_s"], float)
    assert analytic["step_time_s"] < 0.5 * recorded["step_time_s"]
    # --profiles on the bare plan prices it from the DB again.
    again = _simulate("--plan", str(bare), "--profiles", str(db))
    assert again["step_time_s"] == pytest.approx(recorded["step_time_s"])
    code, output = run_cli("simulate", "--plan", str(plan_file))
    assert code == 0 and "priced from the measurements the plan records" in " ".join(output.split())


def test_a_plan_whose_db_measured_none_of_its_gpus_says_it_is_analytic(
    made: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    db = made[0]
    other = tmp_path / "other.yaml"  # GPU types the DB did not measure
    other.write_text(CPU_LAB_YAML.replace("cpu-a", "cpu-b"))
    plan_file = tmp_path / "other-plan.json"
    code, output = run_cli(
        "plan", "--cluster", str(other), "--model", "tiny", "--global-batch", "4",
        "--seq-len", str(SEQ), "--profiles", str(db), "--out", str(plan_file),
    )  # fmt: skip
    assert code == 0 and "no compute profile of cpu-b" in " ".join(output.split()), output
    code, output = run_cli("simulate", "--plan", str(plan_file))
    text = " ".join(output.split())
    assert code == 0 and "priced by the analytic cost model (the profile DB" in text, output
    assert "measured none of its GPU types or links" in text


def _plan_selective(db: Path, cluster: Path, plan_file: Path) -> Path:
    """``plan --profiles db --recompute selective`` of tiny on ``cluster``, written."""
    code, output = run_cli(
        "plan", "--cluster", str(cluster), "--model", "tiny", "--global-batch", "8",
        "--seq-len", str(SEQ), "--precision", "fp32", "--profiles", str(db),
        "--recompute", "selective", "--out", str(plan_file),
    )  # fmt: skip
    assert code == 0, output
    return plan_file


@pytest.mark.slow
def test_a_selective_plan_is_repriced_from_its_records_as_planned(
    made: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Profiles measured before piebald timed a selective backward: a selectively
    recomputed block is priced as its measured backward plus the analytic rerun on the
    calibrated curve, and the plan's records reproduce that, as ``--profiles`` does."""
    db, cluster, _ = made
    plan_file = _plan_selective(db, cluster, tmp_path / "selective.json")
    assert {stage.recompute for stage in load_plan(plan_file).stages} == {Recompute.SELECTIVE}
    _simulated_as_planned(plan_file, db)


def test_a_measured_selective_backward_prices_the_plan_and_its_records(
    tmp_path: Path, profile_of: MakeProfile
) -> None:
    """Profiles that time a selective backward and measure its bytes: a selectively
    recomputed block is priced with those numbers, not the analytic rerun, the plan
    records them, and its records reproduce its estimate."""
    db = tmp_path / "db"
    selective_s = (0.15, 0.2)  # far from backward + the analytic rerun: a fallback shows
    for kind, base_s in (
        (LayerKind.EMBEDDING, 5e-3),
        (LayerKind.BLOCK, 20e-3),
        (LayerKind.HEAD, 10e-3),
    ):
        measured = selective_s if kind is LayerKind.BLOCK else None
        forward_s = (base_s, 1.6 * base_s)
        write_profile(
            profile_of(kind=kind, seq_len=SEQ, forward_s=forward_s, selective_s=measured), db
        )
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CPU_LAB_YAML)
    plan_file = _plan_selective(db, cluster, tmp_path / "selective.json")
    plan = load_plan(plan_file)
    assert plan.cost_inputs is not None
    blocks = [t for t in plan.cost_inputs.layer_times if t.layer_kind == LayerKind.BLOCK.value]
    kept = [a for a in plan.cost_inputs.activations if a.layer_kind == LayerKind.BLOCK.value]
    assert blocks and kept
    # Priced from the DB: at a measured size the measured numbers themselves.
    inputs = profiled_inputs(
        load_profile_db(db), cluster=plan.cluster, model=plan.model, precision=plan.job.precision
    )
    device = plan.cluster.device_of(plan.stages[0].ranks[0])
    block = next(layer for layer in plan.model.layers if layer.kind is LayerKind.BLOCK)
    shape = PassShape(
        device=device,
        dtype=device.training_dtype(plan.job.precision),
        micro_batch_size=1,
        seq_len=SEQ,
        recompute=Recompute.SELECTIVE,
    )
    assert layer_backward_time_s(block, shape=shape, curve=inputs.curve) == selective_s[0]
    assert layer_activation_bytes(block, shape=shape, curve=inputs.curve) == 300.0
    # The plan records them at the sizes it uses (extrapolated beyond the measured ones).
    for entry in blocks:
        at = dataclasses.replace(shape, micro_batch_size=entry.micro_batch_size)
        priced = layer_backward_time_s(block, shape=at, curve=inputs.curve)
        assert entry.backward_selective_s == pytest.approx(priced)
    for activation in kept:
        assert activation.activation_selective_bytes == 300.0 * activation.micro_batch_size
    _simulated_as_planned(plan_file, db)


def test_simulate_bad_profiles_and_bad_recorded_inputs_are_one_line(
    made: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, _, plan_file = made
    code, output = run_cli("simulate", "--plan", str(plan_file), "--profiles", str(tmp_path / "no"))
    assert code == 2 and "Traceback" not in output
    plan = load_plan(plan_file)
    assert plan.cost_inputs is not None
    entry = plan.cost_inputs.layer_times[0]
    broken = MeasuredLayerTime(
        **{
            **{name: getattr(entry, name) for name in MeasuredLayerTime.__dataclass_fields__},
            "layer_kind": "decoder",
        }
    )
    fields = _without_cost_inputs(plan)
    fields["cost_inputs"] = plan.cost_inputs.__class__(
        profile_db=plan.cost_inputs.profile_db,
        profile_db_digest=plan.cost_inputs.profile_db_digest,
        layer_times=(broken,),
    )
    with pytest.raises(SpecError, match=r"cost_inputs.layer_times\[0\].layer_kind"):
        recorded_curve(plan.__class__(**fields))


def test_recorded_calibrated_curves_keep_their_overlap(made: tuple[Path, Path, Path]) -> None:
    """A curve recorded in a plan survives the JSON round trip with every parameter, the
    compute/memory overlap included, and re-pricing uses it."""
    _, _, plan_file = made
    plan = load_plan(plan_file)
    assert plan.cost_inputs is not None
    curve = CalibratedCurve(
        device="cpu-a",
        layer_kind=LayerKind.BLOCK.value,
        pass_kind="forward",
        max_fraction=0.4,
        bandwidth_fraction=0.6,
        half_saturation_s=2e-4,
        overlap=0.3,
    )
    with_curve = dataclasses.replace(
        plan, cost_inputs=dataclasses.replace(plan.cost_inputs, curves=(curve,))
    )
    again = plan_from_dict(json.loads(json.dumps(plan_to_dict(with_curve))), source="test")
    assert again.cost_inputs is not None and again.cost_inputs.curves == (curve,)
    rebuilt = recorded_curve(again)
    assert isinstance(rebuilt, ProfiledCurve)
    assert [k.curve.overlap for k in rebuilt.kind_curves] == [0.3]
