"""Run the ``piebald`` command line in-process, as the CLI tests do."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from piebald.cli import app


def run_cli(*args: str) -> tuple[int, str]:
    """(exit code, stdout and stderr) of ``piebald ARGS...``."""
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def last_json(output: str) -> Any:
    """The JSON document on the output's last line (``--json`` summaries)."""
    return json.loads(output.strip().splitlines()[-1])
