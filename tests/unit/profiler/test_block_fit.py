"""The block fit recovers fractions and protocol traffic it was given (times made by the cost
model itself), and its vectorised prices are the cost model's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from piebald.profiler.block_fit import (
    BlockTime,
    ProtocolTraffic,
    fit_block_times,
    predicted_times_s,
    with_fractions,
)
from piebald.specs.devices import ATTENTION_SHARE_OF_MATMUL, Dtype, builtin_catalog
from piebald.specs.model import LayerKind
from piebald.specs.presets import load_model

BLOCK = next(layer for layer in load_model("llama-2-7b").layers if layer.kind is LayerKind.BLOCK)
TRUTH = {
    ("A100-80GB", Dtype.FP16): 0.7,
    ("A100-80GB", Dtype.FP32): 0.9,
    ("T4", Dtype.FP16): 0.5,
    ("T4", Dtype.FP32): 0.4,
}
TRAFFIC = ProtocolTraffic(
    forward_16bit=6.0, backward_16bit=18.0, forward_fp32=2.0, backward_fp32=12.0
)


def _times() -> list[BlockTime]:
    catalog = builtin_catalog()
    out = []
    for (name, dtype), matmul in TRUTH.items():
        # Attention at exactly the prior's share: the prior pulls nowhere, so the fit must
        # land on the truth.
        device = replace(
            catalog[name],
            matmul_efficiency=matmul,
            attention_efficiency=matmul * ATTENTION_SHARE_OF_MATMUL,
            fp32_matmul_efficiency=matmul,
            fp32_attention_efficiency=matmul * ATTENTION_SHARE_OF_MATMUL,
        )
        for seq_len in (512, 2048, 4096):
            for size in (1, 2, 3, 5):
                shape = BlockTime(
                    device=device,
                    dtype=dtype,
                    layer=BLOCK,
                    seq_len=seq_len,
                    micro_batch_size=size,
                    forward_s=1.0,
                    backward_s=1.0,
                )
                forward_s, backward_s = predicted_times_s(shape, traffic=TRAFFIC)
                out.append(
                    replace(shape, device=catalog[name], forward_s=forward_s, backward_s=backward_s)
                )
    return out


def test_the_fit_recovers_the_fractions_and_traffic_that_made_the_times() -> None:
    fit = fit_block_times(_times())
    assert set(fit.fractions) == set(TRUTH)
    for key, matmul in TRUTH.items():
        assert fit.fractions[key].matmul == pytest.approx(matmul, rel=1e-4)
        assert fit.fractions[key].attention == pytest.approx(
            matmul * ATTENTION_SHARE_OF_MATMUL, rel=1e-3
        )
        assert fit.fractions[key].num_times == 12
    for field in ("forward_16bit", "backward_16bit", "forward_fp32", "backward_fp32"):
        assert getattr(fit.traffic, field) == pytest.approx(getattr(TRAFFIC, field), abs=1e-2)


def test_the_fitted_device_prices_the_times_as_the_fit_did() -> None:
    """with_fractions puts the fit on the device, and the cost model's own pricing of every
    time then matches the measurement: the fit's vectorised terms are the cost model's."""
    times = _times()
    fit = fit_block_times(times)
    catalog = builtin_catalog()
    for time in times:
        device = with_fractions(catalog[time.device.name], fit)
        forward_s, backward_s = predicted_times_s(replace(time, device=device), traffic=fit.traffic)
        assert forward_s == pytest.approx(time.forward_s, rel=1e-4)
        assert backward_s == pytest.approx(time.backward_s, rel=1e-4)


def test_with_fractions_leaves_other_types_and_dtypes_alone() -> None:
    fit = fit_block_times([t for t in _times() if t.dtype is Dtype.FP16])
    v100 = builtin_catalog()["V100-16GB"]
    assert with_fractions(v100, fit) == v100
    t4 = with_fractions(builtin_catalog()["T4"], fit)
    assert t4.matmul_efficiency == pytest.approx(0.5, rel=1e-4)
    assert t4.fp32_matmul_efficiency == builtin_catalog()["T4"].fp32_matmul_efficiency


def test_no_times_or_a_non_positive_one_is_refused() -> None:
    with pytest.raises(ValueError, match="no block times"):
        fit_block_times([])
    with pytest.raises(ValueError, match="> 0"):
        fit_block_times([replace(_times()[0], backward_s=0.0)])
