"""YAML ``safe_load`` with aliases bounded: a "billion laughs" file is refused before it
is built.

An alias (``*a``) makes the parser reuse the anchored node, so nine lists of nine
aliases, nested nine deep, are a few hundred bytes that stand for 9^9 values. PyYAML
builds them as shared Python objects (cheap), but anything that walks the value -- a
``repr`` for an error message, a copy, a JSON dump -- walks all 9^9. So before
constructing the document we count the values it stands for, aliases expanded, over the
node graph with each distinct node counted once (linear in the file), and refuse more
than ``MAX_EXPANDED_NODES`` (a cluster file of 131072 GPUs, one host each, has about
ten values per node group and one per host) and recursive aliases (``&a [*a]``), which
would make the value contain itself.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["MAX_EXPANDED_NODES", "YamlExpansionError", "safe_load_bounded"]

MAX_EXPANDED_NODES = 1_000_000


class YamlExpansionError(ValueError):
    """A document whose aliases expand too far, or into themselves."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def expanded_size(root: yaml.Node, *, limit: int = MAX_EXPANDED_NODES) -> int:
    """The number of values ``root`` stands for with every alias expanded; raises
    :class:`YamlExpansionError` past ``limit`` or on an alias inside its own anchor.
    Iterative (no recursion limit) and memoised by node (each node is visited once)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            if total > limit:
                raise YamlExpansionError(
                    f"at most {limit} values with aliases expanded (its aliases expand "
                    f"to more than {limit})"
                )
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YamlExpansionError("no alias inside its own anchor (a value containing itself)")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    return sizes[id(root)]


def safe_load_bounded(text: str) -> Any:
    """``yaml.safe_load(text)``, refusing a document that :func:`expanded_size` refuses."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
