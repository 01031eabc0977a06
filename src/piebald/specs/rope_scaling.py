"""RoPE frequency scaling: which variant a model uses and its parameters, read from and
written to a Hugging Face ``config.json``.

Three variants change the rotary frequencies of a Llama-family model (the runtime computes
them in ``runtime/models/rope.py``):

* ``linear`` (position interpolation, Chen et al. 2023): every frequency divided by
  ``factor``, i.e. positions compressed by ``factor``.
* ``llama3`` (Llama 3.1): wavelengths longer than original_max_position_embeddings /
  low_freq_factor are divided by ``factor``, those shorter than .../high_freq_factor kept,
  and those in between interpolated smoothly.
* ``yarn`` (Peng et al. 2023, "YaRN", eqs. 18-23): NTK-by-parts, a linear ramp between
  interpolated and original frequencies over the dimensions whose number of rotations in
  the original context lies between beta_slow and beta_fast, plus an attention factor that
  scales cos and sin (0.1 ln(factor) + 1 by default, eq. 22).

``config.json`` carries them in ``rope_scaling`` (transformers 4) or ``rope_parameters``
(transformers 5, which also holds ``rope_theta``). Other variants (dynamic NTK, longrope,
...) change frequencies with the sequence length or per layer; piebald refuses them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from piebald.specs.fields import Fields
from piebald.specs.limits import MAX_SEQ_LEN

__all__ = [
    "ROPE_HF_FIELDS",
    "RopeScaling",
    "RopeType",
    "rope_dict_from_hf",
    "rope_scaling_from_dict",
    "rope_scaling_from_hf",
    "rope_scaling_to_dict",
    "rope_scaling_to_hf",
]


class RopeType(StrEnum):
    LINEAR = "linear"
    LLAMA3 = "llama3"
    YARN = "yarn"


# The keys of a rope dict that transformers' default, linear, llama3 and yarn variants read.
ROPE_HF_FIELDS = (
    "rope_type",
    "type",  # transformers 4's older name of rope_type
    "rope_theta",
    "partial_rotary_factor",
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "truncate",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeScaling:
    """One RoPE scaling variant and its parameters (fields a variant does not use keep
    their defaults, so that two equal scalings compare equal)."""

    rope_type: RopeType
    factor: float
    # llama3 and yarn: the context length the model was pretrained with.
    original_max_position_embeddings: int = 0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn: rotations above which a dimension is not interpolated
    beta_slow: float = 1.0  # yarn: rotations below which a dimension is fully interpolated
    attention_factor: float | None = None  # yarn: None = from factor, mscale, mscale_all_dim
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn: round the ramp's ends to whole dimensions

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"RopeScaling.factor = {self.factor}; expected > 0")
        uses_original = self.rope_type in (RopeType.LLAMA3, RopeType.YARN)
        if uses_original and self.original_max_position_embeddings < 1:
            raise ValueError(
                f"RopeScaling.original_max_position_embeddings = "
                f"{self.original_max_position_embeddings}; expected >= 1 for {self.rope_type}"
            )
        if not uses_original and self.original_max_position_embeddings:
            raise ValueError(
                f"RopeScaling.original_max_position_embeddings is not used by {self.rope_type}"
            )
        if self.rope_type is RopeType.LLAMA3 and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                f"RopeScaling.high_freq_factor ({self.high_freq_factor}) must exceed "
                f"low_freq_factor ({self.low_freq_factor})"
            )

    @property
    def cos_sin_scale(self) -> float:
        """What cos and sin are multiplied by: YaRN's attention factor (eq. 22, with
        DeepSeek's mscale/mscale_all_dim ratio when both are given), else 1."""
        if self.rope_type is not RopeType.YARN:
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(
                self.factor, self.mscale_all_dim
            )
        return _yarn_mscale(self.factor, 1.0)


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_dict_from_hf(config: Fields) -> tuple[Fields | None, float | None]:
    """The rope dict of a ``config.json`` (transformers 4's ``rope_scaling`` or 5's
    ``rope_parameters``) and its ``rope_theta`` if it has one.

    As transformers 5 does: a non-empty ``rope_scaling`` wins over ``rope_parameters``.
    """
    for name in ("rope_scaling", "rope_parameters"):
        if config.has(name) and config.raw(name):
            rope = config.sub(name)
            theta = (
                rope.number("rope_theta", strictly_positive=True)
                if rope.has("rope_theta")
                else None
            )
            return rope, theta
    return None, None


