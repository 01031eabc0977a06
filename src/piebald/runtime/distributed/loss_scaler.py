"""Dynamic loss scaling for fp16 training (Micikevicius et al. 2018, "Mixed Precision
Training"), with the update rule of ``torch.amp.GradScaler``.

fp16 gradients underflow unless the loss is multiplied by a large scale before backward.
Each step the unscaled gradients are checked for inf/nan: on overflow the step is skipped
and the scale multiplied by ``backoff_factor``; after ``growth_interval`` good steps in a
row it is multiplied by ``growth_factor``. The overflow verdict must be the same on every
rank (a rank that steps while another skips would fork the replicas), so the caller
decides it from a world-wide all-reduce (:mod:`piebald.runtime.distributed.optimizer`) and every
rank applies :meth:`DynamicLossScaler.update` with the same verdict.

Pure Python: the scale is a float, so its state checkpoints as two numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DynamicLossScaler", "LossScalerConfig"]

_FP32_MAX = 3.4028234663852886e38


@dataclass(frozen=True, slots=True, kw_only=True)
class LossScalerConfig:
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        if not self.init_scale > 0:
            raise ValueError(f"LossScalerConfig.init_scale = {self.init_scale}; expected > 0")
        if not self.growth_factor > 1:
            raise ValueError(f"LossScalerConfig.growth_factor = {self.growth_factor}; expected > 1")
        if not 0 < self.backoff_factor < 1:
            raise ValueError(
                f"LossScalerConfig.backoff_factor = {self.backoff_factor}; expected in (0, 1)"
            )
        if self.growth_interval < 1:
            raise ValueError(
                f"LossScalerConfig.growth_interval = {self.growth_interval}; expected >= 1"
            )


class DynamicLossScaler:
    """The current scale and the count of good steps since it last changed."""

    def __init__(self, config: LossScalerConfig | None = None) -> None:
        self.config = config or LossScalerConfig()
        self.scale = self.config.init_scale
        self.growth_tracker = 0

    def inverse_scale(self) -> float:
        # GradScaler multiplies by the fp32 reciprocal; the scale is a power of two with
        # the default factors, so the reciprocal is exact.
        return 1.0 / self.scale

    def update(self, *, found_inf: bool) -> None:
        """``torch._amp_update_scale_``: back off on overflow, grow after a run of good steps."""
        if found_inf:
            self.scale *= self.config.backoff_factor
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.config.growth_interval:
            grown = self.scale * self.config.growth_factor
            # GradScaler keeps its scale in fp32 and refuses a growth that overflows it.
            if grown <= _FP32_MAX:
                self.scale = grown
            self.growth_tracker = 0

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.scale = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
