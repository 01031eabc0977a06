"""Measured activation memory: where a profile DB has a layer's activation bytes, the memory
model, the planner's feasibility checks, the simulator and a plan file's re-pricing all use
them, and nothing else changes.

The profiles are synthetic (no torch; ``conftest.make_profile``): tiny's layers on a device
``cpu-a`` whose measured activation bytes are a chosen multiple of the analytic ones, so
every expected number is a closed form of the model's per-token formula."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from cli_runner import run_cli
from piebald.cost.compute import DEFAULT_CURVE, EfficiencyCurve
from piebald.cost.in_flight import stage_in_flight
from piebald.cost.memory import plan_rank_memory, rank_memory, stage_memory_bytes
from piebald.cost.pass_shape import PassShape
from piebald.cost.plan_estimate import estimate_plan
from piebald.cost.profiled_curve import ActivationTable, ProfiledCurve, Source, layer_key
from piebald.cost.recorded_curve import recorded_curve
from piebald.planner.search import search
from piebald.planner.stage_settings import memory_matrices
from piebald.profiler.apply import cost_inputs_for, profiled_inputs
from piebald.profiler.db import load_profile_db, write_profile
from piebald.profiler.keys import layer_signature
from piebald.schedule.prices import Prices
from piebald.simulator.engine import simulate as simulate_plan
from piebald.specs.cluster import ClusterSpec
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.devices import Dtype
from piebald.specs.job import JobSpec
from piebald.specs.model import LayerKind
from piebald.specs.plan import Plan, ZeroMode
from piebald.specs.plan_io import load_plan, plan_from_dict, plan_to_dict
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute

from .conftest import make_profile

SEQ = 32
GIB = 2**30
MODEL = load_model("tiny")  # embedding, 4 blocks, head
BLOCK = MODEL.layers[1]
NUM_BLOCKS = MODEL.arch.num_blocks


def _cluster(memory: str = "8GiB") -> ClusterSpec:
    return parse_cluster(
        {
            "name": "cpu-lab",
            "gpu_types": [
                {
                    "name": "cpu-a",
                    "memory": memory,
                    "fp32_tflops": 0.05,
                    "memory_bandwidth": "5GB/s",
                }
            ],
            "nodes": [{"name": "box", "gpu": "cpu-a", "gpus_per_node": 2, "intra_link": "2GB/s"}],
        },
        source="test",
    )


DEVICE = _cluster().device_of(0)
JOB = JobSpec(global_batch_size=8, seq_len=SEQ, precision=Dtype.FP32)


def _analytic(kind: LayerKind, size: int, *, recompute: Recompute = Recompute.NONE) -> float:
    """The formula's bytes for one micro-batch of ``size`` through a layer of ``kind``, in
    fp32."""
    layer = next(layer for layer in MODEL.layers if layer.kind is kind)
    return size * SEQ * layer.activation_bytes_per_token(dtype_bytes=4, recompute=recompute)


def _write_db(
    root: Path,
    *,
    block_factor: float = 3.0,
    block_bytes_per_sequence: float | None = None,
    sizes: tuple[int, ...] = (1, 2),
) -> Path:
    """A DB of tiny's three layer kinds on ``cpu-a``: the embedding and head measured at
    their analytic bytes, the block at ``block_factor`` x its analytic bytes (or at
    ``block_bytes_per_sequence`` x the micro-batch size), with recompute at its analytic
    bytes (its input)."""
    for kind, base_s in (
        (LayerKind.EMBEDDING, 5e-3),
        (LayerKind.BLOCK, 20e-3),
        (LayerKind.HEAD, 10e-3),
    ):
        profile = make_profile(
            kind=kind,
            seq_len=SEQ,
            sizes=sizes,
            forward_s=tuple(base_s * (1 + 0.6 * (size - 1)) for size in sizes),
        )
        timings = []
        for timing in profile.timings:
            size = timing.micro_batch_size
            kept = _analytic(kind, size)
            if kind is LayerKind.BLOCK:
                kept = (
                    block_factor * kept
                    if block_bytes_per_sequence is None
                    else block_bytes_per_sequence * size
                )
            timings.append(
                dataclasses.replace(
                    timing,
                    activation_bytes=kept,
                    activation_recompute_bytes=(
                        _analytic(kind, size, recompute=Recompute.FULL)
                        if kind is LayerKind.BLOCK
                        else None
                    ),
                )
            )
        write_profile(dataclasses.replace(profile, timings=tuple(timings)), root)
    return root


def _curve(root: Path, cluster: ClusterSpec | None = None) -> ProfiledCurve:
    return profiled_inputs(
        load_profile_db(root), cluster=cluster or _cluster(), model=MODEL, precision=JOB.precision
    ).curve


def _without_activations(curve: ProfiledCurve) -> ProfiledCurve:
    """The same measured times and calibrated curves, analytic memory."""
    return dataclasses.replace(curve, activation_tables=())


def _memory(
    curve: EfficiencyCurve,
    *,
    layers: tuple[int, int],
    size: int = 2,
    in_flight: int = 3,
    recompute: Recompute = Recompute.NONE,
    zero: ZeroMode = ZeroMode.NONE,
    fraction: float = 1.0,
    neighbors: int = 1,
    passes_only: bool = True,
) -> float:
    """A rank's memory during the passes (what activations change; the step's end, where
    its buffers are larger, does not hold any), or at its peak (``passes_only=False``)."""
    memory = rank_memory(
        MODEL,
        layer_start=layers[0],
        layer_end=layers[1],
        shape=PassShape(
            device=DEVICE, dtype=Dtype.FP32, micro_batch_size=size, seq_len=SEQ, recompute=recompute
        ),
        optimizer=JOB.optimizer,
        zero=zero,
        shard_fraction=fraction,
        num_in_flight=in_flight,
        num_neighbor_stages=neighbors,
        curve=curve,
    )
    if not passes_only:
        return memory.total_bytes
    return memory.total_bytes - memory.working_bytes + memory.pass_working_bytes


# -- the lookup -------------------------------------------------------------------------


def _table(sizes: tuple[int, ...], values: tuple[float, ...]) -> ProfiledCurve:
    table = ActivationTable(
        device=DEVICE.name,
        dtype=Dtype.FP32,
        seq_len=SEQ,
        layer=layer_key(BLOCK),
        layer_kind=LayerKind.BLOCK,
        signature=layer_signature(MODEL.arch, LayerKind.BLOCK),
        micro_batch_sizes=sizes,
        activation_bytes=values,
        activation_recompute_bytes=None,
    )
    return ProfiledCurve.over(DEFAULT_CURVE, activation_tables=(table,))


@pytest.mark.parametrize(
    ("sizes", "values", "size", "expected", "source"),
    [
        ((2, 4), (300.0, 500.0), 2, 300.0, Source.MEASURED),
        ((2, 4), (300.0, 500.0), 3, 400.0, Source.INTERPOLATED),
        ((2, 4), (300.0, 500.0), 8, 900.0, Source.EXTRAPOLATED),  # 500 + 4 x 100
        ((2, 4), (300.0, 500.0), 1, 200.0, Source.EXTRAPOLATED),  # 300 - 100
        ((2, 4, 8), (300.0, 500.0, 1300.0), 16, 2900.0, Source.EXTRAPOLATED),  # last segment
        ((2,), (300.0,), 6, 900.0, Source.EXTRAPOLATED),  # one size: through the origin
        ((2, 4), (100.0, 500.0), 1, 0.0, Source.EXTRAPOLATED),  # never below zero
    ],
)
def test_activation_lookup_interpolates_and_extrapolates_linearly(
    sizes: tuple[int, ...], values: tuple[float, ...], size: int, expected: float, source: Source
) -> None:
    curve = _table(sizes, values)
    found = curve.activation_lookup(
        BLOCK,
        shape=PassShape(
            device=DEVICE,
            dtype=Dtype.FP32,
            micro_batch_size=size,
            seq_len=SEQ,
            recompute=Recompute.NONE,
        ),
    )
    assert found is not None
    assert found[0] == pytest.approx(expected, rel=1e-12) and found[1] is source
    # No recompute column: a recomputed block is not measured; other layers, dtypes and
    # sequence lengths are not measured either.
    for layer, dtype, seq_len, recompute in (
        (BLOCK, Dtype.FP32, SEQ, True),
        (MODEL.layers[-1], Dtype.FP32, SEQ, False),
        (BLOCK, Dtype.BF16, SEQ, False),
        (BLOCK, Dtype.FP32, 2 * SEQ, False),
    ):
        unmeasured = curve.measured_activation_bytes(
            layer,
            shape=PassShape(
                device=DEVICE,
                dtype=dtype,
                micro_batch_size=size,
                seq_len=seq_len,
                recompute=recompute,
            ),
        )
        assert unmeasured is None


# -- the memory model -------------------------------------------------------------------


def test_profile_without_activations_prices_memory_exactly_as_the_formula(
    tmp_path: Path,
) -> None:
    analytic = _without_activations(_curve(_write_db(tmp_path / "db")))
    for layers in ((0, 1), (1, 3), (0, 6), (4, 6)):
        for recompute in (Recompute.NONE, Recompute.FULL):
            for zero in ZeroMode:
                kwargs = dict(layers=layers, recompute=recompute, zero=zero, fraction=0.25)
                assert _memory(analytic, **kwargs) == _memory(DEFAULT_CURVE, **kwargs)


@pytest.mark.parametrize("size", [1, 2, 4, 8])  # 4 and 8: beyond the measured 1 and 2
@pytest.mark.parametrize("in_flight", [1, 3])
@pytest.mark.parametrize(("layers", "num_blocks"), [((1, 3), 2), ((0, 6), 4), ((4, 6), 1)])
def test_block_measured_at_three_times_the_formula_adds_two_formulas_per_block_in_flight(
    tmp_path: Path, size: int, in_flight: int, layers: tuple[int, int], num_blocks: int
) -> None:
    """Without recompute a rank keeps every block's activations of every micro-batch in
    flight: 3x measured adds in_flight x blocks x 2 x the formula's bytes, nothing else."""
    measured = _curve(_write_db(tmp_path / "db", block_factor=3.0))
    common = dict(layers=layers, size=size, in_flight=in_flight)
    added = _memory(measured, **common) - _memory(DEFAULT_CURVE, **common)
    assert added == pytest.approx(
        in_flight * num_blocks * 2.0 * _analytic(LayerKind.BLOCK, size), rel=1e-9
    )
    assert added > 0


