"""Load a cluster from YAML (the user-facing contract) and write it back for plan files.

The shape is documented in docs/cluster-file.md; sizes and rates carry units.
:func:`cluster_to_dict` writes a mapping that :func:`parse_cluster` reads back to an equal
:class:`ClusterSpec`, so a plan file can embed the cluster it was made for.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from piebald.errors import SpecError
from piebald.specs.cluster import (
    DEFAULT_ETHERNET_LATENCY_S,
    DEFAULT_INTRA_LATENCY_S,
    DEFAULT_RDMA_LATENCY_S,
    ClusterSpec,
    Nic,
    NicKind,
    NodeGroup,
    SiteLink,
)
from piebald.specs.devices import (
    EFFICIENCY_FIELDS,
    DeviceType,
    builtin_catalog,
    device_types_from,
)
from piebald.specs.fields import Fields, suggest
from piebald.specs.limits import MAX_GPUS, MAX_GPUS_PER_NODE, limit_text
from piebald.specs.user_input import read_user_text
from piebald.specs.yaml_bounded import YamlExpansionError, safe_load_bounded

__all__ = [
    "HOST_NAME_RULE",
    "MAX_GPUS",
    "cluster_to_dict",
    "is_host_name",
    "load_cluster",
    "parse_cluster",
]

# Group and host names reach launch scripts unquoted (node names, Slurm node lists): no
# spaces, commas, brackets or line breaks. Always ``fullmatch``: ``$`` in ``re.match``
# also matches before a trailing newline, which would end a line of the script.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")
HOST_NAME_RULE = "a host name of letters, digits, '_', '.' or '-' (at most 253)"
_PLAIN_TEXT = "text without control characters (no line breaks, tabs or NUL)"


def is_host_name(text: str) -> bool:
    """Whether ``text`` is a host name a cluster file or ``launch --hosts`` may give."""
    return _HOST_RE.fullmatch(text) is not None


def _has_control(text: str) -> bool:
    """Whether ``text`` holds a character that is not printable text (Unicode categories C
    and Z other than the space: line and paragraph separators, NUL, tabs, escapes)."""
    return not all(char.isprintable() for char in text)


_GROUP_FIELDS = (
    "name",
    "count",
    "gpu",
    "gpus_per_node",
    "intra_link",
    "intra_latency",
    "nic",
    "ethernet",
    "site",
    "hosts",
)
_TOP_FIELDS = ("name", "gpu_types", "nodes", "sites")

#: A cluster file larger than this is refused unread (32,768 GPUs listed one node a line
#: with every field take a few MiB).
MAX_CLUSTER_FILE_BYTES = 64 << 20


def read_yaml(path: Path) -> Any:
    """Parse a YAML (or JSON) file; unreadable or malformed files become one SpecError.

    The file is read as a user's input file (:mod:`piebald.specs.user_input`): a regular
    file of at most :data:`MAX_CLUSTER_FILE_BYTES`, UTF-8."""
    text = read_user_text(path, source=str(path), max_bytes=MAX_CLUSTER_FILE_BYTES)
    try:
        return safe_load_bounded(text)
    except YamlExpansionError as error:
        raise SpecError(
            source=str(path), field="", has_value=False, expected=f"YAML with {error}"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "syntax error"
        raise SpecError(
            source=str(path), field="", has_value=False, expected=f"valid YAML ({problem}{where})"
        ) from None
    except (ValueError, TypeError, LookupError, AttributeError, RecursionError) as error:
        # PyYAML's constructors raise these for values such as `!!int abc` or the date
        # 2024-02-30, and deeply nested flow collections exhaust the recursion limit.
        raise SpecError(
            source=str(path),
            field="",
            has_value=False,
            expected=f"valid YAML values ({error.__class__.__name__}: {error})",
        ) from None


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster YAML file."""
    file = Path(path)
    return parse_cluster(read_yaml(file), source=str(file))


