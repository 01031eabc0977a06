"""Every command that writes goes through ``piebald.outputs``: an existing path is refused
without --force (its content unchanged), --force replaces only a regular file, and an output
that cannot be written is one line and exit 2 *before* any work (findings 1, 4, 5, 8, 21,
26, 35). "Before any work" is shown by naming inputs that do not exist (the refusal names
the output flag, not the missing input) or by replacing the expensive step with one that
fails the test if it is reached."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_runner import run_cli
from piebald.examples import example_path
from piebald.specs.plan_io import load_plan

JOB = ["--global-batch", "6", "--seq-len", "32"]
TINY = ["--cluster", str(example_path()), "--model", "tiny", *JOB]


class ReachedWorkError(Exception):
    """Raised by a stand-in for an expensive step: the command got past its checks."""


def _forbid(*_: object, **__: object) -> None:
    raise AssertionError("the expensive step ran before the outputs were checked")


def _reach(*_: object, **__: object) -> None:
    raise ReachedWorkError


def _one_line_error(code: int, output: str, *needles: str) -> None:
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "Traceback" not in output and "Errno" not in output, output
    for needle in needles:
        assert needle in output, (needle, output)


@pytest.fixture
def umask_027() -> Iterator[int]:
    previous = os.umask(0o027)
    try:
        yield 0o027
    finally:
        os.umask(previous)


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    code, output = run_cli("plan", *TINY, "--out", str(path))
    assert code == 0, output
    return path


@pytest.fixture
def things(tmp_path: Path) -> dict[str, Path]:
    """An existing file, a directory, a link to a file, a device node (or FIFO), and a
    path whose parent is a regular file."""
    (tmp_path / "file").write_text("precious\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "target").write_text("the link's target\n")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    try:
        os.mknod(tmp_path / "device", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except OSError:
        os.mkfifo(tmp_path / "device")
    return {
        "file": tmp_path / "file",
        "dir": tmp_path / "dir",
        "link": tmp_path / "link",
        "device": tmp_path / "device",
        "under a file": tmp_path / "file" / "out.json",
    }


def _unchanged(things: dict[str, Path]) -> None:
    assert things["file"].read_text() == "precious\n"
    assert things["dir"].is_dir() and not any(things["dir"].iterdir())
    assert things["link"].is_symlink()
    assert things["link"].resolve().read_text() == "the link's target\n"
    assert not things["device"].is_file() and not things["device"].is_symlink()


def _refusals(
    things: dict[str, Path], run: list[str], flag: str, *, suffix: str = ""
) -> list[tuple[list[str], str]]:
    """(arguments, expected words) of every refusal case for ``flag``."""
    cases = [
        ([flag, str(things["file"])], "already exists"),
        ([flag, str(things["dir"]), "--force"], "it is a directory"),
        ([flag, str(things["link"]), "--force"], "it is a symbolic link"),
        ([flag, str(things["device"]), "--force"], "--force replaces only regular files"),
        ([flag, str(things["under a file"])], f"{things['file']} is not a directory"),
        ([flag, f"/proc/piebald-test{suffix}"], "cannot create files in /proc"),
    ]
    return [([*run, *arguments], words) for arguments, words in cases]


def test_plan_out_is_checked_before_planning(tmp_path: Path, things: dict[str, Path]) -> None:
    """Findings 8 (--force on a device node), 21 (/proc), 26 (a parent that is a file)."""
    missing = str(tmp_path / "missing-cluster.yaml")  # read only after the checks
    run = ["plan", "--cluster", missing, "--model", "tiny", *JOB]
    for arguments, words in _refusals(things, run, "--out", suffix=".json"):
        _one_line_error(*run_cli(*arguments), "--out: got ", words)
    _unchanged(things)


@pytest.mark.slow
def test_plan_force_replaces_a_file_with_the_umask_mode(
    tmp_path: Path, things: dict[str, Path], umask_027: int
) -> None:
    """--force replaces a regular file; the plan gets what a plain open() gives (finding
    35: plans were 0600)."""
    plain = tmp_path / "plain"
    plain.open("w").close()
    code, output = run_cli("plan", *TINY, "--out", str(things["file"]), "--force")
    assert code == 0, output
    assert load_plan(things["file"]).model.name == "tiny"
    assert stat.S_IMODE(things["file"].stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    assert stat.S_IMODE(plain.stat().st_mode) == 0o666 & ~umask_027


def test_compare_plot_needs_force(
    tmp_path: Path, things: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 4: `compare --plot existing.png` overwrote it; there was no --force."""
    missing = str(tmp_path / "missing-cluster.yaml")
    run = ["compare", "--cluster", missing, "--model", "tiny", *JOB]
    for arguments, words in _refusals(things, run, "--plot", suffix=".png"):
        arguments = [a.replace("out.json", "out.png") for a in arguments]
        _one_line_error(*run_cli(*arguments), "--plot: got ", words)
    _one_line_error(*run_cli(*run, "--plot", str(tmp_path / "c.xyz")), "--plot", ".png")
    _unchanged(things)
    # With --force the checks pass and the comparison starts.
    monkeypatch.setattr("piebald.cli.commands.run_comparison", _reach)
    code, _ = run_cli("compare", *TINY, "--plot", str(things["file"]), "--force")
    assert code == 1  # ReachedWorkError: past the checks, into the comparison


