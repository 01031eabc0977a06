"""Dropout in a config.json: accepted, but piebald trains without it, so a nonzero
probability is one DropoutIgnoredWarning (the CLI: one ``warning:`` line on stderr) naming
the file, the fields and their values; zero, null (Llama) or a file piebald wrote is silent."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from hf_configs import GPT2, LLAMA
from piebald.errors import ModelWarning, SpecError
from piebald.examples import example_path
from piebald.specs.hf_config import DropoutIgnoredWarning, arch_from_hf_config
from piebald.specs.hf_config_write import hf_config_from_arch
from piebald.specs.presets import load_model

NO_DROPOUT = {"attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0}

WARNED = {
    "llama": ({**LLAMA, "attention_dropout": 0.1}, {"attention_dropout": 0.1}),
    "mistral": (
        {**LLAMA, "model_type": "mistral", "attention_dropout": 0.25},
        {"attention_dropout": 0.25},
    ),
    "qwen2": ({**LLAMA, "model_type": "qwen2", "attention_dropout": 1}, {"attention_dropout": 1}),
    "gpt2 one field": ({**GPT2, **NO_DROPOUT, "resid_pdrop": 0.2}, {"resid_pdrop": 0.2}),
    # GPT2Config's default is 0.1 for each: a file that leaves them out trains with dropout.
    "gpt2 left out": (GPT2, {"attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1}),
}


@pytest.mark.parametrize("case", sorted(WARNED))
def test_nonzero_dropout_is_one_warning_naming_file_fields_and_values(case: str) -> None:
    config, fields = WARNED[case]
    with pytest.warns(DropoutIgnoredWarning) as caught:
        arch_from_hf_config(config, source="dir/config.json")
    assert len(caught) == 1
    warning = caught[0].message
    assert isinstance(warning, DropoutIgnoredWarning) and isinstance(warning, ModelWarning)
    assert isinstance(warning, UserWarning)
    assert warning.fields == fields
    message = str(warning)
    assert message.startswith("dir/config.json: ") and "\n" not in message
    for name, value in fields.items():
        assert f"{name} = {value:g}" in message
    assert "piebald trains without dropout" in message
    assert ("left out" in message) == (case == "gpt2 left out")


SILENT = {
    "llama default": LLAMA,
    "llama zero": {**LLAMA, "attention_dropout": 0.0},
    "llama null": {**LLAMA, "attention_dropout": None},  # LlamaConfig allows null
    "qwen2 default": {**LLAMA, "model_type": "qwen2"},
    "gpt2 zeros": {**GPT2, **NO_DROPOUT},
    # Only GPT2DoubleHeadsModel's summary head uses it, never the causal LM.
    "gpt2 summary_first_dropout": {**GPT2, **NO_DROPOUT, "summary_first_dropout": 0.1},
}


@pytest.mark.parametrize("case", sorted(SILENT))
def test_no_dropout_no_warning(case: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arch_from_hf_config(SILENT[case], source="config.json")


@pytest.mark.parametrize("config", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_a_file_piebald_wrote_reads_back_without_warning(config: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arch = arch_from_hf_config(config, source="config.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert arch_from_hf_config(hf_config_from_arch(arch), source="out") == arch


@pytest.mark.parametrize(
    ("config", "field", "value"),
    [
        ({**LLAMA, "attention_dropout": 1.5}, "attention_dropout", "1.5"),
        ({**LLAMA, "attention_dropout": -0.1}, "attention_dropout", "-0.1"),
        ({**GPT2, "attn_pdrop": "0.1"}, "attn_pdrop", "'0.1'"),
    ],
)
def test_a_dropout_that_is_no_probability_is_refused(
    config: dict[str, Any], field: str, value: str
) -> None:
    with pytest.raises(SpecError) as error:
        arch_from_hf_config(config, source="config.json")
    assert str(error.value).startswith(f"config.json: {field}: got {value}; expected")


def test_cli_prints_one_warning_line_and_plans(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GPT2, **NO_DROPOUT, "attn_pdrop": 0.2}))
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        "--model",
        str(path),
        "--global-batch",
        "8",
        "--seq-len",
        "64",
        "--out",
        str(tmp_path / "plan.json"),
    )
    assert code == 0, output
    lines = [line for line in output.splitlines() if "dropout" in line]
    assert lines == [
        f"warning: {path}: attn_pdrop = 0.2; piebald trains without dropout, so these "
        "probabilities are ignored"
    ]
    assert "DropoutIgnoredWarning" not in output and "Traceback" not in output


def test_library_load_model_warns(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "attention_dropout": 0.1}))
    with pytest.warns(DropoutIgnoredWarning, match="attention_dropout = 0.1"):
        load_model(str(path))
