"""The quick starts of the README and of the docs run as written and print what they show.

Every ``console`` block of a "Quick start" section is a sequence of ``$ piebald ...``
commands (a trailing backslash continues a command) each followed by its output. The test
runs the commands in order, in a directory laid out like a fresh clone (the shipped example
cluster at ``src/piebald/examples/``), and compares each output line by line with the
page's, after right-stripping (rich pads centred titles). A line ``...`` ends an output
shown only in part; ``...`` inside a line stands for what the page leaves out there. Only
numbers measured on the machine that runs the command are masked (:data:`MEASURED`): the
search's wall time, and the CPU's tokens/s during training; every planned, predicted,
simulated or trained number must match. A command exits 0, or 2 where the page shows an
``error:`` line, or 3 where it shows ``no feasible plan``.
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
    (r"(trained \S+:) [\d,]+ tokens/s", r"\1 <measured> tokens/s"),
    (r"planner predicted ([\d,]+) \([\d.]+x\)", r"planner predicted \1 (<ratio>x)"),
    (r"emulation: \d+ of (\d+) operations \(\d+%\)", r"emulation: <n> of \1 operations (<n>%)"),
)


@dataclass(frozen=True)
class Shown:
    """One command of the README and the output it shows."""

    command: str
    output: tuple[str, ...]
    partial: bool


#: The pages with a quick start, relative to the repository root.
PAGES = ("README.md", "docs/getting-started.md")


def quick_start_commands(page: str) -> list[Shown]:
    """The ``$`` commands of the quick start's console blocks, in order, with their output."""
    section = page.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
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


def matches(got: list[str], want: list[str]) -> bool:
    """Line by line equal, where ``...`` inside a wanted line matches anything."""
    if len(got) != len(want):
        return False
    for line, wanted in zip(got, want, strict=True):
        if "..." in wanted:
            pattern = ".*".join(re.escape(part) for part in wanted.split("..."))
            if not re.fullmatch(pattern, line):
                return False
        elif line != wanted:
            return False
    return True


def expected_exit(output: tuple[str, ...]) -> int:
    """The exit code the page implies: 2 for a shown error, 3 for no feasible plan, else 0."""
    first = output[0] if output else ""
    return 2 if first.startswith("error:") else 3 if first.startswith("no feasible plan") else 0


def test_inline_ellipsis_matches_what_the_page_leaves_out() -> None:
    assert matches(['{"a": 1, "b": 2, "c": 3}'], ['{"a": 1, ..., "c": 3}'])
    assert not matches(['{"a": 1, "b": 2, "c": 4}'], ['{"a": 1, ..., "c": 3}'])
    assert not matches(["x", "y"], ["x"])


def test_masks_only_measured_numbers() -> None:
    line = "trained tiny: 2,849 tokens/s (median), planner predicted 348,386 (0.01x)"
    assert normalised([line]) == [
        "trained tiny: <measured> tokens/s (median), planner predicted 348,386 (<ratio>x)"
    ]
    assert normalised(["step 1.242 s, 52,765 tokens/s"]) == ["step 1.242 s, 52,765 tokens/s"]


def test_quick_starts_run_as_written(tmp_path: Path) -> None:
    """Both pages in one directory, in order: a command the README already ran (the same
    words, so the same files it reads) is run once and its output checked against both."""
    examples = tmp_path / "src" / "piebald" / "examples"
    examples.mkdir(parents=True)
    shutil.copy(ROOT / "src" / "piebald" / "examples" / "lab-mix.yaml", examples)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("COLUMNS", None)
    ran: dict[str, subprocess.CompletedProcess[str]] = {}
    for page in PAGES:
        shown = quick_start_commands((ROOT / page).read_text())
        assert len(shown) >= 5, f"{page}: a quick start of check-cluster, plan, explain, ..."
        for step in shown:
            argv = shlex.split(step.command)
            assert argv[0] == "piebald", step.command
            if step.command not in ran:
                ran[step.command] = subprocess.run(
                    [sys.executable, "-m", "piebald", *argv[1:]],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=240,
                    check=False,
                )
            run = ran[step.command]
            code = expected_exit(step.output)
            assert run.returncode == code, (
                f"{page}: `{step.command}`: exit {run.returncode}\n{run.stdout}"
            )
            got = normalised(run.stdout.rstrip("\n").split("\n")) if step.output else []
            want = normalised(step.output)
            if step.partial:
                got = got[: len(want)]
            assert matches(got, want), f"{page}: `{step.command}` printed otherwise"
