"""Least-squares fits of measured times: the alpha-beta link model.

A message of S bytes over a link takes ``t = alpha + S / B`` (Hockney 1994). Fitting it to
(S_i, t_i) by least squares on *relative* residuals, ``(alpha + S_i beta - t_i) / t_i``,
weighs a 1 MiB message as much as a 1 GiB one, so the latency is not lost under the large
messages' absolute errors. Non-negative least squares keeps alpha >= 0 and beta >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

__all__ = ["AlphaBeta", "fit_alpha_beta"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AlphaBeta:
    latency_s: float
    bandwidth_bytes_per_s: float

    def time_s(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


def fit_alpha_beta(message_bytes: Sequence[float], time_s: Sequence[float]) -> AlphaBeta:
    """alpha and B minimising the squared relative error over the measured sizes."""
    sizes = np.asarray(message_bytes, dtype=np.float64)
    times = np.asarray(time_s, dtype=np.float64)
    if sizes.shape != times.shape or sizes.size == 0 or np.any(times <= 0):
        raise ValueError(f"need matching positive measurements, got {sizes} and {times}")
    weights = 1.0 / times
    design = np.stack([np.ones_like(sizes), sizes], axis=1) * weights[:, None]
    (alpha, beta), _ = nnls(design, times * weights)
    if beta <= 0:  # one size, or times falling with size: all of it is latency
        beta = float(np.min(times / sizes)) * 1e-6
    return AlphaBeta(latency_s=float(alpha), bandwidth_bytes_per_s=float(1.0 / beta))
