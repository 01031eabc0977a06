"""Property tests for the cluster loader: garbage in gives a SpecError, never anything else.

Three properties: (a) random nested garbage, and random text read as a YAML file, never
raise anything but SpecError; (b) single mutations of a valid cluster mapping (drop a key,
replace a value by garbage, add an unknown key) either parse or raise SpecError; (c) random
valid clusters always parse, with ``num_gpus == sum(count * gpus_per_node)`` and ranks
``0..n-1`` in file order. Integers include huge ones (hundreds of digits) and the YAML
tokens include explicit tags, both of which once escaped the loader.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piebald.errors import SpecError
from piebald.specs.cluster import ClusterSpec, LinkKind
from piebald.specs.cluster_yaml import cluster_to_dict, load_cluster, parse_cluster
from piebald.specs.devices import builtin_catalog

FIELD_NAMES = [
    "name",
    "gpu_types",
    "nodes",
    "sites",
    "count",
    "gpu",
    "gpus_per_node",
    "intra_link",
    "intra_latency",
    "nic",
    "kind",
    "bandwidth",
    "latency",
    "ethernet",
    "site",
    "between",
    "memory",
    "bf16_tflops",
    "fp16_tflops",
    "fp32_tflops",
    "memory_bandwidth",
]
PLAUSIBLE_STRINGS = [
    "A100-80GB",
    "T4",
    "80GiB",
    "200Gb/s",
    "900GB/s",
    "15ms",
    "infiniband",
    "roce",
    "ethernet",
    "dc1",
    "dc2",
    "",
    "-1GB",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(PLAUSIBLE_STRINGS)
)
keys = st.sampled_from(FIELD_NAMES) | st.text(max_size=8) | st.integers(-3, 3) | st.none()
garbage = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5),
    max_leaves=25,
)

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def parses_or_spec_error(data: object) -> ClusterSpec | None:
    """The cluster, or None after a SpecError; any other exception fails the test."""
    try:
        cluster = parse_cluster(data, source="fuzz.yaml")
    except SpecError as error:
        assert "\n" not in str(error)
        assert str(error).startswith("fuzz.yaml")
        return None
    assert cluster.num_gpus == sum(g.count * g.gpus_per_node for g in cluster.node_groups)
    return cluster


# --- (a) garbage ---------------------------------------------------------------------------


@FUZZ
@given(data=garbage)
def test_garbage_gives_only_spec_errors(data: object) -> None:
    parses_or_spec_error(data)


@FUZZ
@given(data=st.dictionaries(st.sampled_from(FIELD_NAMES), garbage, max_size=4))
def test_garbage_under_known_fields_gives_only_spec_errors(data: dict[str, Any]) -> None:
    parses_or_spec_error(data)


YAML_TOKENS = [
    "name: x\n",
    "nodes:\n",
    "sites:\n",
    "gpu_types:\n",
    "  - ",
    "- ",
    "{",
    "}",
    "[",
    "]",
    ", ",
    ": ",
    "\n",
    "  ",
    "name: a",
    "gpu: T4",
    "gpu: A100-80GB",
    "gpus_per_node: 2",
    "count: 3",
    "intra_link: 600GB/s",
    "nic: {kind: roce, bandwidth: 100Gb/s}",
    "site: dc1",
    "between: [dc1, dc2]",
    "bandwidth: 10Gb/s",
    "&a ",
    "*a",
    "!!str ",
    "!!int ",
    "!!float ",
    "!!bool ",
    "!!timestamp ",
    "2024-02-30",
    "'",
    '"',
    "#",
    "~",
    "null",
    "true",
    "1.5",
    "-1",
    "?",
    "|",
    "---\n",
]


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "cluster.yaml"


def load_text_or_spec_error(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    try:
        cluster = load_cluster(path)
    except SpecError as error:
        assert "\n" not in str(error)
        assert str(error).startswith(str(path))
        return
    assert cluster.num_gpus >= 1


@FUZZ
@given(text=st.text(max_size=200))
def test_random_text_file_gives_only_spec_errors(fuzz_file: Path, text: str) -> None:
    load_text_or_spec_error(fuzz_file, text)


@FUZZ
@given(tokens=st.lists(st.sampled_from(YAML_TOKENS), max_size=40))
def test_yaml_like_text_file_gives_only_spec_errors(fuzz_file: Path, tokens: list[str]) -> None:
    load_text_or_spec_error(fuzz_file, "".join(tokens))


# --- (b) mutations of a valid mapping ------------------------------------------------------


def valid_mapping() -> dict[str, Any]:
    """Every section and most optional fields, so mutations reach them all."""
    return {
        "name": "fuzzed",
        "gpu_types": [
            {
                "name": "MyGPU",
                "memory": "24GiB",
                "bf16_tflops": 80,
                "fp16_tflops": 80.0,
                "fp32_tflops": 20,
                "memory_bandwidth": "900GB/s",
            }
        ],
        "nodes": [
            {
                "name": "a",
                "count": 2,
                "gpu": "A100-80GB",
                "gpus_per_node": 4,
                "intra_link": "600GB/s",
                "intra_latency": "5us",
                "nic": {"kind": "infiniband", "bandwidth": "200Gb/s", "latency": "10us"},
                "ethernet": "25Gb/s",
                "site": "dc1",
            },
            {
                "name": "b",
                "gpu": "MyGPU",
                "gpus_per_node": 1,
                "nic": {"kind": "ethernet", "bandwidth": "25Gb/s"},
                "site": "dc2",
            },
        ],
        "sites": [{"between": ["dc1", "dc2"], "bandwidth": "10Gb/s", "latency": "15ms"}],
    }


def paths_in(value: object, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every dict key and list index below ``value``, as paths from the root."""
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for key, child in value.items():
            found.append((*prefix, key))
            found.extend(paths_in(child, (*prefix, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found.append((*prefix, index))
            found.extend(paths_in(child, (*prefix, index)))
    return found


def containers_in(value: object, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every dict (the root included), where an unknown key can be added."""
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        found.append(prefix)
        for key, child in value.items():
            found.extend(containers_in(child, (*prefix, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found.extend(containers_in(child, (*prefix, index)))
    return found


def at(root: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        root = root[step]
    return root


def test_valid_mapping_parses() -> None:
    cluster = parse_cluster(valid_mapping(), source="fuzz.yaml")
    assert cluster.num_gpus == 2 * 4 + 1


@FUZZ
@given(data=st.data())
def test_mutations_parse_or_give_spec_errors(data: st.DataObject) -> None:
    mapping = valid_mapping()
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        operation = data.draw(st.sampled_from(["drop", "replace", "add"]), label="operation")
        if operation == "add":
            path = data.draw(st.sampled_from(containers_in(mapping)), label="container")
            key = data.draw(st.text(min_size=1, max_size=10) | keys, label="key")
            at(mapping, path)[key] = data.draw(garbage, label="value")
            continue
        paths = paths_in(mapping)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths), label="path")
        parent = at(mapping, path[:-1])
        if operation == "drop":
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(garbage, label="value")
    parses_or_spec_error(mapping)


# --- (c) random valid clusters -------------------------------------------------------------

CATALOG = sorted(builtin_catalog())
RATES = ["10Gb/s", "25Gb/s", "100Gb/s", "200Gb/s", "400Gb/s"]


@st.composite
def node_groups(draw: st.DrawFn, index: int) -> dict[str, Any]:
    group: dict[str, Any] = {
        "name": f"g{index}",
        "count": draw(st.integers(1, 4)),
        "gpu": draw(st.sampled_from(CATALOG)),
        "gpus_per_node": draw(st.integers(1, 8)),
        "intra_link": draw(st.sampled_from(["32GB/s", "300GB/s", "900GB/s"])),
        "site": draw(st.sampled_from(["dc1", "dc2", "dc3"])),
    }
    kind = draw(st.sampled_from([None, "infiniband", "roce", "ethernet"]))
    if kind is not None:
        group["nic"] = {"kind": kind, "bandwidth": draw(st.sampled_from(RATES))}
    if draw(st.booleans()):
        group["ethernet"] = draw(st.sampled_from(RATES))
    return group


@st.composite
def valid_clusters(draw: st.DrawFn) -> dict[str, Any]:
    num_groups = draw(st.integers(1, 4))
    groups = [draw(node_groups(index)) for index in range(num_groups)]
    sites = list(dict.fromkeys(group["site"] for group in groups))
    links = [
        {"between": [a, b], "bandwidth": draw(st.sampled_from(RATES)), "latency": "5ms"}
        for a, b in itertools.combinations(sites, 2)
    ]
    out: dict[str, Any] = {"name": "random", "nodes": groups}
    if links:
        out["sites"] = links
    return out


@settings(max_examples=150, deadline=None)
@given(data=valid_clusters(), pair=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)))
def test_random_valid_clusters_parse(data: dict[str, Any], pair: tuple[int, int]) -> None:
    cluster = parse_cluster(data, source="random.yaml")
    groups = data["nodes"]
    expected_num_gpus = sum(group["count"] * group["gpus_per_node"] for group in groups)
    assert cluster.num_gpus == expected_num_gpus
    assert [gpu.rank for gpu in cluster.gpus] == list(range(expected_num_gpus))

    # File order: group by group, node by node, local index 0..gpus_per_node-1.
    expected_order = [
        (group_index, f"{group['name']}-{node}", local)
        for group_index, group in enumerate(groups)
        for node in range(group["count"])
        for local in range(group["gpus_per_node"])
    ]
    actual_order = [
        (gpu.group_index, cluster.nodes[gpu.node_index].name, gpu.local_index)
        for gpu in cluster.gpus
    ]
    assert actual_order == expected_order

    # Any two ranks: intra-node exactly when they share a node, a site link exactly when
    # their groups sit in different sites.
    rank_a, rank_b = (index % expected_num_gpus for index in pair)
    if rank_a != rank_b:
        link = cluster.link_between(rank_a, rank_b)
        same_node = cluster.gpus[rank_a].node_index == cluster.gpus[rank_b].node_index
        different_sites = cluster.group_of(rank_a).site != cluster.group_of(rank_b).site
        assert (link.kind is LinkKind.INTRA_NODE) == same_node
        assert (link.kind is LinkKind.SITE) == (different_sites and not same_node)
        assert link.bandwidth_bytes_per_s > 0

    # Catalog devices only, so the plan-file form reads back to an equal cluster.
    assert parse_cluster(cluster_to_dict(cluster), source="again") == cluster


def test_mutating_the_input_after_parsing_does_not_change_the_cluster() -> None:
    mapping = valid_mapping()
    cluster = parse_cluster(mapping, source="fuzz.yaml")
    mapping["nodes"][0]["count"] = 100
    mapping["nodes"].append({"name": "c", "gpu": "T4", "gpus_per_node": 1})
    assert cluster == parse_cluster(valid_mapping(), source="fuzz.yaml")
    assert cluster.num_gpus == 9
