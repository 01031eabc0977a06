"""``--config job.toml``: a command's flags from a TOML file, the command line overriding it.

The file's keys are the command's long flags without the dashes (``warmup-steps`` or
``warmup_steps``; ``json`` for ``--json``, ``emulate = false`` for ``--no-emulate``), its
values typed as the flags are: integers for integer flags, numbers for float flags,
``true``/``false`` for on/off flags, strings for paths and words. Relative paths are taken
from the current directory, as on the command line. For example::

    plan = "plan.json"
    emulate = true
    steps = 2000
    lr = 6e-4
    warmup-steps = 200
    lr-decay = "cosine"
    min-lr = 6e-5
    weight-decay = 0.1
    metrics = "runs/a/metrics.jsonl"
    tensorboard = "runs/a/tb"

How: the option is eager, so click processes it before every other option; its callback
fills the context's ``default_map``, which click consults for each option the command line
did not give (command line, then the file, then the flag's own default). Unknown keys,
values of the wrong type, ``inf`` or ``nan``, or out of a flag's range are one line naming
the file and the key. The file is read by :func:`~piebald.specs.user_input.read_user_toml`:
a regular file of at most :data:`MAX_JOB_FILE_BYTES`, UTF-8, nested at most 64 levels.
"""

from __future__ import annotations

import inspect
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from piebald.cli.common import user_errors
from piebald.errors import SpecError
from piebald.specs.fields import suggest
from piebald.specs.user_input import read_user_toml

__all__ = ["MAX_JOB_FILE_BYTES", "ConfigOption", "load_job_file"]

MAX_JOB_FILE_BYTES = 1 << 20  # a file of flags; thousands of times the largest useful one


@dataclass(frozen=True, slots=True, kw_only=True)
class _Flag:
    """One option of the command, as its function declares it."""

    name: str  # the function's parameter (the default_map key)
    kind: type  # int, float, bool, str or Path (Optional stripped)
    min: float | None = None
    max: float | None = None


def _flags(ctx: typer.Context) -> dict[str, _Flag]:
    """Each option under its long flag without the dashes (not the eager --config, --help).

    Types and ranges come from the command function's annotations, not click's parameter
    classes: those differ between typer versions (typer 0.29 carries its own click)."""
    callback = ctx.command.callback
    assert callback is not None
    hints = typing.get_type_hints(inspect.unwrap(callback), include_extras=True)
    flags: dict[str, _Flag] = {}
    for param in ctx.command.params:
        if param.is_eager or param.name is None or param.name not in hints:
            continue
        annotated = hints[param.name]
        base, *extras = typing.get_args(annotated) or (annotated,)
        kinds = [k for k in typing.get_args(base) or (base,) if k is not type(None)]
        info = next((e for e in extras if hasattr(e, "min")), None)
        flag = _Flag(
            name=param.name,
            kind=kinds[0],
            min=getattr(info, "min", None),
            max=getattr(info, "max", None),
        )
        for opt in param.opts:
            if opt.startswith("--"):
                flags[opt[2:]] = flag
    return flags


def _value(path: Path, key: str, value: object, flag: _Flag) -> object:
    """The file's value for ``flag``, checked as the command line would check it."""
    number = isinstance(value, int | float) and not isinstance(value, bool)  # TOML true is no 1
    if flag.kind is bool:
        ok, expected = isinstance(value, bool), "true or false"
    elif flag.kind is int:
        ok, expected = number and isinstance(value, int), "an integer"
    elif flag.kind is float:
        ok, expected = number, "a number"
    else:  # str, Path: a word or a path
        ok, expected = isinstance(value, str), "a string"
    if not ok:
        raise SpecError(source=str(path), field=key, value=value, expected=expected)
    if number:
        assert isinstance(value, int | float)
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(
                source=str(path), field=key, value=value, expected=f"a finite {expected[2:]}"
            )
        if flag.min is not None and value < flag.min:
            raise SpecError(
                source=str(path), field=key, value=value, expected=f"{expected} >= {flag.min}"
            )
        if flag.max is not None and value > flag.max:
            raise SpecError(
                source=str(path), field=key, value=value, expected=f"{expected} <= {flag.max}"
            )
    return value


@user_errors
def load_job_file(
    ctx: typer.Context, _param: typer.CallbackParam, value: Path | None
) -> Path | None:
    """Callback of the eager ``--config`` option: the file's keys become the defaults."""
    if value is None or ctx.resilient_parsing:
        return value
    table = read_user_toml(value, source=str(value), max_bytes=MAX_JOB_FILE_BYTES)
    flags = _flags(ctx)
    defaults: dict[str, Any] = dict(ctx.default_map or {})
    seen: dict[str, str] = {}
    for key, item in table.items():
        flag = key.replace("_", "-")
        param = flags.get(flag)
        if param is None:
            raise SpecError(
                source=str(value),
                field=key,
                value=item,
                has_value=False,
                expected=f"a flag of this command{suggest(flag, flags)}, one of "
                + ", ".join(sorted(flags)),
            )
        if param.name in seen:
            raise SpecError(
                source=str(value),
                field=key,
                value=item,
                has_value=False,
                expected=f"one key per flag (also given as {seen[param.name]})",
            )
        seen[param.name] = key
        defaults[param.name] = _value(value, key, item, param)
    ctx.default_map = defaults
    return value


ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        is_eager=True,
        callback=load_job_file,
        help="TOML file of these flags (warmup-steps = 100, ...); flags given here win.",
    ),
]
