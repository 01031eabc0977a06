"""Property: every file a user hands piebald, however mangled, is exit 0, 2 or 3 -- never a
traceback, never a hang, never a memory blow-up.

Valid files are made first: a cluster YAML (lab-mix's fields, one GPU per node so a plan is
quick), model config.json files (``tests/data/hf``), a plan JSON made with ``--profiles``
(so it records measured numbers) and a profile DB measured by ``profile compute``. Then
hypothesis mutates one file at a time -- a key deleted, a value of another type, a huge,
negative or NaN number, the file cut short, a key given twice, a value buried under deep
nesting, random bytes, odd unicode -- and every command that reads that kind of file runs on
it in-process. Each run must exit 0, 2 or 3 with no exception escaping the CLI (``Traceback``
never printed), finish within ``CASE_LIMIT_S`` (an interval timer stops a hang) and keep the
process's peak memory within ``MAX_GROWTH_BYTES`` of where the test started.

``train --plan`` runs outside torchrun (it reads and checks the plan, then asks for
torchrun). Not run: ``train --emulate`` (it spawns a process per GPU: seconds per case;
the plan reading it shares with ``train --plan`` is fuzzed here) and ``profile
compute/network`` (they measure; their inputs are a model name and flags, not files).
"""

from __future__ import annotations

import json
import math
import resource
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from piebald.cli import app
from piebald.profiler.db import profile_file_name
from piebald.profiler.records import compute_from_dict, network_from_dict, profile_type
from piebald.specs.fields import Fields

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LAB_MIX = ROOT / "src" / "piebald" / "examples" / "lab-mix.yaml"
HF_CONFIGS = sorted((ROOT / "tests" / "data" / "hf").glob("*/config.json"))
CASE_LIMIT_S = 30.0  # a loaded 2-core CI box plans a 2-GPU cluster in about a second
MAX_GROWTH_BYTES = 1536 * 2**20
EXAMPLES_PER_MUTATION = 2
PLACEHOLDER = "@@piebald-fuzz@@"

CPU_CLUSTER = """\
name: cpu-lab
gpu_types:
  - {name: fuzz-cpu, memory: 8GiB, fp32_tflops: 0.05, memory_bandwidth: 5GB/s}
nodes:
  - {name: box, gpu: fuzz-cpu, gpus_per_node: 2, intra_link: 2GB/s}
"""


class CaseTimeout(BaseException):
    """Raised by the interval timer; a BaseException so the CLI's handlers cannot eat it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    args: tuple[str, ...]
    exit_code: int
    output: str
    exception: BaseException | None
    seconds: float


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _on_alarm(signum: int, frame: object) -> None:
    raise CaseTimeout


def run_bounded(*args: str) -> Outcome:
    """``piebald ARGS`` in-process, stopped after ``CASE_LIMIT_S``."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_LIMIT_S)
    started = time.perf_counter()
    try:
        result = CliRunner().invoke(app, list(args))
        exception = result.exception
        if isinstance(exception, SystemExit):  # typer.Exit / exit codes: not an error
            exception = None
        return Outcome(
            args=args,
            exit_code=result.exit_code,
            output=result.output,
            exception=exception,
            seconds=time.perf_counter() - started,
        )
    except CaseTimeout:
        return Outcome(
            args=args, exit_code=-1, output="", exception=CaseTimeout(), seconds=CASE_LIMIT_S
        )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- mutations ----------------------------------------------------------------------------

Path_ = tuple[str | int, ...]


def _paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every place in a parsed document: dict keys and list items, depth first."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*prefix, index)
            yield from _paths(item, (*prefix, index))


def _get(document: Any, path: Path_) -> Any:
    for part in path:
        document = document[part]
    return document


def _set(document: Any, path: Path_, value: Any) -> None:
    _get(document, path[:-1])[path[-1]] = value


ODD_VALUES: list[Any] = [None, True, "x", "", 1, -1, 0.5, [], {}, [1, 2], {"a": 1}, "1e-30"]
ODD_NUMBERS: list[Any] = [
    10**30, -(10**30), -1, 0, 2**63, 2**64 + 1, -(2**63) - 1, 1e308, -1e308, 1e-320,
    math.nan, math.inf, -math.inf, 0.5, 2**31, 2**40,
]  # fmt: skip
ODD_TEXT = [
    "\u202eevil", "\x00", "caf\u00e9", "\U0001f680", "\ud800", "a" * 100_000, "\n\r\t",
    "\u540d\u524d", "../../etc/passwd", "-" * 3, "[red]markup[/red]", "%s%n{0}",
]  # fmt: skip


