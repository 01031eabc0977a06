"""A strategy, a ZeRO mode and a tensor-parallel degree chosen as a user gives them
(``piebald.plan``'s ``strategy=``, ``zero=`` and ``tensor_parallel=``, the CLI's
``--strategy``, ``--zero`` and ``--tensor-parallel``).

Errors are :class:`~piebald.errors.ArgumentError` naming the argument (``strategy``,
``zero``, ``tensor_parallel``); the command line reports them under its flags.
"""

from __future__ import annotations

from piebald.errors import ArgumentError
from piebald.planner.strategies import (
    STRATEGIES,
    Strategy,
    with_tensor_parallel,
    with_zero_mode,
)
from piebald.specs.fields import suggest
from piebald.specs.plan import TENSOR_PARALLEL_DEGREES, ZeroMode

__all__ = ["strategy_named", "tensor_parallel_degree", "zero_mode_named"]


def strategy_named(name: str) -> Strategy:
    """The strategy called ``name`` (piebald or a baseline)."""
    if name not in STRATEGIES:
        raise ArgumentError(
            argument="strategy",
            value=name,
            expected=f"one of {list(STRATEGIES)}{suggest(name, STRATEGIES)}",
        )
    return STRATEGIES[name]


def zero_mode_named(value: str | ZeroMode | None, *, strategy: Strategy) -> ZeroMode | None:
    """``value`` as a ZeRO mode ``strategy`` can use every stage in; None stays None."""
    if value is None:
        return None
    modes = [m.value for m in ZeroMode]
    if value not in modes:
        raise ArgumentError(argument="zero", value=value, expected=f"one of {modes}")
    mode = ZeroMode(value)
    if with_zero_mode(strategy, mode) is None:
        allowed = [m.value for m in strategy.stage_rules.zero_modes]
        raise ArgumentError(
            argument="zero",
            value=value,
            expected=f"a mode strategy {strategy.name} can use: {allowed}",
        )
    return mode


def tensor_parallel_degree(value: int | None, *, strategy: Strategy, seq_len: int) -> int | None:
    """``value`` as a tensor-parallel degree ``strategy`` can give every stage of a job of
    ``seq_len`` tokens per sequence; None stays None."""
    if value is None:
        return None
    if value not in TENSOR_PARALLEL_DEGREES:
        raise ArgumentError(
            argument="tensor_parallel",
            value=value,
            expected=f"one of {list(TENSOR_PARALLEL_DEGREES)}",
        )
    if with_tensor_parallel(strategy, value) is None:
        raise ArgumentError(
            argument="tensor_parallel",
            value=value,
            expected=f"1: strategy {strategy.name} has no tensor parallelism",
        )
    layout = strategy.stage_rules.layout_at(value)
    if layout.splits_sequence and seq_len % value:
        raise ArgumentError(
            argument="tensor_parallel",
            value=value,
            expected=f"a degree dividing the sequence length ({seq_len}): tensor-parallel "
            f"stages run {layout.value} parallel, each member on 1/t of every sequence",
        )
    return value