def _parse_nic(group: Fields, ethernet_bytes_per_s: float) -> Nic:
    if not group.has("nic"):
        return Nic(
            kind=NicKind.ETHERNET,
            bandwidth_bytes_per_s=ethernet_bytes_per_s,
            latency_s=DEFAULT_ETHERNET_LATENCY_S,
        )
    nic = group.sub("nic")
    nic.reject_unknown(("kind", "bandwidth", "latency"))
    kind = NicKind(nic.choice("kind", [kind.value for kind in NicKind]))
    default_latency_s = (
        DEFAULT_ETHERNET_LATENCY_S if kind is NicKind.ETHERNET else DEFAULT_RDMA_LATENCY_S
    )
    latency_s = nic.duration_s("latency") if nic.has("latency") else default_latency_s
    return Nic(
        kind=kind, bandwidth_bytes_per_s=nic.rate_bytes_per_s("bandwidth"), latency_s=latency_s
    )


def _parse_hosts(group: Fields, count: int, seen: set[str]) -> tuple[str, ...]:
    """The group's ``hosts``: one plain host name per node, none named twice in the file."""
    if not group.has("hosts"):
        return ()
    hosts = group.items("hosts")
    if len(hosts) != count:
        raise group.error(
            "hosts", hosts, f"{count} host names, one per node of the group (count: {count})"
        )
    for host in hosts:
        if not isinstance(host, str) or not is_host_name(host):
            raise group.error("hosts", host, HOST_NAME_RULE)
        if host in seen:
            raise group.error("hosts", host, "a host not named before in this file")
        seen.add(host)
    return tuple(hosts)


def _parse_group(
    group: Fields,
    types: dict[str, DeviceType],
    used: set[str],
    total_gpus: int,
    hosts_seen: set[str],
) -> NodeGroup:
    group.reject_unknown(_GROUP_FIELDS)
    name = group.string("name")
    if _NAME_RE.fullmatch(name) is None:
        raise group.error("name", name, "letters, digits, '_', '.' or '-' (it names nodes)")
    if name in used:
        raise group.error("name", name, "a node group name not used before in this file")
    gpu = group.string("gpu")
    if gpu not in types:
        raise group.error(
            "gpu",
            gpu,
            f"a GPU type from the catalog (piebald gpus) or from gpu_types{suggest(gpu, types)}",
        )
    count = group.integer("count", default=1, minimum=1, maximum=MAX_GPUS)
    gpus_per_node = group.integer("gpus_per_node", minimum=1, maximum=MAX_GPUS_PER_NODE)
    if total_gpus + count * gpus_per_node > MAX_GPUS:
        raise group.error("count", count, limit_text(MAX_GPUS, "GPUs in the whole cluster"))
    ethernet = group.rate_bytes_per_s("ethernet", default="10Gb/s")
    intra_latency_s = (
        group.duration_s("intra_latency") if group.has("intra_latency") else DEFAULT_INTRA_LATENCY_S
    )
    if gpus_per_node > 1 or group.has("intra_link"):
        intra = group.rate_bytes_per_s("intra_link")
    else:
        intra = group.rate_bytes_per_s("intra_link", default="16GB/s")  # unused: one GPU
    site = group.string("site", default="default")
    if _has_control(site):
        raise group.error("site", site, _PLAIN_TEXT)
    hosts = _parse_hosts(group, count, hosts_seen)
    return NodeGroup(
        name=name,
        count=count,
        device=types[gpu],
        gpus_per_node=gpus_per_node,
        intra_link_bytes_per_s=intra,
        intra_latency_s=intra_latency_s,
        nic=_parse_nic(group, ethernet),
        ethernet_bytes_per_s=ethernet,
        site=site,
        hosts=hosts,
    )


def _parse_site_links(top: Fields, sites: list[str]) -> tuple[SiteLink, ...]:
    links: list[SiteLink] = []
    for entry in top.sub_list("sites", default_empty=True):
        entry.reject_unknown(("between", "bandwidth", "latency"))
        between = entry.items("between")
        if len(between) != 2 or not all(isinstance(site, str) for site in between):
            raise entry.error("between", between, "two site names, like [dc1, dc2]")
        for site in between:
            if site not in sites:
                raise entry.error(
                    "between",
                    site,
                    f"a site some node group uses, one of {sites}{suggest(site, sites)}",
                )
        if between[0] == between[1]:
            raise entry.error("between", between, "two different sites")
        if any(set(link.sites) == set(between) for link in links):
            raise entry.error("between", between, "one link per pair of sites")
        links.append(
            SiteLink(
                sites=(between[0], between[1]),
                bandwidth_bytes_per_s=entry.rate_bytes_per_s("bandwidth"),
                latency_s=entry.duration_s("latency", default="0s"),
            )
        )
    for index, site_a in enumerate(sites):
        for site_b in sites[index + 1 :]:
            if not any(set(link.sites) == {site_a, site_b} for link in links):
                raise SpecError(
                    source=top.source,
                    field="sites",
                    has_value=False,
                    expected=f"a link between sites {site_a!r} and {site_b!r} "
                    "(nodes in both exist)",
                )
    return tuple(links)


