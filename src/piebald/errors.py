"""The one error type that user input can cause, and how it reads.

Every mistake in a file the user wrote (cluster YAML, model config.json, plan JSON) is
reported as a :class:`SpecError` that names the file, the field, the value and what was
expected, so the CLI can print it as one line and exit 2 instead of a traceback. A bad
argument of a library function (``piebald.plan(strategy=...)``) is an
:class:`ArgumentError` naming the argument; the command line names its flag instead. A run
that fails for another reason (a training worker killed by the OOM killer) is a
:class:`RunFailedError`, also one line. A setting of a model file that piebald accepts but
does not model (dropout) is a :class:`ModelWarning`, one line that the CLI prints as
``warning: ...`` on stderr.
"""

from __future__ import annotations

import reprlib

__all__ = ["ArgumentError", "ModelWarning", "RunFailedError", "SpecError", "error_fields"]

_MAX_VALUE_CHARS = 80

# A value is shown through a bounded repr: a few levels, a few items of each, so the cost
# of an error message never depends on the size of the value (a YAML alias bomb expands
# to billions of items, a JSON int to thousands of digits).
_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel = 3
_BOUNDED.maxtuple = _BOUNDED.maxlist = _BOUNDED.maxdict = _BOUNDED.maxset = 6
_BOUNDED.maxstring = _BOUNDED.maxother = 70
_BOUNDED.maxlong = 40


def _short(value: object) -> str:
    if isinstance(value, str):  # cut at the end, as a reader expects, not in the middle
        text = repr(value[:_MAX_VALUE_CHARS])
        return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."
    try:
        text = _BOUNDED.repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        text = f"<a {type(value).__name__} too long to show>"
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


class SpecError(ValueError):
    """Bad user input: ``source: field: got value; expected ...`` on one line."""

    def __init__(
        self,
        *,
        source: str,
        field: str,
        expected: str,
        value: object = None,
        has_value: bool = True,
    ) -> None:
        self.source = source
        self.field = field
        self.value = value
        self.expected = expected
        self._has_value = has_value
        where = f"{source}: {field}" if field else source
        got = f"got {_short(value)}; " if has_value else ""
        message = f"{where}: {got}expected {expected}"
        # One line, always: YAML parser messages span several lines.
        super().__init__(" ".join(message.split()))

    def with_source(self, source: str) -> SpecError:
        """The same error, attributed to another file (a loader knows the real path)."""
        return SpecError(
            source=source,
            field=self.field,
            value=self.value,
            expected=self.expected,
            has_value=self._has_value,
        )


class ArgumentError(SpecError):
    """A bad value of a library function's argument: ``argument: got value; expected ...``.

    ``argument`` is the name a Python caller passed it as (``strategy``, ``zero``,
    ``profiles``, ``seq_len``); the command line reports it under its own flag
    (``with_source("--strategy")``), so library messages never mention flags."""

    def __init__(
        self, *, argument: str, expected: str, value: object = None, has_value: bool = True
    ) -> None:
        super().__init__(
            source=argument, field="", expected=expected, value=value, has_value=has_value
        )
        self.argument = argument


class RunFailedError(RuntimeError):
    """A run that failed while running, not through bad input: a worker killed by a
    signal, or a worker's exception other than a :class:`SpecError`. Its message is one
    line (which rank, what happened, and the newest checkpoint to resume from, where the
    run writes checkpoints); the CLI prints it alone and exits 1."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class ModelWarning(UserWarning):
    """A model file's setting that piebald reads but does not model, so training differs
    from what the file describes (dropout: piebald trains without it). The message is one
    line naming the file, the fields and their values."""


def error_fields(error: SpecError) -> dict[str, object]:
    """JSON-serialisable keyword arguments that rebuild ``error`` (in another process)."""
    return {
        "source": error.source,
        "field": error.field,
        "value": error.value if isinstance(error.value, (str, int, float)) else _short(error.value),
        "expected": error.expected,
        "has_value": error._has_value,
    }
