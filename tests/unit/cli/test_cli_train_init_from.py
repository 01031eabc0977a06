"""``piebald train --plan ... --emulate --init-from DIR`` where DIR's config.json describes
another model than the plan's (every tensor name present, so only the config tells): exit 2
and one line naming the file, the field and both values, before any process starts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from safetensors.torch import save_file

from cli_runner import run_cli
from piebald.examples import example_path
from piebald.runtime.models import build_stage_part
from piebald.runtime.models.hf_names import hf_tensors
from piebald.specs.hf_config_write import hf_config_from_arch
from piebald.specs.presets import load_model


def tiny_directory(directory: Path, *, rope_theta: float) -> None:
    """The tiny preset's weights under Hugging Face names, with a config.json of the tiny
    architecture except for ``rope_theta`` (which changes no tensor's shape)."""
    model = load_model("tiny")
    part = build_stage_part(model, layer_start=0, layer_end=model.num_layers, seed=5)
    parameters = dict(part.named_parameters())
    tensors = {}
    for tensor in hf_tensors(
        model.arch, layer_start=0, layer_end=model.num_layers, has_embedding=True
    ):
        value = parameters[tensor.local_name].detach()
        tensors[tensor.hf_names[0]] = (value.t() if tensor.transpose else value).contiguous()
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    arch = dataclasses.replace(model.arch, rope_theta=rope_theta)
    (directory / "config.json").write_text(json.dumps(hf_config_from_arch(arch)))


def test_a_config_of_another_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        "--model",
        "tiny",
        "--global-batch",
        "6",
        "--seq-len",
        "32",
        "--out",
        str(plan),
    )
    assert code == 0, output
    weights = tmp_path / "weights"
    tiny_directory(weights, rope_theta=500000.0)
    code, output = run_cli(
        "train", "--plan", str(plan), "--emulate", "--steps", "1", "--init-from", str(weights)
    )
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(f"error: {weights / 'config.json'}: rope_theta: got 500000.0; ")
    assert "expected 10000.0, the rope_theta of the model being trained ('tiny')" in lines[0]