def parse_cluster(data: object, *, source: str) -> ClusterSpec:
    """Validate a parsed cluster mapping; every problem is one SpecError."""
    top = Fields(data, source=source)
    top.reject_unknown(_TOP_FIELDS)
    name = top.string("name")
    if _has_control(name):
        raise top.error("name", name, _PLAIN_TEXT)
    custom = device_types_from(top, "gpu_types")
    for index, type_name in enumerate(custom):
        if _has_control(type_name):
            raise SpecError(
                source=source,
                field=f"gpu_types[{index}].name",
                value=type_name,
                expected=_PLAIN_TEXT,
            )
    types = {**builtin_catalog(), **custom}  # a custom type may redefine a catalog name
    groups: list[NodeGroup] = []
    used: set[str] = set()
    hosts_seen: set[str] = set()
    for group_fields in top.sub_list("nodes", non_empty=True):
        group = _parse_group(
            group_fields, types, used, sum(g.count * g.gpus_per_node for g in groups), hosts_seen
        )
        used.add(group.name)
        groups.append(group)
    # A launch places every node on its host or none: a file naming only some is a mistake.
    named = [group.name for group in groups if group.hosts]
    if named:
        for index, group in enumerate(groups):
            if not group.hosts:
                raise SpecError(
                    source=source,
                    field=f"nodes[{index}].hosts",
                    has_value=False,
                    expected=f"the hosts of this group too (group {named[0]!r} names its "
                    "hosts; name every group's hosts or none)",
                )
    sites = list(dict.fromkeys(group.site for group in groups))
    links = _parse_site_links(top, sites)
    used_custom = tuple(
        device for device in custom.values() if any(group.device is device for group in groups)
    )
    return ClusterSpec(
        name=name, node_groups=tuple(groups), site_links=links, custom_types=used_custom
    )


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s!r}B/s"


def device_to_dict(device: DeviceType) -> dict[str, Any]:
    """A ``gpu_types`` entry :func:`parse_cluster` reads back to an equal type (exact floats)."""
    return {
        "name": device.name,
        "memory": f"{device.memory_bytes!r}B",
        "bf16_tflops": device.bf16_flops / 1e12,
        "fp16_tflops": device.fp16_flops / 1e12,
        "fp32_tflops": device.fp32_flops / 1e12,
        "memory_bandwidth": _rate(device.memory_bandwidth_bytes_per_s),
        **{
            name: getattr(device, name)
            for name in EFFICIENCY_FIELDS
            if getattr(device, name) is not None
        },
    }


def cluster_to_dict(cluster: ClusterSpec) -> dict[str, Any]:
    """A mapping :func:`parse_cluster` reads back to an equal cluster (exact floats)."""
    gpu_types = [device_to_dict(device) for device in cluster.custom_types]
    nodes = [
        {
            "name": group.name,
            "count": group.count,
            "gpu": group.device.name,
            "gpus_per_node": group.gpus_per_node,
            "intra_link": _rate(group.intra_link_bytes_per_s),
            "intra_latency": f"{group.intra_latency_s!r}s",
            "nic": {
                "kind": group.nic.kind.value,
                "bandwidth": _rate(group.nic.bandwidth_bytes_per_s),
                "latency": f"{group.nic.latency_s!r}s",
            },
            "ethernet": _rate(group.ethernet_bytes_per_s),
            "site": group.site,
            **({"hosts": list(group.hosts)} if group.hosts else {}),
        }
        for group in cluster.node_groups
    ]
    sites = [
        {
            "between": list(link.sites),
            "bandwidth": _rate(link.bandwidth_bytes_per_s),
            "latency": f"{link.latency_s!r}s",
        }
        for link in cluster.site_links
    ]
    out: dict[str, Any] = {"name": cluster.name, "nodes": nodes}
    if gpu_types:
        out["gpu_types"] = gpu_types
    if sites:
        out["sites"] = sites
    return out
