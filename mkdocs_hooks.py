"""MkDocs hooks for piebald's documentation site (``mkdocs.yml`` names this file).

- The command-line reference is generated from the typer application itself, with typer's
  own Markdown generator (what ``typer piebald.cli.commands utils docs`` prints), so the
  page cannot drift from ``piebald --help``.
- :class:`ReSTDocstrings` lets mkdocstrings render piebald's docstrings, which are written
  for Python's ``help()`` and doctest: reST roles (``:class:`X```) become plain code, and
  doctest examples (``>>>`` lines and their output) become Python console blocks.
"""

from __future__ import annotations

import re
from typing import Any

import griffe
import typer
from typer.cli import get_docs_for_click

#: The line of ``docs/cli.md`` that the generated reference replaces.
CLI_MARKER = "<!-- generated: piebald command reference -->"

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):(`[^`]+`)")


def cli_reference() -> str:
    """Every command, argument and option of ``piebald`` as Markdown, one heading each."""
    from piebald.cli.commands import app

    command = typer.main.get_command(app)
    with typer.Context(command, info_name="piebald") as ctx:
        return get_docs_for_click(obj=command, ctx=ctx, name="piebald", indent=1)


def on_page_markdown(markdown: str, *, page: Any, **_: Any) -> str:
    """Put the generated reference where ``docs/cli.md`` has :data:`CLI_MARKER`."""
    if page.file.src_uri != "cli.md":
        return markdown
    if CLI_MARKER not in markdown:
        raise ValueError(f"docs/cli.md: expected the line {CLI_MARKER!r}")
    return markdown.replace(CLI_MARKER, cli_reference())


def markdown_docstring(text: str) -> str:
    """``text`` with reST roles as code spans and each doctest example as a ``pycon`` block.

    An example is a run of lines whose first starts with ``>>>`` and which ends at a blank
    line, as doctest reads it.
    """
    text = _ROLE.sub(lambda m: m.group(1).replace("~", ""), text)
    out: list[str] = []
    example = False
    for line in text.split("\n"):
        if not example and line.lstrip().startswith(">>>"):
            out += ["", "```pycon"]
            example = True
        elif example and not line.strip():
            out.append("```")
            example = False
        out.append(line)
    if example:
        out.append("```")
    return "\n".join(out)


class ReSTDocstrings(griffe.Extension):
    """A griffe extension (``mkdocs.yml``: ``mkdocs_hooks.py:ReSTDocstrings``)."""

    def on_object(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