def test_with_recompute_the_measured_block_is_the_working_buffer(tmp_path: Path) -> None:
    """With recompute the blocks keep their (here analytic) inputs, and one block's full
    activations are held while it is recomputed: 3x measured adds 2 x the formula's bytes
    once, whatever the micro-batches in flight."""
    measured = _curve(_write_db(tmp_path / "db", block_factor=3.0))
    for in_flight in (1, 2, 5):
        common = dict(layers=(0, 6), size=2, in_flight=in_flight, recompute=Recompute.FULL)
        added = _memory(measured, **common) - _memory(DEFAULT_CURVE, **common)
        assert added == pytest.approx(2.0 * _analytic(LayerKind.BLOCK, 2), rel=1e-9)


def test_planner_range_matrices_are_the_exact_memory_with_measured_activations(
    tmp_path: Path,
) -> None:
    """One source: the planner's (L+1) x (L+1) matrices (``stage_memory_bytes`` and the
    stage DP's affine split of it) equal ``rank_memory`` range by range."""
    measured = _curve(_write_db(tmp_path / "db", block_factor=3.0))
    for recompute in (Recompute.NONE, Recompute.FULL):
        shape = PassShape.for_job(JOB, device=DEVICE, micro_batch_size=4, recompute=recompute)
        assert shape.dtype is Dtype.FP32
        for zero in (ZeroMode.NONE, ZeroMode.FULL):
            fixed, per_in_flight, sharded = memory_matrices(
                MODEL,
                shape=shape,
                optimizer=JOB.optimizer,
                zero=zero,
                neighbors=1,
                wire=Dtype.FP32,
                curve=measured,
            )
            whole_fixed, whole_sharded = stage_memory_bytes(
                MODEL,
                layers=None,
                shape=shape,
                optimizer=JOB.optimizer,
                zero=zero,
                num_in_flight=2,
                num_neighbor_stages=1,
                curve=measured,
            )
            for start in range(MODEL.num_layers):
                for end in range(start + 1, MODEL.num_layers + 1):
                    exact = _memory(
                        measured,
                        layers=(start, end),
                        size=4,
                        in_flight=2,
                        recompute=recompute,
                        zero=zero,
                        fraction=0.5,
                        passes_only=False,
                    )
                    dp = fixed[start, end] + 2 * per_in_flight[start, end]
                    dp += 0.5 * sharded[start, end]
                    assert dp == pytest.approx(exact, rel=1e-12)
                    whole = whole_fixed[start, end] + 0.5 * whole_sharded[start, end]
                    assert whole == pytest.approx(exact, rel=1e-12)


