"""Charts as output files: the format a path asks for, checked before any work, and the
figure written through ``piebald.outputs`` (atomic, never clobbering) instead of
matplotlib's ``savefig(path)``, which writes in place and overwrites whatever is there.

matplotlib is imported inside the functions: the planning commands stay fast without it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from piebald.outputs import OutputError, check_output_file, write_atomic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["check_figure_file", "figure_format", "save_figure"]

_DEFAULT_FORMAT = "png"  # matplotlib's own choice for a name without a suffix


def figure_format(path: str | Path, *, flag: str) -> str:
    """The image format ``path``'s suffix names (png when it has none); one matplotlib
    can write, or an :class:`OutputError` listing those it can."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lower().removeprefix(".")
    chosen = suffix or _DEFAULT_FORMAT
    supported = FigureCanvasBase.get_supported_filetypes()
    if chosen not in supported:
        names = ", ".join(f".{name}" for name in sorted(supported))
        raise OutputError(
            flag=flag, path=path, expected=f"an image file name ending in one of {names}"
        )
    return chosen


def check_figure_file(path: str | Path, *, flag: str, force: bool = False) -> None:
    """Before any work: a format matplotlib writes, at a path that may be written."""
    figure_format(path, flag=flag)
    check_output_file(path, flag=flag, force=force)


def save_figure(figure: Figure, path: str | Path, *, flag: str, force: bool = False) -> None:
    """Render ``figure`` in memory in ``path``'s format, then write it atomically."""
    chosen = figure_format(path, flag=flag)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=chosen)
    write_atomic(path, buffer.getvalue(), flag=flag, force=force)
