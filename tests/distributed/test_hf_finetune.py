"""Fine-tuning a Hugging Face model end to end, with transformers as the oracle: a random
Llama with llama3 RoPE scaling and a random Qwen2, saved by transformers, go through
``piebald train --model DIR --init-from DIR ... --save-model OUT`` (single process, and an
emulated two-stage plan). With lr 0 the evaluation loss is transformers' loss on the same
windows and OUT reloads in transformers with no missing or unexpected key and the source's
weights (its tokenizer files and token ids carried over); with lr > 0 the reloaded model's
logits are piebald's."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from dist_harness import StageSpec, make_plan
from torch.nn import functional

from cli_runner import last_json, run_cli
from piebald.runtime.data.token_file import write_token_file
from piebald.runtime.models import build_stage_part, load_hf_weights
from piebald.specs.plan import Schedule, ZeroMode
from piebald.specs.plan_io import save_plan
from piebald.specs.presets import load_model

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.distributed

VOCAB = 97
SEQ_LEN = 24  # beyond the llama3 scaling's original 8 positions: the scaling matters
JOB = ["--global-batch", "4", "--seq-len", str(SEQ_LEN)]


def llama3_scaled() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    return transformers.LlamaForCausalLM(config)


def qwen2() -> torch.nn.Module:
    config = transformers.Qwen2Config(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        eos_token_id=3,
    )
    return transformers.Qwen2ForCausalLM(config)


MODELS: dict[str, Callable[[], torch.nn.Module]] = {"llama3-scaled": llama3_scaled, "qwen2": qwen2}


def saved_source(name: str, directory: Path) -> torch.nn.Module:
    torch.manual_seed(1)
    model = MODELS[name]()
    with torch.no_grad():  # off the initial values: norms 1 and biases 0 would hide mix-ups
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.eval()
    model.save_pretrained(directory)
    # What a downloaded model directory also holds, and a fine-tuned one must keep.
    (directory / "tokenizer.json").write_text('{"stands in for": "a tokenizer"}\n')
    (directory / "tokenizer_config.json").write_text('{"eos_token": "</s>"}\n')
    return model


def transformers_eval_loss(model: torch.nn.Module, ids: np.ndarray) -> float:
    width = SEQ_LEN + 1
    windows = torch.as_tensor(ids[: len(ids) // width * width].astype(np.int64)).view(-1, width)
    with torch.no_grad():
        logits = model(input_ids=windows[:, :-1]).logits.double()
    losses = functional.cross_entropy(
        logits.reshape(-1, VOCAB), windows[:, 1:].reshape(-1), reduction="sum"
    )
    return float(losses) / windows[:, 1:].numel()


def reload(directory: Path) -> torch.nn.Module:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    return model.eval()


def train(*args: str) -> dict[str, object]:
    code, output = run_cli("train", *args, "--json")
    assert code == 0, output
    summary = last_json(output)
    assert isinstance(summary, dict)
    return summary


@pytest.mark.parametrize("name", sorted(MODELS))
def test_finetune_round_trip(name: str, tmp_path: Path) -> None:
    source_dir = tmp_path / "source"
    source = saved_source(name, source_dir)
    ids = np.random.default_rng(2).integers(0, VOCAB, size=2000)
    data = str(write_token_file(tmp_path / "data.bin", ids).path)
    eval_ids = ids[: 7 * (SEQ_LEN + 1) + 3]  # 7 windows: two chunks of the batch of 4
    eval_data = str(write_token_file(tmp_path / "eval.bin", eval_ids).path)
    common = ["--init-from", str(source_dir), "--data", data, "--eval-data", eval_data]
    common += ["--eval-every", "1"]

    # lr 0: the evaluation is transformers' loss, the export the source's weights.
    out = tmp_path / "out"
    summary = train(
        "--model", str(source_dir), *JOB, *common, "--steps", "1", "--lr", "0",
        "--save-model", str(out),
    )  # fmt: skip
    expected = transformers_eval_loss(source, eval_ids)
    assert summary["eval_losses"] == [pytest.approx(expected, rel=1e-4)]
    assert math.isfinite(expected) and expected > 0
    reloaded = reload(out)
    assert type(reloaded) is type(source)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == source.config.model_type
    assert config["eos_token_id"] == source.config.eos_token_id is not None
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (source_dir / name).read_bytes(), name
    theirs = source.state_dict()
    assert sorted(reloaded.state_dict()) == sorted(theirs)
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, theirs[key]), key

    # lr > 0 under an emulated GPipe plan of two stages (the second ZeRO-3 over two GPUs, a tied
    # head apart from its embedding): the weights move, and what transformers computes with
    # the exported ones is what piebald's own model computes with them.
    spec = load_model(str(source_dir))
    plan = tmp_path / "plan.json"
    save_plan(
        make_plan(
            [
                StageSpec(layer_end=2, ranks=(0,), num_micro_batches=(4,), fractions=(1.0,)),
                StageSpec(
                    layer_end=spec.num_layers,
                    ranks=(1, 2),
                    num_micro_batches=(2, 2),
                    fractions=(0.6, 0.4),
                    zero=ZeroMode.FULL,
                ),
            ],
            num_gpus=3,
            schedule=Schedule.GPIPE,  # ZeRO-3 over several ranks runs them in lockstep
            gpu_types=("A100-80GB", "V100-32GB", "V100-32GB"),
            seq_len=SEQ_LEN,
            model=spec,
        ),
        plan,
    )
    trained = tmp_path / "trained"
    summary = train(
        "--plan", str(plan), "--emulate", *common, "--steps", "2", "--lr", "0.01",
        "--save-model", str(trained),
    )  # fmt: skip
    assert len(summary["eval_losses"]) == 2  # type: ignore[arg-type]
    moved = reload(trained)
    assert not torch.equal(moved.state_dict()["model.norm.weight"], theirs["model.norm.weight"])
    ours = build_stage_part(spec, layer_start=0, layer_end=spec.num_layers, seed=9)
    load_hf_weights(ours, trained)
    tokens = torch.as_tensor(eval_ids[: 2 * SEQ_LEN].astype(np.int64)).view(2, SEQ_LEN)
    with torch.no_grad():
        torch.testing.assert_close(
            ours(tokens), moved(input_ids=tokens).logits, rtol=1e-5, atol=1e-5
        )
