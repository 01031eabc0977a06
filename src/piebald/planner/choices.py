"""A strategy and a ZeRO mode chosen by name, as a user gives them (``piebald.plan``'s
``strategy=`` and ``zero=``, the CLI's ``--strategy`` and ``--zero``).

Errors are :class:`~piebald.errors.ArgumentError` naming the argument (``strategy``,
``zero``); the command line reports them under its flags.
"""

from __future__ import annotations

from piebald.errors import ArgumentError
from piebald.planner.strategies import STRATEGIES, Strategy, with_zero_mode
from piebald.specs.fields import suggest
from piebald.specs.plan import ZeroMode

__all__ = ["strategy_named", "zero_mode_named"]


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