# -- the simulator and the plan file ----------------------------------------------------


def _simulated_peaks(plan: Plan, curve: EfficiencyCurve) -> Mapping[int, float]:
    return simulate_plan(plan, prices=Prices(plan, curve=curve), record=False).peak_memory_bytes


def test_simulated_peak_memory_rises_by_the_measured_excess(tmp_path: Path) -> None:
    measured = _curve(_write_db(tmp_path / "db", block_factor=3.0))
    analytic = _without_activations(measured)
    plan = search(_cluster(), model=MODEL, job=JOB, curve=measured).best.plan
    low, high = _simulated_peaks(plan, analytic), _simulated_peaks(plan, measured)
    prices = Prices(plan, curve=analytic)
    checked = 0
    for index, stage in enumerate(plan.stages):
        num_blocks = sum(
            layer.kind is LayerKind.BLOCK
            for layer in MODEL.layers[stage.layer_start : stage.layer_end]
        )
        for position, rank in enumerate(stage.ranks):
            block_excess = 2.0 * _analytic(LayerKind.BLOCK, stage.micro_batch_size[position])
            if not num_blocks:  # the embedding and the head are measured at the formula
                expected = 0.0
            elif (
                stage.recompute.checkpoints
            ):  # the measured block is held once, as a working buffer
                expected = block_excess
            else:  # every block of every micro-batch the simulated rank held at its peak
                static = prices.static_memory_bytes(rank)
                held = (low[rank] - static) / prices.activation_bytes(rank)
                assert held == pytest.approx(round(held)) and round(held) >= 1
                assert round(held) <= stage_in_flight(plan, index)[position]
                expected = round(held) * num_blocks * block_excess
            assert high[rank] - low[rank] == pytest.approx(expected, rel=1e-9, abs=1e-6)
            checked += 1
    assert checked == len(plan.used_ranks)


