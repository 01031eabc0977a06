"""``--help`` shows what the exit status means and an example that runs as written."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from cli_runner import run_cli
from piebald.cli.common import EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_RUN_FAILED

ROOT = Path(__file__).resolve().parents[3]


def _help(*command: str) -> str:
    code, output = run_cli(*command, "--help")
    assert code == 0, output
    return " ".join(output.replace("│", " ").split())  # rich wraps and boxes lines


@pytest.mark.parametrize("command", [(), ("plan",), ("train",)], ids=["piebald", "plan", "train"])
def test_help_names_every_exit_status(command: tuple[str, ...]) -> None:
    text = _help(*command)
    assert f"{EXIT_RUN_FAILED} a run failed" in text
    assert f"{EXIT_BAD_INPUT} bad input" in text
    assert f"{EXIT_INFEASIBLE} no plan fits memory" in text


@pytest.mark.slow  # plans the quick start: seconds
def test_the_plan_example_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In a directory laid out like a fresh clone, the example exits 0 and writes its plan.
    example = re.search(r"Example: piebald (plan .*?--out \S+)", _help("plan"))
    assert example is not None
    examples = tmp_path / "src" / "piebald" / "examples"
    examples.mkdir(parents=True)
    shutil.copy(ROOT / "src" / "piebald" / "examples" / "lab-mix.yaml", examples)
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(example.group(1))
    code, output = run_cli(*argv)
    assert code == 0, output
    assert (tmp_path / argv[argv.index("--out") + 1]).is_file()