def test_simulate_trace_and_gantt_are_checked_before_simulating(
    tmp_path: Path, things: dict[str, Path]
) -> None:
    """Finding 21: `simulate --trace /proc/...`, `--gantt /proc/g.png` or `g.xyz`."""
    run = ["simulate", "--plan", str(tmp_path / "missing-plan.json")]
    for flag, suffix in (("--trace", ".json"), ("--gantt", ".png")):
        for arguments, words in _refusals(things, run, flag, suffix=suffix):
            arguments = [a.replace("out.json", f"out{suffix}") for a in arguments]
            _one_line_error(*run_cli(*arguments), f"{flag}: got ", words)
    _one_line_error(*run_cli(*run, "--gantt", str(tmp_path / "g.xyz")), "--gantt", ".svg")
    _unchanged(things)


@pytest.mark.slow
def test_simulate_force_replaces_files(tmp_path: Path, plan_file: Path) -> None:
    trace, gantt = tmp_path / "t.json", tmp_path / "g.svg"
    trace.write_text("old")
    gantt.write_text("old")
    code, output = run_cli(
        "simulate", "--plan", str(plan_file), "--trace", str(trace), "--gantt", str(gantt)
    )
    _one_line_error(code, output, "--trace", "already exists")
    code, output = run_cli(
        "simulate",
        "--plan",
        str(plan_file),
        "--trace",
        str(trace),
        "--gantt",
        str(gantt),
        "--force",
    )
    assert code == 0, output
    assert trace.read_text().startswith('{"traceEvents"')
    assert gantt.read_text().lstrip().startswith("<?xml")  # the format the suffix names


def test_launch_out(
    tmp_path: Path, things: dict[str, Path], plan_file: Path, umask_027: int
) -> None:
    """Finding 21 (`launch --out /proc/...`); the script's mode follows the umask."""
    run = ["launch", "--plan", str(tmp_path / "missing-plan.json")]
    for arguments, words in _refusals(things, run, "--out", suffix=".sh"):
        _one_line_error(*run_cli(*arguments), "--out: got ", words)
    _unchanged(things)
    code, output = run_cli("launch", "--plan", str(plan_file), "--out", str(things["file"]))
    _one_line_error(code, output, "already exists")
    code, output = run_cli(
        "launch", "--plan", str(plan_file), "--out", str(things["file"]), "--force"
    )
    assert code == 0, output
    assert things["file"].read_text().startswith("#!")
    assert stat.S_IMODE(things["file"].stat().st_mode) == 0o777 & ~umask_027


