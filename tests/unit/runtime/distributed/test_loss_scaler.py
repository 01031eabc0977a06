"""The dynamic loss scaler follows torch's own update kernel step for step."""

from __future__ import annotations

import random

import pytest
import torch

from piebald.runtime.distributed.loss_scaler import DynamicLossScaler, LossScalerConfig


@pytest.mark.parametrize("seed", range(5))
def test_matches_torch_amp_update_scale(seed: int) -> None:
    config = LossScalerConfig(init_scale=2.0**10, growth_interval=3)
    ours = DynamicLossScaler(config)
    scale = torch.tensor([config.init_scale])
    tracker = torch.tensor([0], dtype=torch.int32)
    rng = random.Random(seed)
    for _ in range(60):
        found_inf = rng.random() < 0.25
        torch._amp_update_scale_(
            scale,
            tracker,
            torch.tensor([1.0 if found_inf else 0.0]),
            config.growth_factor,
            config.backoff_factor,
            config.growth_interval,
        )
        ours.update(found_inf=found_inf)
        assert ours.scale == scale.item()
        assert ours.growth_tracker == tracker.item()


def test_state_round_trip() -> None:
    scaler = DynamicLossScaler(LossScalerConfig(growth_interval=2))
    for found_inf in (False, True, False):
        scaler.update(found_inf=found_inf)
    again = DynamicLossScaler(LossScalerConfig(growth_interval=2))
    again.load_state_dict(scaler.state_dict())
    assert (again.scale, again.growth_tracker) == (scaler.scale, scaler.growth_tracker)
    assert scaler.inverse_scale() * scaler.scale == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [{"init_scale": 0.0}, {"growth_factor": 1.0}, {"backoff_factor": 1.0}, {"growth_interval": 0}],
)
def test_bad_config_is_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="LossScalerConfig"):
        LossScalerConfig(**kwargs)  # type: ignore[arg-type]
