"""The distributed tests' plan builder and toy model serve the single-process tests too."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[3] / "distributed"))
