"""The two front doors refuse the same things: each bad input of the table goes through the
``piebald`` command line (exit 2, one line naming the flag) and through the Python API call
the command makes (an ArgumentError or SpecError, both ValueErrors, naming the argument,
the config field or the file), before any work. Plus: no float of a TrainConfig takes inf
or nan, and a plan whose embedded cluster lost the memory its ranks need is refused by
every API function that takes a plan."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import piebald
from cli_runner import run_cli
from cluster_builders import CPU_LAB_YAML
from piebald.errors import ArgumentError, SpecError
from piebald.specs.plan_io import plan_to_dict

SMALL = ["--model", "tiny", "--global-batch", "8", "--seq-len", "64"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A cluster, a plan made on it, the same plan with its GPU's memory cut to 1 MiB, an
    existing file and a file where a directory is expected."""
    root = tmp_path_factory.mktemp("parity")
    cluster = root / "cluster.yaml"
    cluster.write_text(CPU_LAB_YAML)
    plan = piebald.plan(cluster, "tiny", piebald.build_job(global_batch=8, seq_len=64))
    good = root / "plan.json"
    piebald.save_plan(plan, good)
    data = plan_to_dict(plan)
    data["cluster"]["gpu_types"][0]["memory"] = "1MiB"
    tiny_mem = root / "tiny_mem.json"
    tiny_mem.write_text(json.dumps(data))
    existing = root / "existing.jsonl"
    existing.write_text('{"step": 1}\n')
    return {"cluster": cluster, "plan": good, "tiny_mem": tiny_mem, "existing": existing}


def _cli_refuses(args: list[str], flag: str) -> None:
    """Exit 2 and one line naming ``flag``; or click's usage error, where the flag's own
    type or range refuses the value before the command runs (then its box names it)."""
    code, output = run_cli(*args)
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert code == 2, output
    if lines and lines[0].startswith("Usage:"):
        assert f"'{flag}'" in output, output
        return
    assert len(lines) == 1 and flag in lines[0], output


def _api_refuses(call: Callable[[], object], name: str) -> None:
    with pytest.raises((ArgumentError, SpecError)) as raised:
        call()
    assert isinstance(raised.value, ValueError)
    message = str(raised.value)
    assert "\n" not in message and name in message, message


# (id, CLI arguments, what the CLI line names, the API call, what the API error names)
Case = tuple[str, list[str], str, Callable[[dict[str, Path]], object], str]


def _train_config(**fields: Any) -> Any:
    from piebald.api import TrainConfig

    return TrainConfig(steps=1, **fields)


