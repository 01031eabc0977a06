"""A strategy, a ZeRO mode, a tensor-parallel degree and recompute modes chosen as a user
gives them (``piebald.plan``'s ``strategy=``, ``zero=``, ``tensor_parallel=`` and
``recompute=``, the CLI's ``--strategy``, ``--zero``, ``--tensor-parallel`` and
``--recompute``).

Errors are :class:`~piebald.errors.ArgumentError` naming the argument (``strategy``,
``zero``, ``tensor_parallel``, ``recompute``); the command line reports them under its
flags.
"""

from __future__ import annotations

from collections.abc import Sequence

from piebald.errors import ArgumentError
from piebald.planner.strategies import (
    STRATEGIES,
    Strategy,
    with_recompute,
    with_tensor_parallel,
    with_zero_mode,
)
from piebald.specs.cluster import ClusterSpec
from piebald.specs.fields import suggest
from piebald.specs.model import ModelSpec
from piebald.specs.plan import TENSOR_PARALLEL_DEGREES, ZeroMode, tensor_split_problem
from piebald.specs.recompute import Recompute

__all__ = [
    "check_tensor_parallel_fits",
    "recompute_modes",
    "strategy_named",
    "tensor_parallel_degree",
    "zero_mode_named",
]


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


def check_tensor_parallel_fits(
    degree: int | None, *, cluster: ClusterSpec, model: ModelSpec
) -> None:
    """That every stage at tensor-parallel ``degree`` (:func:`tensor_parallel_degree`) can
    exist at all: the model's blocks split that many ways, and some node holds a tensor
    group (its GPUs sit in one node). Without this the search finds nothing and reports
    memory as the reason."""
    if degree is None or degree == 1:
        return
    problem = tensor_split_problem(model.arch, degree)
    if problem is not None:
        raise ArgumentError(
            argument="tensor_parallel", value=degree, expected=f"{problem}, for {model.name}"
        )
    largest = max(group.gpus_per_node for group in cluster.node_groups)
    if largest < degree:
        raise ArgumentError(
            argument="tensor_parallel",
            value=degree,
            expected=f"at most {largest}: a tensor group sits inside one node, and the "
            f"largest node of cluster {cluster.name} has {largest} GPUs",
        )


def recompute_modes(
    value: str | Sequence[str | Recompute] | None, *, strategy: Strategy
) -> tuple[Recompute, ...] | None:
    """``value`` -- one mode, several comma-separated, or a sequence of them -- as the
    recompute modes ``strategy`` may give its stages; None stays None."""
    if value is None:
        return None
    names = [part.strip() for part in value.split(",")] if isinstance(value, str) else value
    modes = [mode.value for mode in Recompute]
    if not names or any(name not in modes for name in names):
        raise ArgumentError(
            argument="recompute",
            value=value if isinstance(value, str) else ",".join(map(str, value)),
            expected=f"one or more of {modes}, comma-separated",
        )
    chosen = tuple(dict.fromkeys(Recompute(name) for name in names))
    if with_recompute(strategy, chosen) is None:
        allowed = [mode.value for mode in strategy.stage_rules.recompute]
        raise ArgumentError(
            argument="recompute",
            value=",".join(mode.value for mode in chosen),
            expected=f"modes strategy {strategy.name} can use: {allowed}",
        )
    return chosen
