"""The Python API (``piebald.api``, re-exported by ``piebald``): it plans without torch,
its prediction is the cost model's estimate and the simulator agrees with it, plans
round-trip through files, and it makes the plans the ``piebald`` CLI makes for the same
inputs (analytic, from a profile DB, verified by simulation)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import piebald
from cli_runner import last_json, run_cli
from piebald.cost.plan_estimate import estimate_plan
from piebald.errors import ArgumentError, SpecError
from piebald.examples import example_path
from piebald.profiler.db import write_profile
from piebald.specs.model import LayerKind
from piebald.specs.plan_io import plan_to_dict

from .profiler.conftest import make_profile

SMALL = ["--model", "tiny", "--global-batch", "8", "--seq-len", "64"]

CPU_CLUSTER = """\
name: cpu-lab
gpu_types:
  - {name: cpu-a, memory: 8GiB, fp32_tflops: 0.05, memory_bandwidth: 5GB/s}
nodes:
  - {name: box, gpu: cpu-a, gpus_per_node: 2, intra_link: 2GB/s}
"""


def _cli_plan(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "cli-plan.json"
    code, output = run_cli("plan", *args, "--out", str(out))
    assert code == 0, output
    data: dict[str, object] = json.loads(out.read_text())
    return data


def _same_plan(api_plan: piebald.Plan, cli: dict[str, object]) -> None:
    """The plan files agree on everything but the notes' version line."""
    mine = plan_to_dict(api_plan)
    for key in ("stages", "routes", "predicted", "runners_up", "cost_inputs", "cluster"):
        assert mine.get(key) == cli.get(key), key


@pytest.mark.slow
def test_plan_simulate_and_round_trip_without_torch(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        import piebald
        from piebald.cost.plan_estimate import estimate_plan
        cluster = piebald.load_cluster({str(example_path())!r})
        model = piebald.load_model("gpt2")
        job = piebald.build_job(global_batch=16, seq_len=512)
        plan = piebald.plan(cluster, model, job)
        oracle = estimate_plan(plan)
        result = piebald.simulate(plan)
        path = {str(tmp_path / "plan.json")!r}
        piebald.save_plan(plan, path)
        print(repr((
            plan.predicted.step_time_s, oracle.step_time_s,
            piebald.estimate(plan).step_time_s, plan.predicted.tokens_per_s,
            oracle.tokens_per_s, result.step_time_s, result.deadlock is None,
            piebald.load_plan(path) == plan, "torch" in sys.modules and sys.modules["torch"],
        )))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (predicted, oracle, again, tokens, oracle_tokens, simulated, finished, same, torch) = eval(
        run.stdout
    )
    assert predicted == oracle == again and tokens == oracle_tokens
    assert finished and abs(simulated / predicted - 1) < 0.10  # the simulator's agreement
    assert same and torch is None


@pytest.mark.slow
def test_api_plan_is_the_cli_plan(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CPU_CLUSTER)
    cli = _cli_plan(tmp_path, "--cluster", str(cluster), *SMALL)
    job = piebald.build_job(global_batch=8, seq_len=64)
    plan = piebald.plan(str(cluster), "tiny", job)
    _same_plan(plan, cli)
    # Loaded objects instead of paths: the same plan.
    again = piebald.plan(piebald.load_cluster(cluster), piebald.load_model("tiny"), job)
    assert again.stages == plan.stages and again.predicted == plan.predicted


def test_api_zero_and_strategy_match_the_cli(tmp_path: Path) -> None:
    cli = _cli_plan(
        tmp_path, "--cluster", str(example_path()), *SMALL, "--strategy", "megatron",
        "--zero", "optimizer",
    )  # fmt: skip
    plan = piebald.plan(
        example_path(),
        "tiny",
        piebald.build_job(global_batch=8, seq_len=64),
        strategy="megatron",
        zero="optimizer",
    )
    _same_plan(plan, cli)
    assert {stage.zero for stage in plan.stages} == {piebald.ZeroMode.OPTIMIZER}


@pytest.mark.slow
def test_api_recompute_matches_the_cli(tmp_path: Path) -> None:
    cli = _cli_plan(
        tmp_path, "--cluster", str(example_path()), *SMALL, "--recompute", "selective,full"
    )
    plan = piebald.plan(
        example_path(),
        "tiny",
        piebald.build_job(global_batch=8, seq_len=64),
        recompute=["full", "selective"],
    )
    _same_plan(plan, cli)
    assert {stage.recompute.value for stage in plan.stages} <= {"selective", "full"}


@pytest.mark.slow
def test_verify_by_simulation_matches_plan_simulate(tmp_path: Path) -> None:
    cli = _cli_plan(tmp_path, "--cluster", str(example_path()), *SMALL, "--simulate")
    job = piebald.build_job(global_batch=8, seq_len=64)
    verified = piebald.plan(example_path(), "tiny", job, verify_by_simulation=True)
    _same_plan(verified, cli)
    assert verified.notes[0].split(" (piebald")[0] == str(cli["notes"][0]).split(" (piebald")[0]  # type: ignore[index]
    # The simulated step of the chosen plan is the shortest of the candidates, the search's
    # first choice among them.
    first = piebald.plan(example_path(), "tiny", job)
    assert piebald.simulate(verified).step_time_s <= piebald.simulate(first).step_time_s


@pytest.fixture
def profiled(tmp_path: Path) -> tuple[Path, Path]:
    """(cluster file, profile DB): tiny's layers on cpu-a, measured in fp32 at seq 32."""
    db = tmp_path / "db"
    for kind, base_s in (
        (LayerKind.EMBEDDING, 5e-3),
        (LayerKind.BLOCK, 20e-3),
        (LayerKind.HEAD, 10e-3),
    ):
        profile = make_profile(kind=kind, seq_len=32, forward_s=(base_s, 1.6 * base_s))
        write_profile(profile, db)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CPU_CLUSTER)
    return cluster, db


