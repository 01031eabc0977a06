"""Example cluster files shipped with piebald (``piebald check-cluster --example``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["EXAMPLE_CLUSTER", "example_path"]

EXAMPLE_CLUSTER = "lab-mix"


def example_path(name: str = EXAMPLE_CLUSTER) -> Path:
    """Path of a shipped example cluster file."""
    return Path(str(resources.files("piebald.examples").joinpath(f"{name}.yaml")))
