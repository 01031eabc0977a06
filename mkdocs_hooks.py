"""MkDocs hooks for piebald's documentation site (``mkdocs.yml`` names this file).

The command-line reference is generated from the typer application itself, with typer's
own Markdown generator (what ``typer piebald.cli.commands utils docs`` prints), so the page
cannot drift from ``piebald --help``.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.cli import get_docs_for_click

#: The line of ``docs/cli.md`` that the generated reference replaces.
CLI_MARKER = "<!-- generated: piebald command reference -->"


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