def test_profiles_price_the_plan_as_the_cli_does(
    tmp_path: Path, profiled: tuple[Path, Path]
) -> None:
    cluster, db = profiled
    args = ["--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--precision", "fp32"]
    cli = _cli_plan(tmp_path, "--cluster", str(cluster), *args, "--profiles", str(db))
    job = piebald.build_job(global_batch=8, seq_len=32, precision="fp32")
    plan = piebald.plan(cluster, "tiny", job, profiles=db)
    _same_plan(plan, cli)
    assert plan.cost_inputs is not None and plan.cost_inputs.layer_times
    # Re-priced from the numbers the plan records, and from the DB itself: the prediction.
    assert plan.predicted is not None
    assert piebald.estimate(plan).step_time_s == plan.predicted.step_time_s
    assert piebald.estimate(plan, profiles=db).step_time_s == plan.predicted.step_time_s
    # Analytic pricing differs (the profiles are far slower than the formulas say).
    assert estimate_plan(plan).step_time_s < 0.5 * plan.predicted.step_time_s
    # simulate prices as estimate does: the CLI's simulate --json says the same.
    code, output = run_cli("simulate", "--plan", str(tmp_path / "cli-plan.json"), "--json")
    assert code == 0, output
    assert piebald.simulate(plan).step_time_s == last_json(output.replace("\n", ""))["step_time_s"]


