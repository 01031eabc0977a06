"""Live processes as ``/proc`` lists them, for the tests that check what a run leaves
behind (tests/conftest.py puts this on the path). Linux only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Process:
    pid: int
    ppid: int
    session: int


def live_processes() -> list[Process]:
    """Every process that has not exited (zombies are already dead): ``/proc/PID/stat``
    gives state, ppid, pgrp and session after the command name, which may hold spaces."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, ppid, _, session = stat[stat.rindex(")") + 2 :].split()[:4]
        if state != "Z":
            found.append(Process(int(entry.name), int(ppid), int(session)))
    return found


def session_members(session_id: int) -> list[int]:
    """The live processes of session ``session_id``."""
    return [p.pid for p in live_processes() if p.session == session_id]


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    return [p.pid for p in live_processes() if p.ppid == pid]
