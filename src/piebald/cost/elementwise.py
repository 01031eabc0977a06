"""numpy's where, maximum, minimum and clip for formulas written once for one layer range
(Python or numpy scalars: the exact checks, thousands of calls) and for arrays of every
range (the planner's matrices): numpy where an argument is an array, plain Python
otherwise, without numpy's per-call cost on scalars."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["clip", "maximum", "minimum", "where"]


def where(condition: Any, yes: Any, no: Any) -> Any:
    if isinstance(condition, np.ndarray):
        return np.where(condition, yes, no)
    return yes if condition else no


def maximum(a: Any, b: Any) -> Any:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b else b


def minimum(a: Any, b: Any) -> Any:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return a if a <= b else b


def clip(value: Any, low: Any, high: Any) -> Any:
    return minimum(maximum(value, low), high)
