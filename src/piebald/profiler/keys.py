"""What a measurement is keyed by: device type, layer signature, sequence length, dtype.

A layer signature names the computation a layer does, from the architecture numbers that
decide it, never from the cost formulas (a better formula in ``specs/model.py`` must not
orphan old profiles). Blocks of one model share a signature; so do the blocks of two models
with the same block shape (gpt2 and a 6-block gpt2 variant), whose measurements are then
shared. Profile file names are built from the key alone (plus a content digest, see
``piebald.profiler.db``), so DBs gathered on different machines merge by copying files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from piebald.specs.devices import Dtype
from piebald.specs.model import Family, LayerKind, ModelArch

__all__ = [
    "ComputeKey",
    "layer_signature",
    "slug",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def slug(text: str) -> str:
    """``text`` made safe for a file name: other characters become ``_``."""
    return _UNSAFE.sub("_", text).strip("_") or "_"


def layer_signature(arch: ModelArch, kind: LayerKind) -> str:
    """A readable name of the computation a layer of ``kind`` does in ``arch``.

    Embedding: table size and width (GPT-2 adds learned positions). Block: width, heads,
    key/value heads, head width, MLP width, biases if any. Head: width, vocabulary, tied or
    not (a tied head's weight gradient goes to the embedding's table).
    """
    family, h = arch.family.value, arch.hidden_size
    if kind is LayerKind.EMBEDDING:
        positions = f"-p{arch.max_seq_len}" if arch.family is Family.GPT2 else ""
        return f"embedding-{family}-v{arch.vocab_size}-h{h}{positions}"
    if kind is LayerKind.BLOCK:
        # Biases (Qwen2, Llama's attention_bias/mlp_bias) add work; named only when present,
        # so the signatures of bias-free blocks, and their profiles, stay as they were.
        biases = "".join(
            suffix
            for suffix, present in (
                ("-bqkv", arch.attention_qkv_bias),
                ("-bo", arch.attention_out_bias),
                ("-bmlp", arch.mlp_bias),
            )
            if present
        )
        return (
            f"block-{family}-h{h}-a{arch.num_heads}-kv{arch.num_kv_heads}"
            f"-d{arch.resolved_head_dim}-f{arch.ffn_hidden_size}{biases}"
        )
    tied = "tied" if arch.tie_embeddings else "untied"
    return f"head-{family}-h{h}-v{arch.vocab_size}-{tied}"


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class ComputeKey:
    """What one compute profile file is about."""

    device: str
    signature: str
    seq_len: int
    dtype: Dtype

    def file_stem(self) -> str:
        return (
            f"compute--{slug(self.device)}--{slug(self.signature)}--s{self.seq_len}--{self.dtype}"
        )

    def describe(self) -> str:
        return f"{self.device} {self.signature} seq {self.seq_len} {self.dtype}"
