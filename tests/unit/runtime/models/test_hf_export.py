"""The Hugging Face directory writer: what transformers' ``from_pretrained`` reads back,
in one file or sharded with an index, and nothing left behind or replaced."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from piebald.outputs import OutputError
from piebald.runtime.models.hf_export import INDEX_NAME, SINGLE_FILE, write_hf_model
from small_disk import small_disk

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


def test_an_existing_destination_is_never_replaced_and_the_model_kept(tmp_path: Path) -> None:
    """A --save-model directory made during the run (after the check before it) threw the
    trained model away; now theirs stays and the model is kept where the line says."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputError, match="nothing was overwritten") as caught:
        write_hf_model(out, tensors={"w": torch.zeros(2)}, config={})
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    message = str(caught.value)
    assert message.startswith(f"--save-model: got {str(out)!r}") and "\n" not in message
    (kept,) = (p for p in tmp_path.iterdir() if p.name != "out")
    assert f"the model is complete in {kept}: rename it" in message
    assert (kept / SINGLE_FILE).is_file() and (kept / "config.json").is_file()


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", size="64k") as disk:
        with pytest.raises(OutputError) as caught:
            write_hf_model(disk / "w", tensors={"w": torch.zeros(100_000)}, config={})
        assert str(caught.value) == (
            f"--save-model: got {str(disk / 'w')!r}; expected a location piebald can write "
            "(No space left on device)"
        )
        assert list(disk.iterdir()) == []


@pytest.mark.parametrize("appears", ["directory", "empty directory", "file"])
def test_a_destination_that_appears_during_the_export_is_kept_and_so_is_the_model(
    appears: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 7: a path created at ``--save-model`` while the run wrote the model was
    clobbered. Now theirs stays, and the finished model is kept under the scratch name."""
    import piebald.runtime.models.hf_export as hf_export

    out = tmp_path / "out"
    real_save = hf_export.save_file

    def save_then_someone_creates_out(*args: object, **kwargs: object) -> None:
        real_save(*args, **kwargs)  # type: ignore[arg-type]
        if appears == "file":
            out.write_text("theirs")
        else:
            out.mkdir()
            if appears == "directory":
                (out / "theirs.txt").write_text("theirs")

    monkeypatch.setattr(hf_export, "save_file", save_then_someone_creates_out)
    weights = {"w": torch.arange(4.0)}
    with pytest.raises(OutputError, match="during the run; nothing was overwritten") as caught:
        write_hf_model(out, tensors=weights, config={"model_type": "llama"})
    if appears == "file":
        assert out.read_text() == "theirs"
    else:
        assert sorted(p.name for p in out.iterdir()) == (
            ["theirs.txt"] if appears == "directory" else []
        )
    kept = [p for p in tmp_path.iterdir() if p.name != "out"]
    assert len(kept) == 1 and str(kept[0]) in str(caught.value)
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(kept[0] / SINGLE_FILE))["w"], weights["w"])
    assert json.loads((kept[0] / "config.json").read_text()) == {"model_type": "llama"}


def test_the_model_directory_gets_the_umask_mode(tmp_path: Path) -> None:
    """Finding 35: one permission policy (mkdtemp's scratch is private; the model is not)."""
    previous = os.umask(0o027)
    try:
        plain = tmp_path / "plain"
        plain.mkdir()
        write_hf_model(tmp_path / "out", tensors={"w": torch.zeros(2)}, config={})
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