def _simulate(*args: str) -> dict[str, object]:
    code, output = run_cli("simulate", *args, "--json")
    assert code == 0, output
    data: dict[str, object] = json.loads(output)
    return data


def _plan_file(
    tmp_path: Path, db: Path, *, memory: str = "8GiB", extra: tuple[str, ...] = ()
) -> tuple[int, str, Path]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "name: cpu-lab\n"
        "gpu_types:\n"
        f"  - {{name: cpu-a, memory: {memory}, fp32_tflops: 0.05, memory_bandwidth: 5GB/s}}\n"
        "nodes:\n"
        "  - {name: box, gpu: cpu-a, gpus_per_node: 2, intra_link: 2GB/s}\n"
    )
    plan = tmp_path / "plan.json"
    code, output = run_cli(
        "plan", "--cluster", str(cluster), "--model", "tiny", "--global-batch", "8",
        "--seq-len", str(SEQ), "--precision", "fp32", "--profiles", str(db), "--out", str(plan),
        *extra,
    )  # fmt: skip
    return code, output, plan


def test_plan_file_records_the_measured_activations_and_simulate_reprices_them(
    tmp_path: Path,
) -> None:
    db = _write_db(tmp_path / "db", block_factor=3.0)
    code, output, plan_file = _plan_file(tmp_path, db)
    assert code == 0, output
    plan = load_plan(plan_file)
    assert plan.cost_inputs is not None
    recorded = plan.cost_inputs.activations
    # One entry per (layer kind, micro-batch size) the plan uses, with the DB's numbers.
    used = {
        (layer.kind.value, size)
        for stage in plan.stages
        for size in stage.micro_batch_size
        for layer in MODEL.layers[stage.layer_start : stage.layer_end]
    }
    assert {(a.layer_kind, a.micro_batch_size) for a in recorded} == used
    for entry in recorded:
        kind, size = LayerKind(entry.layer_kind), entry.micro_batch_size
        factor = 3.0 if kind is LayerKind.BLOCK else 1.0
        assert entry.activation_bytes == pytest.approx(factor * _analytic(kind, size))
        assert entry.source == ("measured" if size in (1, 2) else "extrapolated")
        if kind is LayerKind.BLOCK:
            assert entry.activation_recompute_bytes == pytest.approx(
                _analytic(kind, size, recompute=Recompute.FULL)
            )
        else:
            assert entry.activation_recompute_bytes is None
    # The JSON round trip keeps them, and the curve rebuilt from them prices every rank's
    # memory as the DB does, with and without recompute.
    again = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))), source="test")
    assert again.cost_inputs == plan.cost_inputs
    rebuilt, from_db = recorded_curve(again), _curve(db)
    for stage in plan.stages:
        for size in stage.micro_batch_size:
            for recompute in (Recompute.NONE, Recompute.FULL):
                common = dict(
                    layers=(stage.layer_start, stage.layer_end), size=size, recompute=recompute
                )
                assert _memory(rebuilt, **common) == pytest.approx(_memory(from_db, **common))
                assert _memory(rebuilt, **common) > _memory(DEFAULT_CURVE, **common)
    # simulate: the recorded numbers, the DB, and (the plan without cost_inputs) the formula.
    from_record = _simulate("--plan", str(plan_file))["peak_memory_bytes"]
    from_profiles = _simulate("--plan", str(plan_file), "--profiles", str(db))["peak_memory_bytes"]
    assert from_record == pytest.approx(from_profiles)
    bare = tmp_path / "bare.json"
    text = json.loads(plan_file.read_text())
    del text["cost_inputs"]
    bare.write_text(json.dumps(text))
    formula = _simulate("--plan", str(bare))["peak_memory_bytes"]
    assert isinstance(formula, dict) and isinstance(from_record, dict)
    assert all(from_record[rank] > formula[rank] for rank in formula)