def _dump(document: Any, fmt: str) -> str:
    if fmt == "yaml":
        return yaml.safe_dump(document, allow_unicode=False, sort_keys=False)
    return json.dumps(document, indent=1)


def _dump_with_raw(document: Any, path: Path_, raw: str) -> str:
    """JSON text (YAML reads JSON) of ``document`` with the node at ``path`` replaced by
    the raw text ``raw`` (a duplicate key or deep nesting no serialiser writes)."""
    _set(document, path, PLACEHOLDER)
    return json.dumps(document, indent=1).replace(json.dumps(PLACEHOLDER), raw, 1)


def mutate(text: str, fmt: str, kind: str, draw: st.DataObject) -> bytes:
    """``text`` (a valid file in ``fmt``, json or yaml) mutated once in the way ``kind`` says."""
    if kind == "truncate":
        raw = text.encode("utf-8")
        return raw[: draw.draw(st.integers(0, max(0, len(raw) - 1)), label="cut")]
    if kind == "bytes":
        raw = text.encode("utf-8")
        at = draw.draw(st.integers(0, len(raw)), label="at")
        junk = draw.draw(st.binary(min_size=1, max_size=64), label="junk")
        return raw[:at] + junk + raw[at:]
    document = yaml.safe_load(text) if fmt == "yaml" else json.loads(text)
    paths = list(_paths(document))
    path = draw.draw(st.sampled_from(paths), label="path")
    if kind == "delete":
        parent = _get(document, path[:-1])
        del parent[path[-1]]
        return _dump(document, fmt).encode("utf-8")
    if kind == "retype":
        _set(document, path, draw.draw(st.sampled_from(ODD_VALUES), label="value"))
        return _dump(document, fmt).encode("utf-8")
    if kind == "number":
        numeric = [p for p in paths if type(_get(document, p)) in (int, float)] or paths
        path = draw.draw(st.sampled_from(numeric), label="numeric path")
        _set(document, path, draw.draw(st.sampled_from(ODD_NUMBERS), label="number"))
        # JSON: NaN and Infinity as Python writes them; YAML: .nan and .inf.
        return _dump(document, fmt).encode("utf-8")
    if kind == "unicode":
        strings = [p for p in paths if isinstance(_get(document, p), str)] or paths
        path = draw.draw(st.sampled_from(strings), label="string path")
        _set(document, path, draw.draw(st.sampled_from(ODD_TEXT) | st.text(), label="text"))
        return json.dumps(document, indent=1).encode("utf-8")  # \ud800 as an escape
    if kind == "duplicate":
        objects = [p for p in paths if isinstance(_get(document, p), dict) and _get(document, p)]
        target: Path_ = draw.draw(st.sampled_from(objects), label="object") if objects else ()
        obj = _get(document, target)
        if not isinstance(obj, dict) or not obj:
            return json.dumps(document).encode("utf-8")
        key = draw.draw(st.sampled_from(list(obj)), label="key")
        other = draw.draw(st.sampled_from(ODD_VALUES), label="value")
        pairs = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items()]
        pairs.append(f"{json.dumps(key)}: {json.dumps(other)}")  # the key again, last wins
        raw = "{" + ", ".join(pairs) + "}"
        if not target:
            return raw.encode("utf-8")
        return _dump_with_raw(document, target, raw).encode("utf-8")
    if kind == "nesting":
        depth = 2_000  # past Python's recursion limit (1,000): a loader must not recurse per level
        value = json.dumps(_get(document, path))
        return _dump_with_raw(document, path, "[" * depth + value + "]" * depth).encode("utf-8")
    raise AssertionError(kind)


MUTATIONS = ["delete", "retype", "number", "truncate", "duplicate", "nesting", "bytes", "unicode"]