def test_demo_refuses_a_users_files_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 1: `demo --out-dir d` replaced d/plan.json and the other artefacts."""
    monkeypatch.setattr("piebald.cli.demo.load_cluster", _forbid)  # the demo's first step
    out = tmp_path / "d"
    out.mkdir()
    for name in ("plan.json", "compare.png", "trace.json", "gantt.png", "metrics-piebald.jsonl"):
        (out / name).write_text("{}")
        code, output = run_cli("demo", "--out-dir", str(out), "--train-steps", "1")
        _one_line_error(code, output, "--out-dir: got ", name, "already exists")
        assert (out / name).read_text() == "{}"
        assert [p.name for p in out.iterdir()] == [name]
        (out / name).unlink()
    # Training's metrics are only written with --train-steps; their name is then refused.
    (out / "metrics-megatron.jsonl").write_text("{}")
    code, output = run_cli("demo", "--out-dir", str(out), "--train-steps", "1")
    _one_line_error(code, output, "metrics-megatron.jsonl")
    (out / "metrics-megatron.jsonl").unlink()
    # --force replaces regular files only; the directory must be a directory.
    (out / "gantt.png").mkdir()
    code, output = run_cli("demo", "--out-dir", str(out), "--force")
    _one_line_error(code, output, "gantt.png", "it is a directory")
    code, output = run_cli("demo", "--out-dir", str(tmp_path / "d" / "gantt.png" / "x"))
    assert code == 1  # a fresh directory: past the checks (to the forbidden step)
    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_line_error(*run_cli("demo", "--out-dir", str(afile)), "--out-dir", "a directory")
    (out / "gantt.png").rmdir()
    (out / "plan.json").write_text("{}")
    monkeypatch.setattr("piebald.cli.demo.load_cluster", _reach)
    code, _ = run_cli("demo", "--out-dir", str(out), "--force")
    assert code == 1  # with --force the regular files pass the checks


def test_profile_outputs_are_checked_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 26: `profile compute --out FILE` measured first, then threw the results
    away with `[Errno 17] File exists`; `profile merge --into FILE` and /proc (21)."""
    monkeypatch.setattr("piebald.profiler.measure_compute.profile_compute", _forbid)
    monkeypatch.setattr("piebald.profiler.measure_network.emulate_network", _forbid)
    afile = tmp_path / "afile"
    afile.write_text("x")
    compute = ["profile", "compute", "--model", "tiny", "--seq-len", "8", "--device", "cpu"]
    network = ["profile", "network", "--cluster", str(example_path()), "--emulate"]
    for run in (compute, network):
        _one_line_error(*run_cli(*run, "--out", str(afile)), "--out: got ", "a directory")
        _one_line_error(*run_cli(*run, "--out", str(afile / "db")), "is not a directory")
        _one_line_error(*run_cli(*run, "--out", "/proc/piebald-db"), "cannot create files")
    source = tmp_path / "source"
    source.mkdir()
    merge = ["profile", "merge", str(source), "--into"]
    _one_line_error(*run_cli(*merge, str(afile)), "--into: got ", "a directory")
    _one_line_error(*run_cli(*merge, "/proc/piebald-db"), "--into", "cannot create files")
    assert afile.read_text() == "x"


def test_train_outputs_are_checked_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 5: an unwritable --save-model, --metrics or --checkpoint-dir (or one that is
    a file) failed only after the whole run, with a traceback and the weights lost."""
    monkeypatch.setattr("piebald.runtime.training.reference.train_reference", _forbid)
    afile = tmp_path / "afile"
    afile.write_text("x")
    reference = ["train", "--model", "tiny", *JOB, "--steps", "1"]
    cases = [
        (["--save-model", "/proc/w.pt"], "--save-model: got '/proc/w.pt'"),
        (["--save-model", str(afile)], "already exists"),
        (["--save-model", str(afile / "model")], "is not a directory"),
        (["--metrics", str(afile / "m.jsonl")], "--metrics: got "),
        (["--metrics", str(afile)], "choose another --metrics file"),
        (["--metrics", "/proc/m.jsonl"], "cannot create files in /proc"),
        (["--tensorboard", str(afile)], "--tensorboard: got "),
    ]
    for arguments, words in cases:
        _one_line_error(*run_cli(*reference, *arguments), words)
    # Under a plan the checkpoint directory is checked before the plan is even read.
    planned = ["train", "--plan", str(tmp_path / "missing-plan.json"), "--emulate"]
    for directory, words in ((afile, "a directory (it is a file)"), (afile / "c", "not a dir")):
        code, output = run_cli(*planned, "--checkpoint-dir", str(directory))
        _one_line_error(code, output, "--checkpoint-dir: got ", words)
    assert afile.read_text() == "x"
