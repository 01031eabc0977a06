"""ProfileDB: a directory of versioned JSON files, one per measurement, merged by copying.

File names are deterministic: ``<key>--<digest>.json``, where the key part names what was
measured (``compute--A100-80GB--block-llama-h2048-...--s2048--bf16``) and the digest is the
first 12 hex digits of the SHA-256 of the file's canonical JSON. So:

* the same measurement copied twice is the same file (copying is idempotent);
* two runs of the same key on different machines (or days) are two files and both are
  kept, never overwritten, so ``cp dbA/*.json dbB/`` merges without conflict in any order;
* the loader combines the runs of one key: per micro-batch size (or message size), the
  median over the runs that measured it (two runs: their mean), and the union of sizes.

Loading is typed and strict: a stale format version, a field of the wrong type, a key that
does not match the file name, a digest that does not match the content (a hand-edited file)
or corrupt JSON is one :class:`~piebald.errors.SpecError` naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from piebald.errors import SpecError
from piebald.outputs import write_atomic
from piebald.profiler.keys import ComputeKey
from piebald.profiler.records import (
    ComputeProfile,
    LayerTiming,
    NetworkKey,
    NetworkProfile,
    compute_from_dict,
    network_from_dict,
    profile_to_dict,
    profile_type,
)
from piebald.specs.fields import Fields
from piebald.specs.json_file import read_json

__all__ = [
    "ProfileDB",
    "combine_compute_runs",
    "combine_network_runs",
    "content_digest",
    "load_profile_db",
    "merge_profile_dbs",
    "profile_file_name",
    "write_profile",
]

_DIGEST_CHARS = 12


def _numbers_as_floats(value: Any) -> Any:
    """Every number as a float: 8589934592 and 8589934592.0 are one measurement."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping):
        return {key: _numbers_as_floats(item) for key, item in value.items()}
    return [_numbers_as_floats(item) for item in value]


def _canonical(data: Mapping[str, Any]) -> str:
    return json.dumps(_numbers_as_floats(data), sort_keys=True, separators=(",", ":"))


def content_digest(data: Mapping[str, Any]) -> str:
    """The digest a file name carries: of the file's content, canonical JSON."""
    return hashlib.sha256(_canonical(data).encode("utf-8")).hexdigest()[:_DIGEST_CHARS]


def profile_file_name(profile: ComputeProfile | NetworkProfile) -> str:
    return f"{profile.key.file_stem()}--{content_digest(profile_to_dict(profile))}.json"


def write_profile(
    profile: ComputeProfile | NetworkProfile, directory: str | Path, *, flag: str = "--out"
) -> Path:
    """Write ``profile`` into the DB at ``directory`` (``flag`` names it in errors); an
    identical file is left alone."""
    path = Path(directory) / profile_file_name(profile)
    if not path.exists():
        write_atomic(path, json.dumps(profile_to_dict(profile), indent=1) + "\n", flag=flag)
    return path


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileDB:
    """A loaded DB: every run of every key, and the DB's identity (for plans)."""

    root: str
    compute_runs: Mapping[ComputeKey, tuple[ComputeProfile, ...]]
    network_runs: Mapping[NetworkKey, tuple[NetworkProfile, ...]]
    digest: str  # SHA-256 over the sorted file names, which hold their content digests
    num_files: int

    def compute(self, key: ComputeKey) -> ComputeProfile | None:
        """The combined profile of ``key`` (median over runs), or None if never measured."""
        runs = self.compute_runs.get(key)
        return combine_compute_runs(runs) if runs else None

    def network(self, key: NetworkKey) -> NetworkProfile | None:
        runs = self.network_runs.get(key)
        return combine_network_runs(runs) if runs else None

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(sorted({key.device for key in self.compute_runs}))


def _read_json(path: Path) -> Any:
    return read_json(path, expected="a readable JSON file")


def _load_file(path: Path) -> ComputeProfile | NetworkProfile:
    data = _read_json(path)
    fields = Fields(data, source=str(path))
    kind = profile_type(fields.data)
    profile: ComputeProfile | NetworkProfile
    try:
        if kind == "compute":
            profile = compute_from_dict(fields)
        elif kind == "network":
            profile = network_from_dict(fields)
        else:
            raise fields.error("type", fields.data.get("type"), "'compute' or 'network'")
    except ValueError as error:  # an enum or dataclass invariant below the field checks
        if isinstance(error, SpecError):
            raise
        raise SpecError(source=str(path), field="", has_value=False, expected=str(error)) from None
    stem = profile.key.file_stem()
    # The digest of the content as written, not as this version would write it: a file
    # from an older piebald, whose model lacks fields added since, still loads.
    expected_name = f"{stem}--{content_digest(fields.data)}.json"
    if not path.name.startswith(f"{stem}--"):
        raise SpecError(
            source=str(path),
            field="<file name>",
            value=path.name,
            expected=f"a name starting {stem}-- (the file's fields say so); the file was "
            "renamed or its key fields edited",
        )
    if path.name != expected_name:
        raise SpecError(
            source=str(path),
            field="<file name>",
            value=path.name,
            expected=f"{expected_name}: the content digest does not match (the file was "
            "edited after it was written); re-measure, or rename it to that name",
        )
    return profile