def rope_scaling_from_hf(
    rope: Fields, *, max_position_embeddings: int, original_override: int | None
) -> RopeScaling | None:
    """The scaling a ``config.json`` rope dict asks for (None: plain RoPE); a variant
    piebald does not implement is a SpecError naming the file, the field and the value.

    ``original_override``: a top-level ``original_max_position_embeddings``, which
    transformers prefers to the rope dict's (Phi-3 style files).
    """
    for key, value in rope.data.items():
        if isinstance(value, Mapping):
            raise rope.error(key, value, "one RoPE for every layer (not one per layer type)")
    type_field = "rope_type" if rope.has("rope_type") else "type"
    rope_type = rope.raw(type_field, "default")
    supported = ["default", *(t.value for t in RopeType)]
    if rope_type not in supported:
        raise rope.error(
            type_field, rope_type, f"one of {supported} (piebald does not implement the others)"
        )
    partial = rope.number("partial_rotary_factor", default=1.0)
    if partial != 1.0:
        raise rope.error("partial_rotary_factor", partial, "1.0 (piebald rotates whole heads)")
    if rope_type == "default":
        return None
    kind = RopeType(rope_type)
    original = 0
    if kind is not RopeType.LINEAR:
        original = original_override or rope.integer(
            "original_max_position_embeddings",
            default=max_position_embeddings,
            minimum=1,
            maximum=MAX_SEQ_LEN,
        )
    if kind is RopeType.YARN and not rope.has("factor"):
        # transformers: a yarn factor left null is the ratio of the two context lengths.
        factor = max_position_embeddings / original
    else:
        factor = rope.number("factor", strictly_positive=True)
    if kind is RopeType.LINEAR:
        return RopeScaling(rope_type=kind, factor=factor)
    if kind is RopeType.LLAMA3:
        low = rope.number("low_freq_factor", strictly_positive=True)
        high = rope.number("high_freq_factor", strictly_positive=True)
        if not high > low:
            raise rope.error("high_freq_factor", high, f"a number > low_freq_factor ({low})")
        return RopeScaling(
            rope_type=kind,
            factor=factor,
            original_max_position_embeddings=original,
            low_freq_factor=low,
            high_freq_factor=high,
        )
    # transformers reads beta_fast/beta_slow with ``or``: 0 or null means the default.
    beta_fast = rope.number("beta_fast", default=32.0, minimum=-math.inf) or 32.0
    beta_slow = rope.number("beta_slow", default=1.0, minimum=-math.inf) or 1.0
    return RopeScaling(
        rope_type=kind,
        factor=factor,
        original_max_position_embeddings=original,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=rope.boolean("truncate", default=True),
        attention_factor=rope.optional_number("attention_factor"),
        mscale=rope.optional_number("mscale"),
        mscale_all_dim=rope.optional_number("mscale_all_dim"),
    )


def rope_scaling_to_hf(scaling: RopeScaling | None, *, theta: float) -> dict[str, Any]:
    """The rope dict transformers reads back as exactly ``scaling`` with base ``theta``."""
    out: dict[str, Any] = {"rope_type": "default" if scaling is None else scaling.rope_type.value}
    out["rope_theta"] = theta
    if scaling is None:
        return out
    out["factor"] = scaling.factor
    if scaling.rope_type is RopeType.LINEAR:
        return out
    out["original_max_position_embeddings"] = scaling.original_max_position_embeddings
    if scaling.rope_type is RopeType.LLAMA3:
        out["low_freq_factor"] = scaling.low_freq_factor
        out["high_freq_factor"] = scaling.high_freq_factor
        return out
    out["beta_fast"] = scaling.beta_fast
    out["beta_slow"] = scaling.beta_slow
    out["truncate"] = scaling.truncate
    for name in ("attention_factor", "mscale", "mscale_all_dim"):
        value = getattr(scaling, name)
        if value is not None:
            out[name] = value
    return out


# The plan file's names are transformers' less the legacy "type" and what ModelArch keeps
# elsewhere (rope_theta) or refuses (partial_rotary_factor).
_PLAN_FIELDS = tuple(
    name for name in ROPE_HF_FIELDS if name not in ("type", "rope_theta", "partial_rotary_factor")
)


def rope_scaling_to_dict(scaling: RopeScaling) -> dict[str, Any]:
    """The scaling as plan files embed it: every field, by its own name."""
    return {
        name: (value.value if isinstance(value, RopeType) else value)
        for name in _PLAN_FIELDS
        for value in (getattr(scaling, name),)
    }


def rope_scaling_from_dict(fields: Fields) -> RopeScaling:
    fields.reject_unknown(_PLAN_FIELDS)
    kwargs: dict[str, Any] = dict(
        rope_type=RopeType(fields.choice("rope_type", [t.value for t in RopeType])),
        factor=fields.number("factor", strictly_positive=True),
        original_max_position_embeddings=fields.integer(
            "original_max_position_embeddings", default=0, minimum=0, maximum=MAX_SEQ_LEN
        ),
        low_freq_factor=fields.number("low_freq_factor", default=1.0),
        high_freq_factor=fields.number("high_freq_factor", default=4.0),
        beta_fast=fields.number("beta_fast", default=32.0, minimum=-math.inf),
        beta_slow=fields.number("beta_slow", default=1.0, minimum=-math.inf),
        truncate=fields.boolean("truncate", default=True),
        attention_factor=fields.optional_number("attention_factor"),
        mscale=fields.optional_number("mscale"),
        mscale_all_dim=fields.optional_number("mscale_all_dim"),
    )
    try:
        return RopeScaling(**kwargs)
    except ValueError as error:
        raise fields.error(
            "rope_type", kwargs["rope_type"].value, f"consistent fields ({error})"
        ) from None
