"""The Hugging Face directory writer: what transformers' ``from_pretrained`` reads back,
in one file or sharded with an index, and nothing left behind or replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from piebald.outputs import OutputError
from piebald.runtime.models.hf_export import INDEX_NAME, SINGLE_FILE, write_hf_model

transformers = pytest.importorskip("transformers")


def small_llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        vocab_size=61,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("max_shard_bytes", [10**9, 20_000], ids=["one file", "sharded"])
def test_transformers_loads_what_was_written(max_shard_bytes: int, tmp_path: Path) -> None:
    source = small_llama()
    tensors = {name: t.detach().clone() for name, t in source.state_dict().items()}
    out = tmp_path / "out"
    write_hf_model(
        out, tensors=tensors, config=source.config.to_dict(), max_shard_bytes=max_shard_bytes
    )
    files = sorted(p.name for p in out.glob("*.safetensors"))
    if max_shard_bytes > 10**6:
        assert files == [SINGLE_FILE] and not (out / INDEX_NAME).exists()
    else:
        assert len(files) > 2 and files[0].endswith(f"-of-{len(files):05d}.safetensors")
        index = json.loads((out / INDEX_NAME).read_text())
        assert set(index["weight_map"]) == set(tensors)
        assert set(index["weight_map"].values()) == set(files)
    loaded, info = transformers.LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, tensors[name]), name
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left beside it


def test_an_existing_destination_is_never_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputError, match="already exists"):
        write_hf_model(out, tensors={"w": torch.zeros(2)}, config={})
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