def load_profile_db(directory: str | Path) -> ProfileDB:
    """Load every ``*.json`` file directly inside ``directory`` (other files are ignored)."""
    root = Path(directory)
    if not root.is_dir():
        raise SpecError(
            source=str(root),
            field="",
            has_value=False,
            expected="a profile DB directory (made by piebald profile compute / network)",
        )
    compute: dict[ComputeKey, list[ComputeProfile]] = {}
    network: dict[NetworkKey, list[NetworkProfile]] = {}
    names: list[str] = []
    for path in sorted(root.glob("*.json")):
        profile = _load_file(path)
        names.append(path.name)
        if isinstance(profile, ComputeProfile):
            compute.setdefault(profile.key, []).append(profile)
        else:
            network.setdefault(profile.key, []).append(profile)
    digest = hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()
    return ProfileDB(
        root=str(root),
        compute_runs={key: tuple(runs) for key, runs in sorted(compute.items())},
        network_runs={key: tuple(runs) for key, runs in sorted(network.items())},
        digest=digest,
        num_files=len(names),
    )


def _median_or_none(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def combine_compute_runs(runs: Sequence[ComputeProfile]) -> ComputeProfile:
    """One profile from several runs of one key: per micro-batch size, the median of every
    number over the runs that measured that size; the device info of the newest run."""
    assert runs and len({run.key for run in runs}) == 1, "runs of one key"
    if len(runs) == 1:
        return runs[0]
    by_size: dict[int, list[LayerTiming]] = {}
    for run in runs:
        for timing in run.timings:
            by_size.setdefault(timing.micro_batch_size, []).append(timing)
    timings = []
    for size, rows in sorted(by_size.items()):
        timings.append(
            LayerTiming(
                micro_batch_size=size,
                forward_s=statistics.median(t.forward_s for t in rows),
                backward_s=statistics.median(t.backward_s for t in rows),
                backward_recompute_s=_median_or_none(t.backward_recompute_s for t in rows),
                activation_bytes=statistics.median(t.activation_bytes for t in rows),
                activation_recompute_bytes=_median_or_none(
                    t.activation_recompute_bytes for t in rows
                ),
                peak_memory_bytes=statistics.median(t.peak_memory_bytes for t in rows),
                backward_selective_s=_median_or_none(t.backward_selective_s for t in rows),
                activation_selective_bytes=_median_or_none(
                    t.activation_selective_bytes for t in rows
                ),
            )
        )
    newest = max(runs, key=lambda run: run.provenance.created)
    return replace(newest, timings=tuple(timings))


def combine_network_runs(runs: Sequence[NetworkProfile]) -> NetworkProfile:
    """One link profile from several runs: the median time per message size, refitted."""
    from piebald.profiler.fit import fit_alpha_beta  # numpy/scipy only when needed

    assert runs and len({run.key for run in runs}) == 1, "runs of one key"
    if len(runs) == 1:
        return runs[0]
    by_size: dict[float, list[float]] = {}
    for run in runs:
        for size, time_s in zip(run.message_bytes, run.time_s, strict=True):
            by_size.setdefault(size, []).append(time_s)
    sizes = tuple(sorted(by_size))
    times = tuple(statistics.median(by_size[size]) for size in sizes)
    fit = fit_alpha_beta(sizes, times)
    newest = max(runs, key=lambda run: run.provenance.created)
    return replace(
        newest,
        message_bytes=sizes,
        time_s=times,
        latency_s=fit.latency_s,
        bandwidth_bytes_per_s=fit.bandwidth_bytes_per_s,
    )


def merge_profile_dbs(
    sources: Sequence[str | Path], into: str | Path, *, flag: str = "--into"
) -> list[Path]:
    """Copy every profile of ``sources`` into ``into`` (validated first); returns the new
    files. Equal names hold equal content (the digest), so nothing is ever overwritten."""
    copied: list[Path] = []
    target = Path(into)
    for source in sources:
        db_root = Path(source)
        load_profile_db(db_root)  # refuse to merge a broken DB
        for path in sorted(db_root.glob("*.json")):
            destination = target / path.name
            if destination.exists():  # same name: the same JSON content (the digest)
                continue
            write_atomic(destination, path.read_bytes(), flag=flag)
            copied.append(destination)
    return copied
