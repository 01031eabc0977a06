"""Whether a Hugging Face model directory's ``config.json`` describes the model being trained.

``--init-from DIR`` copies DIR's weights into the model of the plan (or of ``--model``).
Names and shapes of the tensors are checked as well, but two architectures can share every
shape (another RoPE theta or scaling, norm epsilon, head split, tied embeddings, window)
and the weights would then train as a model they were not trained as. So DIR's
``config.json`` is read as piebald reads any ``config.json`` (its refusals included) and
compared with the model being trained, field by field: model type, layers, hidden size,
attention and key/value heads, head dimension, MLP width, vocabulary, GPT-2's positions
(the shape of its position embedding; for RoPE models the context length changes nothing
that is computed unless the RoPE scaling uses it, and the scaling is compared), RoPE theta
and scaling, norm epsilon, tied embeddings, Llama's biases and the attention window. The
first difference is one :class:`~piebald.errors.SpecError` naming the file, the field as
``config.json`` spells it and both values. A directory without ``config.json`` (bare
safetensors) is not compared. Dropout, which piebald does not train with, is not compared
and not warned about here (the ``config.json`` the model was planned from is where it is
reported).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from pathlib import Path

from piebald.errors import SpecError
from piebald.specs.hf_config import DropoutIgnoredWarning, arch_from_hf_config
from piebald.specs.json_file import read_json
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.rope_scaling import RopeScaling

__all__ = ["check_config_matches", "config_mismatch"]

CONFIG_NAME = "config.json"

# After model_type: (config.json name for GPT-2, for the Llama family, the value compared);
# None: not compared in that family (not in its config.json, or follows from another field).
_COMPARED: tuple[tuple[str | None, str | None, Callable[[ModelArch], object]], ...] = (
    ("n_layer", "num_hidden_layers", lambda a: a.num_blocks),
    ("n_embd", "hidden_size", lambda a: a.hidden_size),
    ("n_head", "num_attention_heads", lambda a: a.num_heads),
    (None, "num_key_value_heads", lambda a: a.num_kv_heads),
    (None, "head_dim", lambda a: a.resolved_head_dim),
    ("n_inner", "intermediate_size", lambda a: a.ffn_hidden_size),
    ("vocab_size", "vocab_size", lambda a: a.vocab_size),
    ("n_positions", None, lambda a: a.max_seq_len),
    (None, "rope_theta", lambda a: a.rope_theta),
    (None, "rope_parameters", lambda a: _rope_scaling(a.rope_scaling)),
    ("layer_norm_epsilon", "rms_norm_eps", lambda a: a.norm_eps),
    ("tie_word_embeddings", "tie_word_embeddings", lambda a: a.tie_embeddings),
    # Llama's attention_bias sets both; Mistral's and Qwen2's biases follow their type.
    (None, "attention_bias", lambda a: a.attention_out_bias),
    (None, "mlp_bias", lambda a: a.mlp_bias),
    (None, "sliding_window", lambda a: a.sliding_window),
)


def _rope_scaling(scaling: RopeScaling | None) -> dict[str, object]:
    """The scaling's parameters that differ from their defaults (plain RoPE: as
    transformers says it, ``{"rope_type": "default"}``)."""
    if scaling is None:
        return {"rope_type": "default"}
    shown: dict[str, object] = {"rope_type": scaling.rope_type.value}
    for field in dataclasses.fields(scaling):
        value = getattr(scaling, field.name)
        if field.name != "rope_type" and value != field.default:
            shown[field.name] = value
    return shown


def config_mismatch(theirs: ModelArch, ours: ModelArch) -> tuple[str, object, object] | None:
    """The first field where ``theirs`` (read from a ``config.json``) differs from ``ours``:
    (the field as that family's ``config.json`` names it, their value, our value); None when
    they describe the same computation."""
    if theirs.model_type is not ours.model_type:  # the other fields mean other things
        return "model_type", theirs.model_type.value, ours.model_type.value
    for gpt2_name, llama_name, value in _COMPARED:
        name = gpt2_name if ours.family is Family.GPT2 else llama_name
        if name is not None and value(theirs) != value(ours):
            return name, value(theirs), value(ours)
    return None


def check_config_matches(model: ModelSpec, directory: Path) -> None:
    """Refuse, in one line naming ``directory/config.json``, the field and both values, a
    ``config.json`` that describes another model than ``model``; nothing when the directory
    has no ``config.json``. A ``config.json`` piebald cannot read is refused as
    :func:`~piebald.specs.hf_config.arch_from_hf_config` refuses it."""
    path = Path(directory) / CONFIG_NAME
    if not os.path.lexists(path):
        return
    data = read_json(path, expected="a Hugging Face config.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DropoutIgnoredWarning)
        theirs = arch_from_hf_config(data, source=str(path))
    mismatch = config_mismatch(theirs, model.arch)
    if mismatch is None:
        return
    field, their_value, our_value = mismatch
    raise SpecError(
        source=str(path),
        field=field,
        value=their_value,
        expected=f"{our_value!r}, the {field} of the model being trained "
        f"({model.name!r}): the weights in {directory} are of another model",
    )
