"""The training job: global batch, sequence length, precision, optimizer and seed."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from piebald.errors import ArgumentError, SpecError
from piebald.specs.devices import Dtype
from piebald.specs.fields import Fields
from piebald.specs.limits import MAX_GLOBAL_BATCH, MAX_SEED, MAX_SEQ_LEN, limit_text
from piebald.specs.model import Family, ModelSpec

__all__ = [
    "JobSpec",
    "Optimizer",
    "check_job_fits_model",
    "check_job_size",
    "check_seq_len",
    "job_from_dict",
    "job_to_dict",
]


class Optimizer(StrEnum):
    ADAMW = "adamw"  # 12 bytes of fp32 state per parameter: master copy, m, v
    SGD = "sgd"  # 4 bytes: the fp32 master copy (no momentum), used by equivalence tests


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    global_batch_size: int  # sequences per optimizer step
    seq_len: int  # tokens per sequence
    precision: Dtype = Dtype.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    seed: int = 0

    def __post_init__(self) -> None:
        # Loaders and flags check the limits first (one line naming the file or flag); these
        # are the invariants every JobSpec holds, so downstream sizes stay bounded. Built
        # directly, a bad field is an ArgumentError naming it: sizes are ints (not bools, not
        # floats), precision and optimizer one of their names (a str is taken as the name).
        for name, low, high, what in (
            ("global_batch_size", 1, MAX_GLOBAL_BATCH, "global batch, in sequences"),
            ("seq_len", 1, MAX_SEQ_LEN, "sequence length, in tokens"),
            ("seed", 0, MAX_SEED, "seed"),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ArgumentError(
                    argument=name,
                    value=value,
                    expected=f"a whole number in {low}..{high} (the {what})",
                )
        for name, kind in (("precision", Dtype), ("optimizer", Optimizer)):
            value = getattr(self, name)
            allowed = [member.value for member in kind]
            if not isinstance(value, str) or value not in allowed:
                raise ArgumentError(argument=name, value=value, expected=f"one of {allowed}")
            object.__setattr__(self, name, kind(value))

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


def job_to_dict(job: JobSpec) -> dict[str, Any]:
    return {
        "global_batch_size": job.global_batch_size,
        "seq_len": job.seq_len,
        "precision": job.precision.value,
        "optimizer": job.optimizer.value,
        "seed": job.seed,
    }


def job_from_dict(data: object, *, source: str) -> JobSpec:
    fields = Fields(data, source=source, path="job")
    fields.reject_unknown(("global_batch_size", "seq_len", "precision", "optimizer", "seed"))
    return JobSpec(
        global_batch_size=fields.integer("global_batch_size", minimum=1, maximum=MAX_GLOBAL_BATCH),
        seq_len=fields.integer("seq_len", minimum=1, maximum=MAX_SEQ_LEN),
        precision=Dtype(fields.choice("precision", [d.value for d in Dtype], default="bf16")),
        optimizer=Optimizer(
            fields.choice("optimizer", [o.value for o in Optimizer], default="adamw")
        ),
        seed=fields.integer("seed", default=0, minimum=0, maximum=MAX_SEED),
    )


def check_job_size(*, global_batch: object, seq_len: object) -> None:
    """A job's size as a caller gives it, checked before a JobSpec (or anything sized by
    it) is made: an ArgumentError naming ``global_batch`` or ``seq_len`` (the CLI reports
    it under its flag)."""
    for argument, value, maximum, unit in (
        ("global_batch", global_batch, MAX_GLOBAL_BATCH, "sequences"),
        ("seq_len", seq_len, MAX_SEQ_LEN, "tokens"),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(argument=argument, value=value, expected="a whole number >= 1")
        if value > maximum:
            raise ArgumentError(argument=argument, value=value, expected=limit_text(maximum, unit))


def check_job_fits_model(job: JobSpec, model: ModelSpec, *, source: str | None = None) -> None:
    """The job's sequences are ones the model computes as it was built to (check_seq_len)."""
    check_seq_len(model, seq_len=job.seq_len, source=source)


def check_seq_len(model: ModelSpec, *, seq_len: int, source: str | None = None) -> None:
    """A SpecError naming ``source`` if ``model`` cannot run sequences of ``seq_len`` tokens
    (without a source: an ArgumentError naming ``seq_len``, which the CLI shows as its flag).

    GPT-2 has learned positions: nothing beyond max_seq_len. Mistral and Qwen2 with a sliding
    window attend to the last ``sliding_window`` tokens only, which piebald's runtime does
    not implement (it attends to all earlier tokens): the two agree while a sequence fits
    in the window, so longer sequences are refused rather than trained differently.
    """
    arch = model.arch
    if arch.family is Family.GPT2 and seq_len > arch.max_seq_len:
        raise _seq_len_error(
            source,
            seq_len,
            f"at most {arch.max_seq_len} for {model.name} (GPT-2 has learned positions)",
        )
    if arch.sliding_window is not None and seq_len > arch.sliding_window:
        raise _seq_len_error(
            source,
            seq_len,
            f"at most {arch.sliding_window} for {model.name}: its sliding attention "
            f"window is {arch.sliding_window} tokens, which piebald does not implement (it "
            "attends to every earlier token, the same computation only within the window)",
        )


def _seq_len_error(source: str | None, seq_len: int, expected: str) -> SpecError:
    if source is None:
        return ArgumentError(argument="seq_len", value=seq_len, expected=expected)
    return SpecError(source=source, field="", value=seq_len, expected=expected)