def test_profiles_of_another_device_are_a_warning(profiled: tuple[Path, Path]) -> None:
    cluster, db = profiled
    other = cluster.with_name("other.yaml")
    other.write_text(CPU_CLUSTER.replace("cpu-a", "cpu-b"))
    job = piebald.build_job(global_batch=8, seq_len=32, precision="fp32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = piebald.plan(other, "tiny", job, profiles=db)
    (warning,) = [w for w in caught if issubclass(w.category, piebald.ProfileWarning)]
    assert str(db) in str(warning.message) and "cpu-b in fp32" in str(warning.message)
    assert "--profiles" not in str(warning.message)
    assert plan.stages == piebald.plan(other, "tiny", job).stages  # priced analytically


def test_bad_arguments_name_the_argument_not_a_flag(tmp_path: Path) -> None:
    job = piebald.build_job(global_batch=8, seq_len=64)
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (lambda: piebald.plan(example_path(), "tiny", job, strategy="megatrn"), "strategy"),
        (lambda: piebald.plan(example_path(), "tiny", job, zero="fully"), "zero"),
        (lambda: piebald.plan(example_path(), "tiny", job, strategy="metis", zero="full"), "zero"),
        (lambda: piebald.plan(example_path(), "tiny", job, profiles=empty), "profiles"),
        (lambda: piebald.plan(example_path(), "tiny", job, recompute="some"), "recompute"),
        (
            lambda: piebald.plan(
                example_path(), "tiny", job, strategy="metis", recompute="selective"
            ),
            "recompute",
        ),
        (lambda: piebald.load_model("no-such-model"), "model"),
        (lambda: piebald.build_job(global_batch=0, seq_len=64), "global_batch"),
        (lambda: piebald.plan(example_path(), "tiny", {"global_batch": 8}), "job"),  # type: ignore[arg-type]
        (lambda: piebald.compare(example_path(), "tiny", None), "job"),  # type: ignore[arg-type]
        (lambda: piebald.build_job(global_batch=8, seq_len=64, precision="fp8"), "precision"),
        (
            lambda: piebald.plan(
                example_path(), "gpt2", piebald.build_job(global_batch=8, seq_len=2048)
            ),
            "seq_len",
        ),
    ]
    for call, argument in cases:
        with pytest.raises(ArgumentError) as error:
            call()
        assert error.value.argument == argument
        assert str(error.value).startswith(f"{argument}: ") and "--" not in str(error.value)


def test_save_plan_keeps_an_existing_file(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CPU_CLUSTER)
    plan = piebald.plan(cluster, "tiny", piebald.build_job(global_batch=8, seq_len=64))
    path = tmp_path / "plan.json"
    path.write_text("mine\n")
    with pytest.raises(SpecError, match="overwrite=True") as error:
        piebald.save_plan(plan, path)
    assert "--force" not in str(error.value)
    assert path.read_text() == "mine\n"
    piebald.save_plan(plan, path, overwrite=True)
    assert piebald.load_plan(path) == plan


def test_a_plan_file_path_is_taken_where_a_plan_is(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CPU_CLUSTER)
    plan = piebald.plan(cluster, "tiny", piebald.build_job(global_batch=8, seq_len=64))
    path = tmp_path / "plan.json"
    piebald.save_plan(plan, path)
    for given in (path, str(path)):
        assert piebald.estimate(given) == piebald.estimate(plan)
        assert piebald.simulate(given).step_time_s == piebald.simulate(plan).step_time_s
    with pytest.raises(ArgumentError) as error:
        piebald.simulate(plan_to_dict(plan))  # type: ignore[arg-type]
    assert error.value.argument == "plan" and "path of a plan JSON file" in str(error.value)


def test_train_outside_torchrun_says_what_to_do(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CPU_CLUSTER)
    plan = piebald.plan(cluster, "tiny", piebald.build_job(global_batch=8, seq_len=64))
    with pytest.raises(RuntimeError, match="torchrun"):
        piebald.train(plan, steps=1)


@pytest.mark.distributed
def test_emulate_trains_like_the_reference(tmp_path: Path) -> None:
    """Two steps of tiny on a two-'GPU' CPU cluster, emulated (one process per GPU), take
    the single-process reference's losses (fp32 both: the same computation)."""
    from piebald.runtime.training.config import TrainConfig
    from piebald.runtime.training.reference import train_reference

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CPU_CLUSTER)
    job = piebald.build_job(global_batch=4, seq_len=32, precision="fp32")
    plan = piebald.plan(cluster, "tiny", job)
    summary = piebald.emulate(plan, steps=2, seed=3)
    reference = train_reference(
        plan.model, job, TrainConfig(steps=2, seed=3), micro_batch_size=None, print_line=print
    )
    assert summary.steps == 2
    assert summary.losses == pytest.approx(reference.losses, rel=1e-5)