CASES: list[Case] = [
    # plan / compare
    (
        "plan-strategy",
        ["plan", "--cluster", "{cluster}", *SMALL, "--strategy", "nope"],
        "--strategy",
        lambda f: piebald.plan(
            f["cluster"], "tiny", piebald.build_job(global_batch=8, seq_len=64), strategy="nope"
        ),
        "strategy",
    ),
    (
        "plan-batch",
        [
            "plan",
            "--cluster",
            "{cluster}",
            "--model",
            "tiny",
            "--global-batch",
            "0",
            "--seq-len",
            "64",
        ],
        "--global-batch",
        lambda f: piebald.build_job(global_batch=0, seq_len=64),
        "global_batch",
    ),
    (
        "plan-precision",
        ["plan", "--cluster", "{cluster}", *SMALL, "--precision", "fp8"],
        "--precision",
        lambda f: piebald.JobSpec(global_batch_size=8, seq_len=64, precision="fp8"),  # type: ignore[arg-type]
        "precision",
    ),
    (
        "plan-cluster-missing",
        ["plan", "--cluster", "{root}/absent.yaml", *SMALL],
        "absent.yaml",
        lambda f: piebald.plan(
            f["cluster"].parent / "absent.yaml",
            "tiny",
            piebald.build_job(global_batch=8, seq_len=64),
        ),
        "absent.yaml",
    ),
    (
        "plan-model",
        [
            "plan",
            "--cluster",
            "{cluster}",
            "--model",
            "no-such-model",
            "--global-batch",
            "8",
            "--seq-len",
            "64",
        ],
        "no-such-model",
        lambda f: piebald.load_model("no-such-model"),
        "no-such-model",
    ),
    (
        "reference-model-name-too-long",
        ["train", "--model", "x" * 300, "--global-batch", "8", "--seq-len", "64"],
        "--model",
        lambda f: piebald.load_model("x" * 300),
        "name_or_path",
    ),
    (
        "plan-model-name-too-long",
        [
            "plan",
            "--cluster",
            "{cluster}",
            "--model",
            "x" * 300,
            "--global-batch",
            "8",
            "--seq-len",
            "64",
        ],
        "--model",
        lambda f: piebald.plan(
            f["cluster"], "x" * 300, piebald.build_job(global_batch=8, seq_len=64)
        ),
        "model",
    ),
    (
        "plan-workers",
        ["plan", "--cluster", "{cluster}", *SMALL, "--workers", "0"],
        "--workers",
        lambda f: piebald.plan(
            f["cluster"], "tiny", piebald.build_job(global_batch=8, seq_len=64), workers=0
        ),
        "workers",
    ),
    (
        "plan-seq-len-over-model",
        [
            "plan",
            "--cluster",
            "{cluster}",
            "--model",
            "gpt2",
            "--global-batch",
            "8",
            "--seq-len",
            "4096",
        ],
        "--seq-len",
        lambda f: piebald.plan(
            f["cluster"], "gpt2", piebald.build_job(global_batch=8, seq_len=4096)
        ),
        "seq_len",
    ),
    # simulate / estimate / explain: a plan that no longer fits its cluster's memory
    (
        "simulate-tiny-mem",
        ["simulate", "--plan", "{tiny_mem}"],
        "tiny_mem.json",
        lambda f: piebald.simulate(f["tiny_mem"]),
        "every rank to fit",
    ),
    (
        "explain-tiny-mem",
        ["explain", "{tiny_mem}"],
        "tiny_mem.json",
        lambda f: piebald.explain(f["tiny_mem"]),
        "every rank to fit",
    ),
    (
        "estimate-tiny-mem",
        ["explain", "{tiny_mem}"],
        "tiny_mem.json",
        lambda f: piebald.estimate(f["tiny_mem"]),
        "every rank to fit",
    ),
    (
        "simulate-missing-plan",
        ["simulate", "--plan", "{root}/absent.json"],
        "absent.json",
        lambda f: piebald.simulate(f["cluster"].parent / "absent.json"),
        "absent.json",
    ),
    # train --emulate / emulate
    (
        "emulate-tiny-mem",
        ["train", "--plan", "{tiny_mem}", "--emulate", "--steps", "1"],
        "tiny_mem.json",
        lambda f: piebald.emulate(f["tiny_mem"], steps=1),
        "every rank to fit",
    ),
    (
        "emulate-existing-metrics",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--metrics", "{existing}"],
        "--metrics",
        lambda f: piebald.emulate(f["plan"], config=_train_config(metrics_path=f["existing"])),
        "config.metrics_path",
    ),
    (
        "emulate-save-model-exists",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--save-model", "{root}"],
        "--save-model",
        lambda f: piebald.emulate(
            f["plan"], config=_train_config(save_model_path=f["cluster"].parent)
        ),
        "config.save_model_path",
    ),
    (
        "emulate-save-model-proc",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--save-model", "/proc/w"],
        "--save-model",
        lambda f: piebald.emulate(f["plan"], config=_train_config(save_model_path=Path("/proc/w"))),
        "config.save_model_path",
    ),
    (
        "emulate-checkpoint-dir-file",
        [
            "train",
            "--plan",
            "{plan}",
            "--emulate",
            "--steps",
            "1",
            "--checkpoint-dir",
            "{existing}",
        ],
        "--checkpoint-dir",
        lambda f: piebald.emulate(f["plan"], config=_train_config(checkpoint_dir=f["existing"])),
        "config.checkpoint_dir",
    ),
    (
        "emulate-tensorboard-file",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--tensorboard", "{existing}"],
        "--tensorboard",
        lambda f: piebald.emulate(f["plan"], config=_train_config(tensorboard_dir=f["existing"])),
        "config.tensorboard_dir",
    ),
    (
        "emulate-resume-without-dir",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--resume"],
        "--resume",
        lambda f: piebald.emulate(f["plan"], config=_train_config(resume=True)),
        "config.resume",
    ),
    (
        "emulate-eval-every-without-data",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--eval-every", "2"],
        "--eval-every",
        lambda f: piebald.emulate(f["plan"], config=_train_config(eval_every=2)),
        "config.eval_every",
    ),
    (
        "emulate-steps",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "0"],
        "--steps",
        lambda f: piebald.emulate(f["plan"], steps=0),
        "steps",
    ),
    (
        "emulate-max-params",
        ["train", "--plan", "{plan}", "--emulate", "--max-emulated-params", "0"],
        "--max-emulated-params",
        lambda f: piebald.emulate(f["plan"], max_params=0),
        "max_params",
    ),
    (
        "emulate-lr-inf",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--lr", "inf"],
        "--lr",
        lambda f: piebald.emulate(
            f["plan"], config=_train_config(optimizer=piebald.api.OptimizerConfig(lr=math.inf))
        ),
        "optimizer.lr",
    ),
    (
        "emulate-weight-decay-inf",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--weight-decay", "inf"],
        "--weight-decay",
        lambda f: _train_config(optimizer=piebald.api.OptimizerConfig(weight_decay=math.inf)),
        "optimizer.weight_decay",
    ),
    (
        "emulate-max-grad-norm-inf",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--max-grad-norm", "inf"],
        "--max-grad-norm",
        lambda f: _train_config(optimizer=piebald.api.OptimizerConfig(max_grad_norm=math.inf)),
        "optimizer.max_grad_norm",
    ),
    (
        "emulate-min-lr-inf",
        ["train", "--plan", "{plan}", "--emulate", "--steps", "1", "--min-lr", "inf"],
        "--min-lr",
        lambda f: _train_config(lr_schedule=piebald.api.LrSchedule(min_lr=math.inf)),
        "lr_schedule.min_lr",
    ),
    # the reference run (train without a plan) / train_reference
    (
        "reference-existing-metrics",
        ["train", *SMALL, "--steps", "1", "--metrics", "{existing}"],
        "--metrics",
        lambda f: piebald.api.train_reference(
            piebald.load_model("tiny"),
            piebald.build_job(global_batch=8, seq_len=64),
            _train_config(metrics_path=f["existing"]),
        ),
        "config.metrics_path",
    ),
]


