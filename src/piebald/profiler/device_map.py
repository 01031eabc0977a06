"""Which catalog GPU type a device is, from the name its driver reports and its memory.

``torch.cuda.get_device_name`` says "NVIDIA H100 80GB HBM3" or "Tesla V100-SXM2-32GB"; the
catalog says "H100-SXM" and "V100-32GB". The rules below match the chip by name and pick
the variant by what only the name or the memory tells apart (SXM or PCIe, 40 or 80 GB).
A device no rule matches keeps its reported name (see :func:`device_type_name`) and is
recorded with its measured memory; a cluster file can then declare it as a custom type.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from piebald.specs.devices import builtin_catalog

__all__ = ["catalog_name", "device_type_name"]

GIB = 2**30


def _by_memory(small: str, large: str, threshold_gib: float) -> Callable[[str, float], str]:
    return lambda _name, memory_bytes: large if memory_bytes > threshold_gib * GIB else small


# (pattern on the upper-cased reported name, catalog name or chooser); first match wins.
_RULES: list[tuple[str, str | Callable[[str, float], str]]] = [
    (r"H200", "H200"),
    (r"H100.*PCIE", "H100-PCIe"),
    (r"H100", "H100-SXM"),
    (r"A100", _by_memory("A100-40GB", "A100-80GB", 50)),
    (r"L40S", "L40S"),
    (r"A6000", "A6000"),
    (r"\bA10G?\b", "A10G"),
    (r"\bL4\b", "L4"),
    (r"\bT4\b", "T4"),
    (r"V100", _by_memory("V100-16GB", "V100-32GB", 20)),
    (r"P100", "P100"),
    (r"P40\b", "P40"),
    (r"4090", "RTX-4090"),
    (r"3090", "RTX-3090"),
    (r"MI250", "MI250X"),
    (r"MI300X", "MI300X"),
]


def catalog_name(reported_name: str, *, memory_bytes: float) -> str | None:
    """The catalog type of a device reported as ``reported_name``, or None if unknown."""
    upper = reported_name.upper()
    for pattern, target in _RULES:
        if re.search(pattern, upper):
            name = target if isinstance(target, str) else target(upper, memory_bytes)
            return name if name in builtin_catalog() else None
    return None


def device_type_name(reported_name: str, *, memory_bytes: float) -> tuple[str, bool]:
    """(the name profiles key the device by, whether it is a catalog type)."""
    known = catalog_name(reported_name, memory_bytes=memory_bytes)
    return (known, True) if known is not None else (reported_name, False)
