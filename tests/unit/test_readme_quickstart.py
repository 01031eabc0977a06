"""The README's quick start runs as written and prints what the README shows.

Every ``console`` block of the README's "Quick start" section is a sequence of ``$ piebald
...`` commands (a trailing backslash continues a command) each followed by its output. The
test runs the commands in order, in a directory laid out like a fresh clone (the shipped
example cluster at ``src/piebald/examples/``), and compares each output line by line with
the README's, after right-stripping (rich pads centred titles). A line ``...`` ends an
output the README shows only in part. Only numbers measured on the machine that runs the
command are masked (:data:`MEASURED`): the search's wall time, and the CPU's tokens/s
during training; every planned, predicted, simulated or trained number must match.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

#: (pattern, replacement) for numbers that depend on the speed of the machine running the
#: command, not on piebald's model of the cluster.
MEASURED: tuple[tuple[str, str], ...] = (
    (r"structures in [\d.]+ s", "structures in <wall> s"),
    (r"tokens/s +[\d,]+  MFU", "tokens/s <measured>  MFU"),
    (
        r"trained (\S+): [\d,]+ tokens/s \(median\), planner predicted ([\d,]+) \([\d.]+x\)",
        r"trained \1: <measured> tokens/s (median), planner predicted \2 (<ratio>x)",
    ),
    (r"emulation: \d+ of (\d+) operations \(\d+%\)", r"emulation: <n> of \1 operations (<n>%)"),
)


@dataclass(frozen=True)
class Shown:
    """One command of the README and the output it shows."""

    command: str
    output: tuple[str, ...]
    partial: bool


def quick_start_commands(readme: str) -> list[Shown]:
    """The ``$`` commands of the quick start's console blocks, in order, with their output."""
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    shown: list[Shown] = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.DOTALL):
        lines = block.rstrip("\n").split("\n")
        i = 0
        while i < len(lines):
            assert lines[i].startswith("$ "), f"README quick start: expected a command: {lines[i]}"
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + lines[i].strip()
            i += 1
            output: list[str] = []
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
            partial = bool(output) and output[-1] == "..."
            shown.append(Shown(command, tuple(output[:-1] if partial else output), partial))
    return shown


def normalised(lines: list[str] | tuple[str, ...]) -> list[str]:
    out = []
    for line in lines:
        line = line.rstrip()
        for pattern, replacement in MEASURED:
            line = re.sub(pattern, replacement, line)
        out.append(line)
    return out


def test_parser_reads_commands_and_partial_outputs() -> None:
    text = (
        "intro\n## Quick start\n```console\n$ piebald a \\\n    --b 1\nout 1\n$ piebald c\n"
        "first\n...\n```\n## Next\n```console\n$ piebald not-quick-start\n```\n"
    )
    assert quick_start_commands(text) == [
        Shown("piebald a --b 1", ("out 1",), False),
        Shown("piebald c", ("first",), True),
    ]


def test_masks_only_measured_numbers() -> None:
    line = "trained tiny: 2,849 tokens/s (median), planner predicted 348,386 (0.01x)"
    assert normalised([line]) == [
        "trained tiny: <measured> tokens/s (median), planner predicted 348,386 (<ratio>x)"
    ]
    assert normalised(["step 1.242 s, 52,765 tokens/s"]) == ["step 1.242 s, 52,765 tokens/s"]


def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    examples = tmp_path / "src" / "piebald" / "examples"
    examples.mkdir(parents=True)
    shutil.copy(ROOT / "src" / "piebald" / "examples" / "lab-mix.yaml", examples)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("COLUMNS", None)
    shown = quick_start_commands((ROOT / "README.md").read_text())
    assert len(shown) >= 5, "the quick start shows check-cluster, plan, explain, simulate, train"
    for step in shown:
        argv = shlex.split(step.command)
        assert argv[0] == "piebald", step.command
        run = subprocess.run(
            [sys.executable, "-m", "piebald", *argv[1:]],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=240,
            check=False,
        )
        assert run.returncode == 0, f"{step.command}: exit {run.returncode}\n{run.stdout}"
        got = normalised(run.stdout.rstrip("\n").split("\n")) if step.output else []
        want = normalised(step.output)
        if step.partial:
            got = got[: len(want)]
        assert got == want, f"README quick start: `{step.command}` printed otherwise"