# --- the valid inputs ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Corpus:
    root: Path
    cluster_text: str  # lab-mix's fields, one GPU per node
    model_texts: tuple[str, ...]
    one_gpu: Path  # a cluster to plan mutated models on
    cpu_cluster: Path  # the cluster the profile DB's device type belongs to
    plan_text: str  # made with --profiles: it records measured numbers
    plan: Path
    profiles: Path
    profile_names: tuple[str, ...]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("fuzz")
    lab = yaml.safe_load(LAB_MIX.read_text())
    lab["nodes"] = [dict(group, gpus_per_node=1, count=1) for group in lab["nodes"][::2]]
    cluster_text = yaml.safe_dump(lab, sort_keys=False)
    one_gpu = root / "one.yaml"
    one_gpu.write_text("name: one\nnodes:\n  - {name: a, gpu: A100-80GB, gpus_per_node: 1}\n")
    cpu_cluster = root / "cpu.yaml"
    cpu_cluster.write_text(CPU_CLUSTER)
    profiles = root / "db"
    outcome = run_bounded(
        "profile", "compute", "--model", "tiny", "--seq-len", "16", "--micro-batch-sizes", "1,2",
        "--device", "cpu", "--device-name", "fuzz-cpu", "--warmup", "0", "--repeats", "1",
        "--threads", "1", "--out", str(profiles),
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.output
    plan = root / "plan.json"
    outcome = run_bounded(
        "plan", "--cluster", str(cpu_cluster), "--model", "tiny", "--global-batch", "2",
        "--seq-len", "16", "--profiles", str(profiles), "--out", str(plan),
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.output
    for path in (root / "c.yaml",):
        path.write_text(cluster_text)
    # The unmutated inputs pass every command: what the mutations break is theirs.
    for args in _cluster_commands(root / "c.yaml") + _plan_commands(plan, profiles):
        outcome = run_bounded(*args)
        if args[0] == "train":  # the plan was read and checked; only torchrun is missing
            assert outcome.exit_code == 2 and "a run under torchrun" in outcome.output, args
            continue
        assert outcome.exit_code == 0 and outcome.exception is None, (args, outcome.output)
    return Corpus(
        root=root,
        cluster_text=cluster_text,
        model_texts=tuple(path.read_text() for path in HF_CONFIGS),
        one_gpu=one_gpu,
        cpu_cluster=cpu_cluster,
        plan_text=plan.read_text(),
        plan=plan,
        profiles=profiles,
        profile_names=tuple(sorted(path.name for path in profiles.glob("*.json"))),
    )


def _job(*extra: str) -> list[str]:
    return ["--global-batch", "2", "--seq-len", "16", *extra]


def _cluster_commands(cluster: Path) -> list[list[str]]:
    return [
        ["check-cluster", str(cluster)],
        ["plan", "--cluster", str(cluster), "--model", "tiny", *_job()],
        ["compare", "--cluster", str(cluster), "--model", "tiny", *_job()],
    ]


def _plan_commands(plan: Path, profiles: Path) -> list[list[str]]:
    return [
        ["explain", str(plan)],
        ["simulate", "--plan", str(plan)],
        ["simulate", "--plan", str(plan), "--profiles", str(profiles)],
        ["launch", "--plan", str(plan)],
        ["launch", "--plan", str(plan), "--slurm"],
        # Outside torchrun and without --emulate, train reads and checks the plan as every
        # rank would, then says it needs torchrun: the plan reading without the processes.
        ["train", "--plan", str(plan)],
    ]


def _profile_name(data: bytes, fallback: str) -> str:
    """The name the DB would give this content (so a still-valid profile is loaded, not
    refused for its name); the original name where the content is no profile."""
    try:
        document = json.loads(data)
        fields = Fields(document, source="fuzz")
        kind = profile_type(fields.data)
        profile = compute_from_dict(fields) if kind == "compute" else network_from_dict(fields)
        return profile_file_name(profile)
    except Exception:
        return fallback


# --- the property -------------------------------------------------------------------------


def _check(outcomes: list[Outcome], baseline_bytes: int, what: str) -> None:
    for outcome in outcomes:
        where = f"{what}: piebald {' '.join(outcome.args)[:300]}"
        assert not isinstance(outcome.exception, CaseTimeout), f"over {CASE_LIMIT_S} s: {where}"
        assert outcome.exception is None, (
            f"{type(outcome.exception).__name__}: {outcome.exception!r:.300} in {where}"
        )
        assert outcome.exit_code in (0, 2, 3), (
            f"exit {outcome.exit_code}: {where}\n{outcome.output[-2000:]}"
        )
        assert "Traceback" not in outcome.output, f"traceback: {where}\n{outcome.output[-2000:]}"
        if outcome.exit_code == 2:
            errors = [line for line in outcome.output.splitlines() if line.startswith("error:")]
            assert len(errors) <= 1, f"several error lines: {where}\n{outcome.output[-2000:]}"
    growth = _peak_rss_bytes() - baseline_bytes
    assert growth < MAX_GROWTH_BYTES, f"peak memory grew {growth / 2**20:.0f} MiB: {what}"


Mutated = Callable[[Corpus, str, st.DataObject], list[Outcome]]


def _fuzz_cluster(corpus: Corpus, kind: str, draw: st.DataObject) -> list[Outcome]:
    path = corpus.root / "mutated.yaml"
    path.write_bytes(mutate(corpus.cluster_text, "yaml", kind, draw))
    return [run_bounded(*args) for args in _cluster_commands(path)]


def _fuzz_model(corpus: Corpus, kind: str, draw: st.DataObject) -> list[Outcome]:
    text = draw.draw(st.sampled_from(corpus.model_texts), label="config")
    path = corpus.root / "model" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(mutate(text, "json", kind, draw))
    return [
        run_bounded(command, "--cluster", str(corpus.one_gpu), "--model", str(path), *_job())
        for command in ("plan", "compare")
    ]


def _fuzz_plan(corpus: Corpus, kind: str, draw: st.DataObject) -> list[Outcome]:
    path = corpus.root / "mutated-plan.json"
    path.write_bytes(mutate(corpus.plan_text, "json", kind, draw))
    return [run_bounded(*args) for args in _plan_commands(path, corpus.profiles)]


def _fuzz_profile(corpus: Corpus, kind: str, draw: st.DataObject) -> list[Outcome]:
    name = draw.draw(st.sampled_from(corpus.profile_names), label="profile")
    db = corpus.root / "mutated-db"
    shutil.rmtree(db, ignore_errors=True)
    shutil.copytree(corpus.profiles, db)
    (db / name).unlink()
    data = mutate((corpus.profiles / name).read_text(), "json", kind, draw)
    (db / _profile_name(data, name)).write_bytes(data)
    merged = corpus.root / "merged-db"
    shutil.rmtree(merged, ignore_errors=True)
    cluster = ["--cluster", str(corpus.cpu_cluster), "--model", "tiny", *_job()]
    return [
        run_bounded("plan", *cluster, "--profiles", str(db)),
        run_bounded("compare", *cluster, "--profiles", str(db)),
        run_bounded("simulate", "--plan", str(corpus.plan), "--profiles", str(db)),
        run_bounded(
            "profile", "calibrate", "--profiles", str(db), "--cluster", str(corpus.cpu_cluster)
        ),
        run_bounded("profile", "merge", str(db), "--into", str(merged)),
    ]


FUZZERS: dict[str, Mutated] = {
    "cluster": _fuzz_cluster,
    "model": _fuzz_model,
    "plan": _fuzz_plan,
    "profile": _fuzz_profile,
}


def _cases() -> list[Any]:
    return [
        pytest.param(file_kind, mutation, id=f"{file_kind}-{mutation}")
        for file_kind in FUZZERS
        for mutation in MUTATIONS
    ]


@pytest.mark.parametrize(("file_kind", "mutation"), _cases())
def test_mutated_inputs_exit_0_2_or_3_without_traceback_hang_or_blowup(
    corpus: Corpus, file_kind: str, mutation: str
) -> None:
    baseline = _peak_rss_bytes()

    @settings(
        max_examples=EXAMPLES_PER_MUTATION,
        deadline=None,
        derandomize=True,  # the same cases on every run: a failure is reproducible
        database=None,
        phases=[Phase.explicit, Phase.generate],  # report the first failure; shrinking reruns
        # whole CLI commands for minutes
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(draw=st.data())
    def property_holds(draw: st.DataObject) -> None:
        outcomes = FUZZERS[file_kind](corpus, mutation, draw)
        _check(outcomes, baseline, f"{file_kind} file, {mutation}")

    property_holds()
