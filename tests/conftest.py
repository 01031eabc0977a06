"""Test-suite wide settings: the long tests run first, ``gpu`` tests skip themselves where
there is no CUDA, and shared test helpers (``tests/cluster_builders.py``) are importable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The long tests (processes, torchrun, whole quick starts) first: pytest-xdist hands
    # tests out in this order, so none of them starts last while the other workers idle.
    items.sort(key=lambda item: not ({"distributed", "slow"} & set(item.keywords)))
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
