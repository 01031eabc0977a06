"""Builders of synthetic profiles (no torch): the DB, the lookup and the calibration are
tested on numbers whose right answers are known."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from piebald.profiler.keys import ComputeKey, layer_signature
from piebald.profiler.records import ComputeProfile, DeviceInfo, LayerTiming, Provenance
from piebald.specs.devices import Dtype
from piebald.specs.model import LayerKind
from piebald.specs.presets import load_model

MakeProfile = Callable[..., ComputeProfile]


def provenance(created: str = "2026-01-01T00:00:00+00:00", host: str = "test") -> Provenance:
    return Provenance(
        host=host,
        created=created,
        torch_version="none",
        timer="perf_counter",
        num_warmup=1,
        num_repeats=3,
    )


def make_profile(
    *,
    device: str = "cpu-a",
    model: str = "tiny",
    kind: LayerKind = LayerKind.BLOCK,
    seq_len: int = 32,
    sizes: Sequence[int] = (1, 2),
    forward_s: Sequence[float] = (1e-3, 2e-3),
    backward_s: Sequence[float] | None = None,
    recompute_s: Sequence[float] | None = None,
    selective_s: Sequence[float] | None = None,
    created: str = "2026-01-01T00:00:00+00:00",
    host: str = "test",
) -> ComputeProfile:
    spec = load_model(model)
    backward = backward_s if backward_s is not None else [2 * t for t in forward_s]
    recompute = recompute_s
    if recompute is None and kind is LayerKind.BLOCK:
        recompute = [f + b for f, b in zip(forward_s, backward, strict=True)]
    timings = tuple(
        LayerTiming(
            micro_batch_size=size,
            forward_s=forward_s[i],
            backward_s=backward[i],
            backward_recompute_s=None if recompute is None else recompute[i],
            activation_bytes=1000.0 * size,
            activation_recompute_bytes=None if recompute is None else 100.0 * size,
            peak_memory_bytes=5000.0 + 1000.0 * size,
            backward_selective_s=None if selective_s is None else selective_s[i],
            activation_selective_bytes=None if selective_s is None else 300.0 * size,
        )
        for i, size in enumerate(sizes)
    )
    return ComputeProfile(
        key=ComputeKey(
            device=device,
            signature=layer_signature(spec.arch, kind),
            seq_len=seq_len,
            dtype=Dtype.FP32,
        ),
        layer_kind=kind,
        model=spec,
        device_info=DeviceInfo(
            name=device,
            reported_name="test cpu",
            in_catalog=False,
            memory_bytes=8 * 2**30,
            matmul_flops=1e11,
            copy_bytes_per_s=1e10,
        ),
        timings=timings,
        provenance=provenance(created, host),
    )


@pytest.fixture
def profile_of() -> MakeProfile:
    return make_profile