def test_plan_without_recorded_activations_loads_and_prices_memory_by_the_formula(
    tmp_path: Path,
) -> None:
    """Plans written before memory was measured have cost_inputs without ``activations``."""
    db = _write_db(tmp_path / "db", block_factor=3.0)
    code, output, plan_file = _plan_file(tmp_path, db)
    assert code == 0, output
    text = json.loads(plan_file.read_text())
    del text["cost_inputs"]["activations"]
    old = plan_from_dict(text, source="old.json")
    assert old.cost_inputs is not None and old.cost_inputs.activations == ()
    assert old.cost_inputs.layer_times  # the times are still re-priced from the record
    rebuilt = recorded_curve(old)
    for stage in old.stages:
        common = dict(layers=(stage.layer_start, stage.layer_end), size=stage.micro_batch_size[0])
        assert _memory(rebuilt, **common) == _memory(DEFAULT_CURVE, **common)


# -- feasibility ------------------------------------------------------------------------


def _fits(plan: Plan, curve: EfficiencyCurve) -> bool:
    """Whether every rank of ``plan`` fits its GPU when priced with ``curve``."""
    for index, stage in enumerate(plan.stages):
        budgets = stage_in_flight(plan, index)
        for position, rank in enumerate(stage.ranks):
            total = plan_rank_memory(
                plan,
                stage_index=index,
                position=position,
                num_in_flight=budgets[position],
                curve=curve,
            ).total_bytes
            if total > plan.cluster.device_of(rank).memory_bytes:
                return False
    return True


def _structure(plan: Plan) -> tuple[object, ...]:
    return tuple(
        (s.layer_start, s.layer_end, s.ranks, s.micro_batch_size, s.recompute, s.max_in_flight)
        for s in plan.stages
    )