def _format(args: list[str], files: dict[str, Path]) -> list[str]:
    names = {key: str(path) for key, path in files.items()}
    names["root"] = str(files["cluster"].parent)
    return [arg.format(**names) if "{" in arg else arg for arg in args]


@pytest.mark.parametrize(
    ("cli_args", "flag", "api_call", "name"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_cli_and_api_refuse_alike(
    files: dict[str, Path],
    cli_args: list[str],
    flag: str,
    api_call: Callable[[dict[str, Path]], object],
    name: str,
) -> None:
    _cli_refuses(_format(cli_args, files), flag)
    _api_refuses(lambda: api_call(files), name)


def test_the_lr_inf_of_a_job_file_is_refused(files: dict[str, Path], tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("lr = inf\n")
    # The job file's reader names the file and its key; the flag names itself.
    _cli_refuses(["train", "--config", str(job), "--plan", str(files["plan"]), "--emulate"], "lr")


BAD_ARGUMENTS: list[tuple[str, Callable[[dict[str, Path]], object], str]] = [
    ("load_cluster-none", lambda f: piebald.load_cluster(None), "path"),  # type: ignore[arg-type]
    ("load_cluster-int", lambda f: piebald.load_cluster(123), "path"),  # type: ignore[arg-type]
    ("load_cluster-bytes", lambda f: piebald.load_cluster(b"c.yaml"), "path"),  # type: ignore[arg-type]
    ("load_cluster-dict", lambda f: piebald.load_cluster({}), "path"),  # type: ignore[arg-type]
    ("load_plan-none", lambda f: piebald.load_plan(None), "path"),  # type: ignore[arg-type]
    ("load_model-long", lambda f: piebald.load_model("x" * 100_000), "name_or_path"),
    (
        "plan-cluster-none",
        lambda f: piebald.plan(None, "tiny", piebald.build_job(global_batch=8, seq_len=64)),  # type: ignore[arg-type]
        "cluster",
    ),
    (
        "plan-profiles-int",
        lambda f: piebald.plan(
            f["cluster"],
            "tiny",
            piebald.build_job(global_batch=8, seq_len=64),
            profiles=123,  # type: ignore[arg-type]
        ),
        "profiles",
    ),
    (
        "plan-strategy-none",
        lambda f: piebald.plan(
            f["cluster"],
            "tiny",
            piebald.build_job(global_batch=8, seq_len=64),
            strategy=None,  # type: ignore[arg-type]
        ),
        "strategy",
    ),
    (
        "plan-workers-str",
        lambda f: piebald.plan(
            f["cluster"],
            "tiny",
            piebald.build_job(global_batch=8, seq_len=64),
            workers="4",  # type: ignore[arg-type]
        ),
        "workers",
    ),
    (
        "plan-progress-str",
        lambda f: piebald.plan(
            f["cluster"],
            "tiny",
            piebald.build_job(global_batch=8, seq_len=64),
            progress="x",  # type: ignore[arg-type]
        ),
        "progress",
    ),
    ("simulate-profiles-int", lambda f: piebald.simulate(f["plan"], profiles=5), "profiles"),  # type: ignore[arg-type]
    (
        "save_plan-path-none",
        lambda f: piebald.save_plan(piebald.load_plan(f["plan"]), None),
        "path",
    ),  # type: ignore[arg-type]
    (
        "save_plan-plan-none",
        lambda f: piebald.save_plan(None, f["cluster"].parent / "p.json"),
        "plan",
    ),  # type: ignore[arg-type]
    (
        "save_plan-plan-dict",
        lambda f: piebald.save_plan({}, f["cluster"].parent / "p.json"),
        "plan",
    ),  # type: ignore[arg-type]
    ("emulate-steps-str", lambda f: piebald.emulate(f["plan"], steps="2"), "steps"),  # type: ignore[arg-type]
    ("emulate-config-str", lambda f: piebald.emulate(f["plan"], config="x"), "config"),  # type: ignore[arg-type]
    ("emulate-max-params-0", lambda f: piebald.emulate(f["plan"], max_params=0), "max_params"),
    (
        "jobspec-batch-bool",
        lambda f: piebald.JobSpec(global_batch_size=True, seq_len=64),
        "global_batch_size",
    ),
    (
        "jobspec-batch-float",
        lambda f: piebald.JobSpec(global_batch_size=12.5, seq_len=64),  # type: ignore[arg-type]
        "global_batch_size",
    ),
    ("jobspec-seq-float", lambda f: piebald.JobSpec(global_batch_size=8, seq_len=64.0), "seq_len"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(
    ("call", "name"), [case[1:] for case in BAD_ARGUMENTS], ids=[c[0] for c in BAD_ARGUMENTS]
)
def test_a_bad_argument_is_an_argument_error_naming_it(
    files: dict[str, Path], call: Callable[[dict[str, Path]], object], name: str
) -> None:
    with pytest.raises(ArgumentError) as raised:
        call(files)
    assert raised.value.argument == name
    assert "\n" not in str(raised.value)


def test_a_plan_that_no_longer_fits_is_refused_by_load_plan(files: dict[str, Path]) -> None:
    with pytest.raises(SpecError, match=r"stages\[0\]: expected every rank to fit"):
        piebald.load_plan(files["tiny_mem"])
    assert piebald.load_plan(files["plan"]).num_stages >= 1


# Every float of a TrainConfig, its optimizer's and its schedule's: (field, how to set it).
FLOAT_FIELDS: list[tuple[str, Callable[[float], Any]]] = [
    ("time_scale", lambda x: _train_config(time_scale=x)),
    ("timeout_s", lambda x: _train_config(timeout_s=x)),
    ("optimizer.lr", lambda x: _train_config(optimizer=piebald.api.OptimizerConfig(lr=x))),
    ("optimizer.eps", lambda x: _train_config(optimizer=piebald.api.OptimizerConfig(eps=x))),
    (
        "optimizer.weight_decay",
        lambda x: _train_config(optimizer=piebald.api.OptimizerConfig(weight_decay=x)),
    ),
    (
        "optimizer.max_grad_norm",
        lambda x: _train_config(optimizer=piebald.api.OptimizerConfig(max_grad_norm=x)),
    ),
    (
        "optimizer.betas[0]",
        lambda x: _train_config(optimizer=piebald.api.OptimizerConfig(betas=(x, 0.95))),
    ),
    (
        "optimizer.betas[1]",
        lambda x: _train_config(optimizer=piebald.api.OptimizerConfig(betas=(0.9, x))),
    ),
    ("lr_schedule.min_lr", lambda x: _train_config(lr_schedule=piebald.api.LrSchedule(min_lr=x))),
]


@settings(max_examples=60, deadline=None)
@given(
    field=st.sampled_from(range(len(FLOAT_FIELDS))),
    value=st.floats(allow_nan=True, allow_infinity=True),
)
def test_no_float_of_a_train_config_is_inf_or_nan(field: int, value: float) -> None:
    name, make = FLOAT_FIELDS[field]
    try:
        make(value)
    except ArgumentError as error:
        assert error.argument == name, str(error)
        assert "\n" not in str(error)
        return
    except ValueError as error:  # a range check of OptimizerConfig or LrSchedule itself
        assert math.isfinite(value) or "nan" in str(error) or "inf" in str(error), str(error)
        return
    assert math.isfinite(value), f"{name} = {value} was accepted"
