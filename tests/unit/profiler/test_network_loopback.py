"""Finding 20: ``profile network --emulate`` opens no socket beyond loopback.

While the emulated measurement runs, a thread reads the listening TCP sockets of this
process and all its descendants from /proc (the kernel's own table, what ``ss -ltnp``
prints) and checks that every one is bound to a loopback address.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from pathlib import Path

import pytest

from piebald.specs.cluster_yaml import parse_cluster

pytestmark = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="reads the socket table from Linux's /proc"
)


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    except OSError:
        pass
    return inodes


def _listening(inodes: set[str]) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket among ``inodes``."""
    found = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] != "0A" or parts[9] not in inodes:  # 0A: LISTEN
                continue
            hex_address, hex_port = parts[1].split(":")
            raw = bytes.fromhex(hex_address)
            # The kernel prints each 32-bit word of the address in host byte order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((str(ipaddress.ip_address(raw)), int(hex_port, 16)))
    return found


@pytest.mark.distributed
def test_finding_20_emulated_network_listens_on_loopback_only() -> None:
    pytest.importorskip("torch")
    from piebald.profiler.measure_network import emulate_network

    cluster = parse_cluster(
        {"name": "pair", "nodes": [
            {"name": "g", "gpu": "T4", "gpus_per_node": 2, "intra_link": "16GB/s"}]},
        source="test",
    )  # fmt: skip
    seen: set[tuple[str, int]] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            pids = _descendants(os.getpid()) | {os.getpid()}
            seen.update(_listening(set().union(*(_socket_inodes(pid) for pid in pids))))
            stop.wait(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        profiles = emulate_network(
            cluster, message_bytes=(2**16,), num_warmup=1, num_repeats=2, max_processes=2
        )
    finally:
        stop.set()
        watcher.join()
    assert profiles
    # gloo's connections listen for the whole run, so the watcher saw them: not vacuous.
    assert seen, "no listening socket seen"
    exposed = {
        (address, port) for address, port in seen if not ipaddress.ip_address(address).is_loopback
    }
    assert not exposed, f"listening beyond loopback: {sorted(exposed)}"