def test_measured_activations_rule_out_a_plan_the_formula_fits(tmp_path: Path) -> None:
    """On 2 GiB GPUs (0.9 GiB after the reserve) blocks that keep 0.3 GiB per sequence do
    not fit the plan the formula picks; the planner picks another that fits them."""
    cluster = _cluster("2GiB")
    measured = _curve(
        _write_db(tmp_path / "db", block_bytes_per_sequence=0.3 * GIB), cluster=cluster
    )
    analytic = _without_activations(measured)  # the same measured times
    formula_plan = search(cluster, model=MODEL, job=JOB, curve=analytic).best.plan
    assert _fits(formula_plan, analytic) and not _fits(formula_plan, measured)
    measured_plan = search(cluster, model=MODEL, job=JOB, curve=measured).best.plan
    assert _structure(measured_plan) != _structure(formula_plan)
    assert _fits(measured_plan, measured)


def test_plan_exits_3_when_the_measured_activations_fit_no_gpu(tmp_path: Path) -> None:
    """One sequence through one block keeps 1 GiB, more than a 2 GiB GPU has left after its
    reserve: no split, recompute, ZeRO mode or in-flight budget can hold a block whole.
    Split over a tensor group of 2 it keeps about half (the measurement scaled as the
    formula splits the block), which fits: tensor parallelism is what makes it feasible."""
    db = _write_db(tmp_path / "db", block_bytes_per_sequence=1.0 * GIB)
    code, output, _ = _plan_file(tmp_path, db, memory="2GiB", extra=("--tensor-parallel", "1"))
    assert code == 3, output
    assert "no feasible plan" in output.lower() and "Traceback" not in output
    (tmp_path / "tp").mkdir()
    code, output, plan_file = _plan_file(tmp_path / "tp", db, memory="2GiB")
    assert code == 0, output
    assert {stage.tensor_parallel_degree for stage in load_plan(plan_file).stages} == {2}
    # The formula alone fits that cluster easily.
    (tmp_path / "formula").mkdir()
    code, output, _ = _plan_file(tmp_path / "formula", _write_db(tmp_path / "db2"), memory="2GiB")
    assert code == 0, output


# -- the plan's predicted memory ---------------------------------------------------------


def test_predicted_peak_memory_uses_the_measured_activations(tmp_path: Path) -> None:
    db = _write_db(tmp_path / "db", block_factor=3.0)
    measured = _curve(db)
    plan = search(_cluster(), model=MODEL, job=JOB, curve=measured).best.plan
    low = estimate_plan(plan, curve=_without_activations(measured))
    high = estimate_plan(plan, curve=measured)
    for index, stage in enumerate(plan.stages):
        num_blocks = sum(
            layer.kind is LayerKind.BLOCK
            for layer in MODEL.layers[stage.layer_start : stage.layer_end]
        )
        budgets = stage_in_flight(plan, index)
        for position, rank in enumerate(stage.ranks):
            excess = num_blocks * 2.0 * _analytic(LayerKind.BLOCK, stage.micro_batch_size[position])
            held = 1 if stage.recompute.checkpoints and num_blocks else budgets[position]
            per_held = excess / num_blocks if stage.recompute.checkpoints and num_blocks else excess
            added = high.stages[index].memory[rank].total_bytes
            added -= low.stages[index].memory[rank].total_bytes
            assert added == pytest.approx(held * per_held, rel=1e-9)
    # The plan file's prediction, the simulation from its record, and cost_inputs agree.
    inputs = profiled_inputs(
        load_profile_db(db), cluster=_cluster(), model=MODEL, precision=JOB.precision
    )
    recorded = dataclasses.replace(plan, cost_inputs=cost_inputs_for(plan, inputs))
    simulated = _simulated_peaks(recorded, recorded_curve(recorded))
    predicted = estimate_plan(recorded, curve=recorded_curve(recorded)).prediction()
    if plan.num_stages == 1:  # one micro-batch in flight: the simulation reaches the budget
        assert simulated == pytest.approx(dict(predicted.peak_memory_bytes))
    assert np.all([simulated[r] <= predicted.peak_memory_bytes[r] * (1 + 1e-9) for r in simulated])
