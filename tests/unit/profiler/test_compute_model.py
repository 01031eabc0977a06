"""The cost model's lookup of measured times (exact, interpolated, extrapolated), the
alpha-beta fit and the calibration, against closed forms and known parameters."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from piebald.cost.compute import (
    DEFAULT_CURVE,
    EfficiencyCurve,
    PassKind,
    PassWork,
    layer_backward_time_s,
    layer_forward_time_s,
)
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.cost.profiled_curve import Source
from piebald.profiler.apply import profiled_curve
from piebald.profiler.calibrate import (
    Observation,
    calibrate_device,
    calibrated_curve,
    error_table,
    predict_s,
)
from piebald.profiler.db import load_profile_db, write_profile
from piebald.profiler.fit import fit_alpha_beta
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.model import LayerKind
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute

from .conftest import MakeProfile

CPU_A = DeviceType(
    name="cpu-a",
    memory_bytes=8 * 2**30,
    bf16_flops=0.0,
    fp16_flops=0.0,
    fp32_flops=1e11,
    memory_bandwidth_bytes_per_s=1e10,
)


def test_alpha_beta_recovers_exact_parameters() -> None:
    sizes = np.array([2**20, 2**22, 2**24, 2**26], dtype=float)
    times = 30e-6 + sizes / 12.5e9
    fit = fit_alpha_beta(sizes, times)
    assert fit.latency_s == pytest.approx(30e-6, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(12.5e9, rel=1e-6)
    assert fit.time_s(2**25) == pytest.approx(30e-6 + 2**25 / 12.5e9)


def test_measured_interpolated_and_extrapolated_times(
    tmp_path: Path, profile_of: MakeProfile
) -> None:
    block = load_model("tiny").layers[1]
    curve = profiled_curve(
        _db_with(tmp_path, profile_of(sizes=(2, 4, 8), forward_s=(1e-3, 1.5e-3, 3e-3))),
        model=load_model("tiny"),
        devices={"cpu-a": CPU_A},
        precision=Dtype.FP32,
    )

    def lookup(size: int, kind: PassKind = PassKind.FORWARD) -> tuple[float, Source]:
        found = curve.lookup(
            block,
            shape=PassShape(
                device=CPU_A,
                dtype=Dtype.FP32,
                micro_batch_size=size,
                seq_len=32,
                recompute=Recompute.NONE,
            ),
            kind=kind,
        )
        assert found is not None
        return found

    assert lookup(4) == (1.5e-3, Source.MEASURED)
    assert lookup(8, PassKind.BACKWARD) == (6e-3, Source.MEASURED)
    assert lookup(8, PassKind.BACKWARD_RECOMPUTE) == (3e-3 + 6e-3, Source.MEASURED)
    value, source = lookup(6)
    assert source is Source.INTERPOLATED and value == pytest.approx((1.5e-3 + 3e-3) / 2)
    # Beyond: the edge measurement times the ratio of the block's calibrated curve (the
    # kind's rates with the block's own fixed time).
    value, source = lookup(16)
    fitted = curve.for_device(
        CPU_A, layer_kind=LayerKind.BLOCK, pass_kind=PassKind.FORWARD, layer=block
    )

    def analytic(size: int) -> float:
        return layer_forward_time_s(
            block,
            shape=PassShape(
                device=CPU_A,
                dtype=Dtype.FP32,
                micro_batch_size=size,
                seq_len=32,
                recompute=Recompute.NONE,
            ),
            curve=fitted,
        )

    assert source is Source.EXTRAPOLATED
    assert value == pytest.approx(3e-3 * analytic(16) / analytic(8))
    value, source = lookup(1)
    assert source is Source.EXTRAPOLATED
    assert value == pytest.approx(1e-3 * analytic(1) / analytic(2))
    # Not measured: another sequence length, another device, another model's layer.
    other = DeviceType(**{**_fields(CPU_A), "name": "cpu-z"})
    assert (
        curve.measured_time_s(
            block,
            shape=PassShape(
                device=CPU_A,
                dtype=Dtype.FP32,
                micro_batch_size=2,
                seq_len=64,
                recompute=Recompute.NONE,
            ),
            kind=PassKind.FORWARD,
        )
        is None
    )
    assert (
        curve.measured_time_s(
            block,
            shape=PassShape(
                device=other,
                dtype=Dtype.FP32,
                micro_batch_size=2,
                seq_len=32,
                recompute=Recompute.NONE,
            ),
            kind=PassKind.FORWARD,
        )
        is None
    )
    gpt2_block = load_model("gpt2").layers[1]
    assert (
        curve.measured_time_s(
            gpt2_block,
            shape=PassShape(
                device=CPU_A,
                dtype=Dtype.FP32,
                micro_batch_size=2,
                seq_len=32,
                recompute=Recompute.NONE,
            ),
            kind=PassKind.FORWARD,
        )
        is None
    )


def _fields(device: DeviceType) -> dict[str, object]:
    return {name: getattr(device, name) for name in DeviceType.__dataclass_fields__}


def _db_with(tmp_path: Path, *profiles: object) -> object:
    for profile in profiles:
        write_profile(profile, tmp_path)  # type: ignore[arg-type]
    return load_profile_db(tmp_path)


def test_pass_times_use_the_measured_numbers(tmp_path: Path, profile_of: MakeProfile) -> None:
    model = load_model("tiny")
    db = _db_with(
        tmp_path,
        profile_of(kind=LayerKind.EMBEDDING, forward_s=(1e-4, 1.5e-4)),
        profile_of(kind=LayerKind.BLOCK, forward_s=(1e-3, 1.8e-3)),
        profile_of(kind=LayerKind.HEAD, forward_s=(4e-4, 7e-4)),
    )
    curve = profiled_curve(db, model=model, devices={"cpu-a": CPU_A}, precision=Dtype.FP32)
    assert hash(curve) == hash(
        profiled_curve(db, model=model, devices={"cpu-a": CPU_A}, precision=Dtype.FP32)
    )
    for recompute in (Recompute.NONE, Recompute.FULL):
        times = pass_times(
            model,
            shape=PassShape(
                device=CPU_A, dtype=Dtype.FP32, micro_batch_size=2, seq_len=32, recompute=recompute
            ),
            curve=curve,
        )
        forward = np.diff(times.forward_prefix_s)
        backward = np.diff(times.backward_prefix_s)
        blocks = model.arch.num_blocks
        assert forward == pytest.approx([1.5e-4, *[1.8e-3] * blocks, 7e-4])
        block_backward = 1.8e-3 + 3.6e-3 if recompute.checkpoints else 3.6e-3
        assert backward == pytest.approx([3e-4, *[block_backward] * blocks, 1.4e-3])
    # A device the DB never saw is priced by the analytic default, as before.
    other = DeviceType(**{**_fields(CPU_A), "name": "cpu-z"})
    assert layer_backward_time_s(
        model.layers[1],
        shape=PassShape(
            device=other, dtype=Dtype.FP32, micro_batch_size=2, seq_len=32, recompute=Recompute.NONE
        ),
        curve=curve,
    ) == pytest.approx(
        layer_backward_time_s(
            model.layers[1],
            shape=PassShape(
                device=other,
                dtype=Dtype.FP32,
                micro_batch_size=2,
                seq_len=32,
                recompute=Recompute.NONE,
            ),
        )
    )


def test_calibration_recovers_known_curves() -> None:
    """Times made by known per-kind curves, some not overlapping compute with memory
    traffic: the fit finds them (within 1% on the times)."""
    truth = {
        (LayerKind.EMBEDDING, PassKind.FORWARD): EfficiencyCurve(
            max_fraction=0.5, bandwidth_fraction=0.3, half_saturation_s=20e-6
        ),
        (LayerKind.EMBEDDING, PassKind.BACKWARD): EfficiencyCurve(
            max_fraction=0.5,
            bandwidth_fraction=0.4,
            half_saturation_s=50e-6,
            embedding_table_passes=3.0,
        ),
        (LayerKind.BLOCK, PassKind.FORWARD): EfficiencyCurve(
            max_fraction=0.35, bandwidth_fraction=0.5, half_saturation_s=200e-6, overlap=0.5
        ),
        (LayerKind.BLOCK, PassKind.BACKWARD): EfficiencyCurve(
            max_fraction=0.25, bandwidth_fraction=0.5, half_saturation_s=400e-6
        ),
        (LayerKind.HEAD, PassKind.FORWARD): EfficiencyCurve(
            max_fraction=0.45, bandwidth_fraction=0.6, half_saturation_s=80e-6
        ),
        (LayerKind.HEAD, PassKind.BACKWARD): EfficiencyCurve(
            max_fraction=0.4, bandwidth_fraction=0.6, half_saturation_s=120e-6, overlap=0.0
        ),
    }
    observations = []
    for model_name in ("tiny", "gpt2"):
        model = load_model(model_name)
        seen: set[LayerKind] = set()
        for layer in model.layers:
            if layer.kind in seen:
                continue
            seen.add(layer.kind)
            for seq_len in (32, 64):
                for size in (1, 2, 4):
                    for pass_kind in (PassKind.FORWARD, PassKind.BACKWARD):
                        probe = Observation(
                            model=model_name,
                            layer=layer,
                            seq_len=seq_len,
                            micro_batch_size=size,
                            pass_kind=pass_kind,
                            measured_s=1.0,
                        )
                        exact = predict_s(
                            probe,
                            device=CPU_A,
                            dtype=Dtype.FP32,
                            curve=truth[layer.kind, pass_kind],
                        )
                        observations.append(
                            Observation(**{**_obs_fields(probe), "measured_s": exact})
                        )
    fitted = calibrated_curve(calibrate_device(observations, device=CPU_A, dtype=Dtype.FP32))
    before = error_table(observations, device=CPU_A, dtype=Dtype.FP32, curve=DEFAULT_CURVE)
    after = error_table(observations, device=CPU_A, dtype=Dtype.FP32, curve=fitted)
    assert max(row.max_abs_error for row in after) < 0.01
    assert max(row.mean_abs_error for row in before) > 0.3  # the default was far off


def _obs_fields(observation: Observation) -> dict[str, object]:
    return {name: getattr(observation, name) for name in Observation.__dataclass_fields__}


def test_overlap_spans_roofline_to_sum() -> None:
    """Closed form: c = 2 ms compute, m = 1 ms memory, 0.1 ms fixed; overlap 1 is the
    roofline max(c, m), 0 the sum c + m, 0.25 hides a quarter of the shorter."""
    device = replace(CPU_A, name="rates", fp32_flops=1e12, memory_bandwidth_bytes_per_s=1e9)
    work = PassWork(  # at max_fraction = bandwidth_fraction = 0.5
        matmul_flops=2e9 * 0.5, attention_flops=0.0, gemm_bytes=1e6 * 0.5, stream_bytes=0.0,
        kernels=0.0,
    )  # fmt: skip

    def time_s(overlap: float) -> float:
        curve = EfficiencyCurve(
            max_fraction=0.5, bandwidth_fraction=0.5, half_saturation_s=1e-4, overlap=overlap
        )
        return curve.time_s(work=work, device=device, dtype=Dtype.FP32)

    assert time_s(1.0) == pytest.approx(2e-3 + 1e-4)
    assert time_s(0.0) == pytest.approx(3e-3 + 1e-4)
    assert time_s(0.25) == pytest.approx(2e-3 + 0.75e-3 + 1e-4)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="overlap"):
            EfficiencyCurve(overlap=bad)


def test_calibration_gives_each_measured_layer_its_own_fixed_time() -> None:
    """Embedding forwards of tiny and gpt2 made with one bandwidth and different fixed
    times (gpt2's learned positions run more kernels): the fit finds both fixed times,
    the kind's rates, and reproduces the times; one shared fixed time could not."""
    rates = EfficiencyCurve(max_fraction=0.6, bandwidth_fraction=0.3)
    fixed_s = {"tiny": 0.3e-3, "gpt2": 0.45e-3}
    observations = []
    for model_name, fixed in fixed_s.items():
        embedding = load_model(model_name).layers[0]
        truth = EfficiencyCurve(max_fraction=0.6, bandwidth_fraction=0.3, half_saturation_s=fixed)
        for seq_len in (32, 64):
            for size in (1, 2, 4):
                probe = Observation(
                    model=model_name,
                    layer=embedding,
                    seq_len=seq_len,
                    micro_batch_size=size,
                    pass_kind=PassKind.FORWARD,
                    measured_s=1.0,
                )
                exact = predict_s(probe, device=CPU_A, dtype=Dtype.FP32, curve=truth)
                observations.append(Observation(**{**_obs_fields(probe), "measured_s": exact}))
    kind_curves = calibrate_device(observations, device=CPU_A, dtype=Dtype.FP32)
    own = {c.model: c.curve for c in kind_curves if c.layer is not None}
    assert set(own) == {"tiny", "gpt2"}
    for model_name, fixed in fixed_s.items():
        assert own[model_name].half_saturation_s == pytest.approx(fixed, rel=0.05)
        assert own[model_name].bandwidth_fraction == pytest.approx(rates.bandwidth_fraction, 0.05)
    fitted = calibrated_curve(kind_curves)
    after = error_table(observations, device=CPU_A, dtype=Dtype.FP32, curve=fitted)
    assert after[0].max_abs_error < 0.02
    # The kind's curve alone (what an unmeasured embedding gets) misses one of the two.
    shared = calibrated_curve([c for c in kind_curves if c.layer is None])
    alone = error_table(observations, device=CPU_A, dtype=Dtype.FP32, curve=shared)
    assert alone[0].max_abs_error > 0.05
