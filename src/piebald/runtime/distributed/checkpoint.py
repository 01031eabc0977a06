"""Atomic, sharded checkpoints of the owned training state, keyed by global parameter names.

Layout of a checkpoint directory ``DIR/step-00000042/``:

* ``rank-00003.pt`` — what rank 3 owns: per bucket its shard range, fp32 master shard and
  Adam moments, plus the rank's torch RNG state (``torch.save``, loaded with
  ``weights_only=True``);
* ``manifest.json`` — written last, by one rank: the training step, Adam's update count,
  the loss-scaler state, caller extras, and per rank its file's size and SHA-256 and the
  **pieces** it holds: ``[global name, offset in the flattened parameter, offset in the
  shard, element count]`` (:mod:`piebald.runtime.distributed.flat_layout`), with every
  parameter's whole shape and, for the parameters it holds a tensor-parallel slice of,
  that slice: ``slices: {name: [dim, chunks, degree, position]}``; and ``checksum``, the
  SHA-256 of all of that (``_content_sha256``), so an edited or damaged manifest is
  refused instead of resuming at the wrong step.

A checkpoint is therefore just slices of named flat tensors: :func:`load_checkpoint`
assembles each rank's new shard from whichever saved pieces overlap it, so the same plan
reloads bit for bit and a plan that cuts stages and shards differently reloads too.

Tensor-parallel slices keep that promise in whole-tensor coordinates. A piece of a sliced
parameter is a range of the member's slice, flattened; its ``[dim, chunks, degree,
position]`` (:class:`piebald.runtime.distributed.tensor_slice.TensorSlice`) is a compact
index map of where every element of the slice lies in the whole. A loading rank holding
the same slice (or the whole, from a whole) intersects ranges as before; otherwise it
maps both its own range and each saved piece to whole-tensor indices and matches them
(``_Matcher``). So a checkpoint of a TP 2 plan resumes at TP 1, TP 4 or other stages,
and the reverse. Why not gather each split parameter whole before writing: the slices of
one parameter are owned by ranks of different data-parallel groups, so gathering would
need a collective per parameter and, on some rank, the whole parameter's master and
moments at once. Writing each owner's piece as it is costs nothing more at save time, the
same plan still reloads by ranges, and only a load under another slicing pays for the
index maps: host int64 indices of the order of one whole parameter (8 bytes an element),
one parameter at a time.

Atomicity: every rank writes into ``DIR/.tmp-step-00000042/``; after all files are on disk
(fsync, then a barrier) one rank writes the manifest and renames the directory into
place. A directory named ``step-*`` is therefore always complete, and the previous
checkpoint is untouched until the new one is (older ones are pruned only afterwards, when
``keep_last`` asks for it). All ranks must see ``DIR`` on a shared file system.

A missing, truncated or corrupt checkpoint raises one :class:`piebald.errors.SpecError`
naming the path and what is wrong, on every rank (ranks agree on the verdict before any
collective, so none is left waiting). A manifest is corrupt when its checksum does not
match its content, when a ``step-N`` directory's manifest says another step, or when its
numbers are impossible (a negative step); the error then names the newest intact older
checkpoint in the same directory, if there is one.

The founding design suggested ``torch.distributed.checkpoint`` with ``ShardedTensor`` adapters; this
module writes its own small format instead because it needs exact control of atomic
renames, per-file checksums for a one-line corruption error, and empty shards (a shard
fraction of 0), and because resharding slices of flat tensors takes a dozen lines.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import torch
import torch.distributed as dist

from piebald.errors import SpecError, error_fields
from piebald.outputs import make_run_directory, open_run_file, rename_no_replace, write_error
from piebald.runtime.distributed.groups import CommGroup
from piebald.runtime.distributed.optimizer import ShardedOptimizer
from piebald.runtime.distributed.tensor_slice import TensorSlice
from piebald.specs.job import Optimizer

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointInfo",
    "checkpoint_name",
    "checkpoint_step",
    "find_latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "newest_intact_before",
    "read_checkpoint_info",
    "save_checkpoint",
    "verify_checkpoint",
]

logger = logging.getLogger(__name__)

# 2: the manifest carries the checksum of its content; 3: and tensor-parallel slices, and
# whole shapes for them. A format 2 checkpoint is a format 3 one without slices.
CHECKPOINT_FORMAT = 3
_READABLE_FORMATS = (2, 3)
MANIFEST = "manifest.json"
_PREFIX = "step-"
_TMP_PREFIX = ".tmp-"
_HASH_CHUNK_BYTES = 1 << 22


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointInfo:
    path: Path
    step: int  # training steps completed when it was saved
    num_updates: int  # optimizer updates applied (steps skipped by the loss scaler excluded)
    extra: Mapping[str, Any] = field(default_factory=dict)
    run_id: str | None = None  # the run that wrote it (None: written before runs had ids)


def checkpoint_name(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def checkpoint_step(path: Path) -> int | None:
    """The step a ``step-NNNNNNNN`` directory's name says, or None for any other name."""
    suffix = path.name.removeprefix(_PREFIX)
    is_step = path.name.startswith(_PREFIX) and suffix.isascii() and suffix.isdigit()
    return int(suffix) if is_step else None


def list_checkpoints(directory: Path) -> list[Path]:
    """The complete-looking checkpoints (``step-*`` with a manifest) under ``directory``,
    oldest first; empty when it is not a directory."""
    if not directory.is_dir():
        return []
    found = [
        (step, path)
        for path in directory.iterdir()
        if (step := checkpoint_step(path)) is not None and (path / MANIFEST).is_file()
    ]
    return [path for _, path in sorted(found)]


def find_latest_checkpoint(directory: Path) -> Path | None:
    """The complete checkpoint with the highest step under ``directory``, if any."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _all_gather_objects(obj: object, group: CommGroup) -> list[Any]:
    if group.size == 1:
        return [obj]
    everyone: list[Any] = [None] * group.size
    dist.all_gather_object(everyone, obj, group=group.process_group)
    return everyone


# --- save -------------------------------------------------------------------------------------


def _rank_entry(
    optimizer: ShardedOptimizer, *, rank: int, slices: Mapping[str, TensorSlice]
) -> dict[str, Any]:
    buckets: dict[str, Any] = {}
    params: dict[str, list[int]] = {}
    held: dict[str, list[int]] = {}
    for bucket in optimizer.buckets:
        buckets[bucket.name] = {
            "start": bucket.shard.start,
            "end": bucket.shard.end,
            "pieces": [
                [p.name, p.param_offset, p.buffer_offset - bucket.shard.start, p.numel]
                for p in bucket.pieces
            ],
        }
        for slot in bucket.layout.slots:
            part = slices.get(slot.name)
            params[slot.name] = list(part.whole_shape(slot.shape) if part else slot.shape)
            if part is not None:
                held[slot.name] = [part.dim, part.chunks, part.degree, part.position]
    return {
        "rank": rank,
        "file": _rank_file(rank),
        "buckets": buckets,
        "params": params,
        "slices": held,
    }


def save_checkpoint(
    directory: Path,
    *,
    step: int,
    optimizer: ShardedOptimizer,
    group: CommGroup,
    rank: int,
    extra: Mapping[str, Any] | None = None,
    keep_last: int | None = None,
    slices: Mapping[str, TensorSlice] | None = None,
    run_id: str | None = None,
) -> Path:
    """Write ``directory/step-NNNNNNNN`` atomically; collective over ``group`` (every rank
    the plan uses). ``extra`` must be JSON-serialisable (data position, plan digest, ...).
    ``slices``: the tensor-parallel slice this rank holds of each split parameter, by
    global name (``TensorSplit.slices``; none: every parameter is held whole). ``run_id``
    (the leader's is written): the run the checkpoint belongs to, which its metrics file
    names too (``CheckpointInfo.run_id``). Returns the checkpoint's path on every rank.

    Files are opened with :func:`piebald.outputs.open_run_file` (no link followed, none
    replaced). Whatever stands under ``step-NNNNNNNN`` already was not made by this run
    (a resumed run sets its newer checkpoints aside first): it is renamed
    ``foreign-step-NNNNNNNN`` (a free variant of that name), reported in one warning line,
    never deleted. An OS error on any rank (a full disk) is the same one-line
    :class:`~piebald.outputs.OutputError` naming ``--checkpoint-dir`` on every rank; the
    temporary directory is removed and the older checkpoints are untouched."""
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last = {keep_last}; expected >= 1 or None")
    if step < 0:
        raise ValueError(f"step = {step}; expected >= 0")
    leader = group.ranks[0]
    final = directory / checkpoint_name(step)
    tmp = directory / f"{_TMP_PREFIX}{checkpoint_name(step)}"
    verdict = None
    if rank == leader:
        verdict = _attempt(lambda: _fresh_directory(tmp), directory=directory)
    _agree(_all_gather_objects(verdict, group))

    entry = _rank_entry(optimizer, rank=rank, slices=slices or {})
    state = {
        "format": CHECKPOINT_FORMAT,
        "rank": rank,
        "buckets": {
            name: {key: tensor.detach().cpu() for key, tensor in tensors.items()}
            for name, tensors in optimizer.shard_states().items()
        },
        "rng": torch.get_rng_state(),
    }
    path = tmp / entry["file"]

    def write_shard() -> None:
        with os.fdopen(open_run_file(path, "create", flag=_FLAG), "wb") as f:
            _save_tensors(state, f)
            f.flush()
            os.fsync(f.fileno())
        entry["bytes"] = path.stat().st_size
        entry["sha256"] = _sha256(path)

    failure = _attempt(write_shard, directory=directory)
    entries = _all_gather_objects(entry if failure is None else {"error": failure}, group)
    failures = [e["error"] for e in entries if "error" in e]
    if failures:
        if rank == leader:
            _remove_temporary(tmp)
        raise SpecError(**failures[0])

    verdict = None
    if rank == leader:
        manifest: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "num_updates": optimizer.num_updates,
            "loss_scaler": (
                optimizer.loss_scaler.state_dict() if optimizer.loss_scaler is not None else None
            ),
            "extra": dict(extra or {}),
            "ranks": entries,
        }
        if run_id is not None:
            manifest["run_id"] = run_id
        manifest["checksum"] = _content_sha256(manifest)

        def finish() -> None:
            with os.fdopen(open_run_file(tmp / MANIFEST, "create", flag=_FLAG), "w") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            _install(tmp, final)

        verdict = _attempt(finish, directory=directory)
        if verdict is not None:
            _remove_temporary(tmp)
        elif keep_last is not None:
            _prune(directory, keep=keep_last)
    _agree(_all_gather_objects(verdict, group))
    logger.info("checkpoint step %d written to %s", step, final)
    return final


def _save_tensors(state: object, stream: BinaryIO) -> None:
    """``torch.save`` into ``stream``; an OS error while writing (a full disk), which torch
    reports as a RuntimeError about stream positions, is raised as the OSError it is."""
    failures: list[OSError] = []

    class Recording:
        def write(self, data: bytes) -> int:
            try:
                return stream.write(data)
            except OSError as error:
                failures.append(error)
                raise

        def flush(self) -> None:
            stream.flush()

    try:
        torch.save(state, Recording())  # type: ignore[arg-type]  # write and flush suffice
    except RuntimeError:
        if failures:
            raise failures[0] from None
        raise


_FLAG = "--checkpoint-dir"
_FOREIGN_PREFIX = "foreign-"


def _attempt(work: Callable[[], object], *, directory: Path) -> dict[str, object] | None:
    """Run ``work``; None when it succeeded, else its one-line error's fields (an OS error
    as the ``--checkpoint-dir DIRECTORY`` line), told to every rank before anyone raises."""
    try:
        work()
    except SpecError as error:
        return error_fields(error)
    except OSError as error:
        return error_fields(write_error(error, flag=_FLAG, path=directory))
    return None


def _agree(verdicts: Sequence[dict[str, object] | None]) -> None:
    """Raise the first rank's error on every rank, so none waits for a failed one."""
    for fields in verdicts:
        if fields is not None:
            raise SpecError(**fields)  # type: ignore[arg-type]  # error_fields' keywords


def _fresh_directory(tmp: Path) -> None:
    """``tmp`` as a new, empty directory: one left by a save that crashed (the lock keeps
    other runs out) is removed; anything but a directory there is set aside."""
    info = _lstat(tmp)
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(tmp)
        else:
            _set_aside(tmp)
    make_run_directory(tmp, flag=_FLAG, new=True)


def _remove_temporary(tmp: Path) -> None:
    info = _lstat(tmp)
    if info is not None and stat.S_ISDIR(info.st_mode):
        shutil.rmtree(tmp, ignore_errors=True)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None


def _set_aside(path: Path) -> Path:
    """Rename ``path``, which this run did not make, to a free ``foreign-NAME`` and say so."""
    number = 1
    while True:
        suffix = "" if number == 1 else f".{number}"
        aside = path.with_name(f"{_FOREIGN_PREFIX}{path.name}{suffix}")
        try:
            rename_no_replace(path, aside)
            break
        except FileExistsError:
            number += 1
    logger.warning(
        "%s: was not made by this run (a file or directory that appeared under a "
        "checkpoint's name); moved aside to %s, nothing deleted",
        path,
        aside.name,
    )
    return aside


def _install(tmp: Path, final: Path) -> None:
    """Rename the complete ``tmp`` into place, never onto anything: whatever is at
    ``final`` (not made by this run) is set aside first (``_set_aside``)."""
    while True:
        if _lstat(final) is not None:
            _set_aside(final)
        try:
            rename_no_replace(tmp, final)
            break
        except FileExistsError:  # appeared again in between: set that aside too
            continue
    _fsync_dir(final.parent)


def _prune(directory: Path, *, keep: int) -> None:
    for path in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(path)


def _content_sha256(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the manifest without its ``checksum`` key, in one canonical JSON form
    (sorted keys, no spaces): what was written is what is checked, whatever the indent."""
    content = {key: value for key, value in manifest.items() if key != "checksum"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- load -------------------------------------------------------------------------------------


def _fail(path: Path, field_name: str, value: object, expected: str) -> SpecError:
    return SpecError(source=str(path), field=field_name, value=value, expected=expected)


def _resolve(path: Path) -> Path:
    """The checkpoint ``path`` names: itself, or the latest one under it."""
    if not path.exists():
        raise _fail(path, "", None, "a checkpoint directory (it does not exist)")
    if (path / MANIFEST).is_file():
        return path
    latest = find_latest_checkpoint(path)
    if latest is None:
        raise SpecError(
            source=str(path),
            field=MANIFEST,
            expected="a checkpoint directory with manifest.json, or a directory "
            "holding step-* checkpoints (none is complete here)",
            has_value=False,
        )
    return latest


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_content(manifest_path: Path, manifest: dict[str, Any]) -> None:
    """The manifest is what ``save_checkpoint`` wrote for this directory: its checksum
    matches, its step is the directory's, and its numbers are possible."""
    if manifest.get("checksum") != _content_sha256(manifest):
        raise _fail(
            manifest_path,
            "checksum",
            manifest.get("checksum"),
            "the SHA-256 of the manifest's content (the manifest was edited or damaged)",
        )
    step = manifest.get("step")
    if not _is_count(step):
        raise _fail(manifest_path, "step", step, "a step count >= 0")
    named = checkpoint_step(manifest_path.parent)
    if named is not None and named != step:
        raise _fail(
            manifest_path,
            "step",
            step,
            f"{named}, the step of its directory {manifest_path.parent.name}",
        )
    num_updates = manifest.get("num_updates")
    if not _is_count(num_updates):
        raise _fail(manifest_path, "num_updates", num_updates, "a count of updates >= 0")
    ranks = manifest.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise _fail(manifest_path, "ranks", ranks, "a list of the ranks' shard files")
    for entry in ranks:
        rank = entry.get("rank") if isinstance(entry, dict) else None
        if not _is_count(rank) or entry.get("file") != _rank_file(rank):
            raise _fail(manifest_path, "ranks", entry, "entries naming rank-NNNNN.pt files")
        if not _is_count(entry.get("bytes")) or not isinstance(entry.get("sha256"), str):
            raise _fail(manifest_path, f"ranks[{rank}]", entry, "the shard file's size and SHA-256")


def _read_manifest(path: Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint ``path`` names (itself, or the latest one under it) and its
    manifest, checked against its checksum and its directory."""
    path = _resolve(path)
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _fail(
            manifest_path, "", type(error).__name__, "a readable JSON manifest (corrupt?)"
        ) from None
    except RecursionError:
        raise _fail(
            manifest_path, "", "nesting too deep", "a manifest written by piebald"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") not in _READABLE_FORMATS:
        raise _fail(
            manifest_path,
            "format",
            manifest.get("format") if isinstance(manifest, dict) else manifest,
            f"checkpoint format {' or '.join(map(str, _READABLE_FORMATS))} (written by "
            "this version of piebald or an earlier one it reads)",
        )
    _check_content(manifest_path, manifest)
    return path, manifest


def _info(path: Path, manifest: Mapping[str, Any]) -> CheckpointInfo:
    extra = manifest.get("extra", {})
    return CheckpointInfo(
        path=path,
        step=int(manifest["step"]),
        num_updates=int(manifest["num_updates"]),
        extra=extra if isinstance(extra, dict) else {},
        run_id=run_id if isinstance(run_id := manifest.get("run_id"), str) else None,
    )


def read_checkpoint_info(path: Path) -> CheckpointInfo:
    """What the checkpoint ``path`` names (itself, or the latest one under it) says about
    itself, once its manifest is intact and every shard file it lists is there at the
    recorded size (their digests are checked when they are loaded). Cheap: for checks
    before a run starts. Raises :class:`SpecError` (naming the newest intact older
    checkpoint when there is one)."""
    try:
        path, manifest = _read_manifest(path)
        for entry in manifest["ranks"]:
            _verify_file(path / entry["file"], entry, digest=False)
    except SpecError as error:
        raise _with_fallback(error, path) from None
    return _info(path, manifest)


def verify_checkpoint(path: Path) -> CheckpointInfo:
    """Like :func:`read_checkpoint_info`, and every shard file's SHA-256 too (reads every
    byte of the checkpoint); no hint about older checkpoints."""
    path, manifest = _read_manifest(path)
    for entry in manifest["ranks"]:
        _verify_file(path / entry["file"], entry)
    return _info(path, manifest)


def newest_intact_before(directory: Path, *, step: int) -> Path | None:
    """The newest checkpoint under ``directory`` older than ``step`` that verifies
    completely (manifest and every shard's digest), if any."""
    for candidate in reversed(list_checkpoints(directory)):
        named = checkpoint_step(candidate)
        if named is None or named >= step:
            continue
        try:
            verify_checkpoint(candidate)
        except SpecError:
            continue
        return candidate
    return None


def _with_fallback(error: SpecError, path: Path) -> SpecError:
    """``error`` about the checkpoint ``path`` (or the latest under it), naming the newest
    intact checkpoint older than the broken one, so a user knows what to resume from."""
    try:
        broken = path if (path / MANIFEST).is_file() else find_latest_checkpoint(path)
    except OSError:
        return error
    step = checkpoint_step(broken) if broken is not None else None
    if broken is None or step is None:
        return error
    older = newest_intact_before(broken.parent, step=step)
    hint = (
        f"; the newest intact older checkpoint is {older} (resume from it with "
        f"--resume-from {older})"
        if older is not None
        else "; no older checkpoint in this directory is intact"
    )
    return SpecError(
        source=error.source,
        field=error.field,
        value=error.value,
        expected=error.expected + hint,
        has_value=bool(error_fields(error)["has_value"]),
    )


def _verify_file(path: Path, entry: Mapping[str, Any], *, digest: bool = True) -> None:
    if not path.is_file():
        raise _fail(path, "", None, "the shard file the manifest lists (it is missing)")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise _fail(
            path, "size", size, f"{entry['bytes']} bytes as the manifest records (truncated?)"
        )
    if digest and _sha256(path) != entry["sha256"]:
        raise _fail(path, "sha256", "a different digest", "the manifest's digest (corrupt?)")


@dataclass(frozen=True, slots=True, kw_only=True)
class _SavedPiece:
    """Elements ``[param_start, param_end)`` of a parameter as the saving rank held it
    (``part``: its tensor-parallel slice; None: the whole), flattened, stored from
    ``shard_offset`` of that rank's shard of ``bucket``."""

    param_start: int
    param_end: int
    rank: int
    bucket: str
    shard_offset: int
    part: TensorSlice | None


def _saved_slices(path: Path, entry: Mapping[str, Any]) -> dict[str, TensorSlice]:
    """The slices a rank's manifest entry says it held (none in format 2)."""
    found: dict[str, TensorSlice] = {}
    for name, fields in entry.get("slices", {}).items():
        try:
            dim, chunks, degree, position = fields
            found[name] = TensorSlice(dim=dim, chunks=chunks, degree=degree, position=position)
        except (TypeError, ValueError):
            raise _fail(
                path / MANIFEST,
                f"ranks[{entry['rank']}].slices.{name}",
                fields,
                "[dim, chunks, degree, position] of a tensor-parallel slice",
            ) from None
    return found


def _index_pieces(path: Path, manifest: Mapping[str, Any]) -> dict[str, list[_SavedPiece]]:
    index: dict[str, list[_SavedPiece]] = {}
    for entry in manifest["ranks"]:
        held = _saved_slices(path, entry)
        for bucket_name, bucket in entry["buckets"].items():
            for name, param_offset, shard_offset, numel in bucket["pieces"]:
                index.setdefault(name, []).append(
                    _SavedPiece(
                        param_start=param_offset,
                        param_end=param_offset + numel,
                        rank=entry["rank"],
                        bucket=bucket_name,
                        shard_offset=shard_offset,
                        part=held.get(name),
                    )
                )
    return index


# Where a match's elements are: a range, or (tensor-parallel slices in other coordinates)
# the index of each element.
_Where = slice | torch.Tensor


class _Matcher:
    """Which elements of one loading piece (elements ``[lo, hi)`` of a parameter as
    ``mine`` holds it, flattened) each saved piece of that parameter holds: as ``(where
    in the saved shard, where in the loading piece, how many)`` (module docstring). The
    whole-tensor indices of every slice it meets are made once, for this piece only."""

    def __init__(
        self, *, lo: int, hi: int, mine: TensorSlice | None, whole_shape: Sequence[int]
    ) -> None:
        self._lo, self._hi, self._mine, self._whole_shape = lo, hi, mine, whole_shape
        self._indices: dict[TensorSlice, torch.Tensor] = {}
        self._wanted: torch.Tensor | None = None

    def _whole_indices(self, part: TensorSlice | None, start: int, end: int) -> torch.Tensor:
        """Elements ``[start, end)`` of ``part`` (flattened), as indices of the whole."""
        if part is None:
            return torch.arange(start, end, dtype=torch.int64)
        if part not in self._indices:
            self._indices[part] = part.flat_indices(self._whole_shape)
        return self._indices[part][start:end]

    def match(self, saved: _SavedPiece) -> tuple[_Where, _Where, int] | None:
        lo, hi = self._lo, self._hi
        if saved.part == self._mine:  # one coordinate system: ranges intersect
            start, end = max(lo, saved.param_start), min(hi, saved.param_end)
            if start >= end:
                return None
            src = saved.shard_offset + start - saved.param_start
            return slice(src, src + end - start), slice(start - lo, end - lo), end - start
        if (
            self._mine is not None
            and saved.part is not None
            and self._mine.disjoint_from(saved.part)
        ):
            return None
        if self._wanted is None:
            self._wanted = self._whole_indices(self._mine, lo, hi)
        wanted = self._wanted
        held = self._whole_indices(saved.part, saved.param_start, saved.param_end)
        if wanted[-1] < held[0] or held[-1] < wanted[0]:
            return None
        # Both increasing (``tensor_slice``): a binary search finds each wanted element.
        at = torch.searchsorted(held, wanted).clamp_(max=held.numel() - 1)
        hit = held[at] == wanted
        count = int(hit.sum().item())
        if count == 0:
            return None
        return saved.shard_offset + at[hit], hit.nonzero().squeeze(1), count


def _assemble(
    path: Path,
    manifest: Mapping[str, Any],
    optimizer: ShardedOptimizer,
    *,
    rank: int,
    slices: Mapping[str, TensorSlice],
) -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor | None]:
    """This rank's new shards from the saved pieces that overlap them, and its RNG state."""
    entries = {entry["rank"]: entry for entry in manifest["ranks"]}
    saved_shapes: dict[str, list[int]] = {}
    for entry in entries.values():
        saved_shapes.update(entry["params"])
    index = _index_pieces(path, manifest)
    adam = optimizer.config.kind is Optimizer.ADAMW
    keys = ("master", "exp_avg", "exp_avg_sq") if adam else ("master",)

    loaded: dict[int, dict[str, Any]] = {}

    def rank_state(saved_rank: int) -> dict[str, Any]:
        if saved_rank not in loaded:
            file = path / entries[saved_rank]["file"]
            _verify_file(file, entries[saved_rank])
            try:
                loaded[saved_rank] = torch.load(file, map_location="cpu", weights_only=True)
            except Exception as error:
                raise _fail(file, "", type(error).__name__, "a readable shard file") from None
        return loaded[saved_rank]

    states: dict[str, dict[str, torch.Tensor]] = {}
    for bucket in optimizer.buckets:
        shard_master = bucket.master[bucket.shard_in_stepped]
        out = {key: torch.zeros_like(shard_master) for key in keys}
        covered = 0
        for piece in bucket.pieces:
            mine = slices.get(piece.name)
            local_shape = bucket.layout.slot(piece.name).shape
            shape = list(mine.whole_shape(local_shape) if mine is not None else local_shape)
            if saved_shapes.get(piece.name) != shape:
                raise _fail(
                    path,
                    f"parameter {piece.name}",
                    saved_shapes.get(piece.name),
                    f"shape {shape} as the model has it (a checkpoint of another model?)",
                )
            lo, hi = piece.param_offset, piece.param_offset + piece.numel
            matcher = _Matcher(lo=lo, hi=hi, mine=mine, whole_shape=shape)
            base = piece.buffer_offset - bucket.shard.start
            for saved in index.get(piece.name, []):
                found = matcher.match(saved)
                if found is None:
                    continue
                src, dst, count = found
                source = rank_state(saved.rank)["buckets"][saved.bucket]
                for key in keys:
                    if key not in source:
                        raise _fail(
                            path / entries[saved.rank]["file"],
                            key,
                            None,
                            "Adam moments (the checkpoint was saved with another optimizer)",
                        )
                    out[key][base : base + piece.numel][dst] = source[key][src]
                covered += count
        if covered != shard_master.numel():
            raise _fail(
                path,
                f"bucket {bucket.name}",
                f"{covered} of {shard_master.numel()} elements",
                "every element of this rank's shard saved by some rank",
            )
        states[bucket.name] = out
    own = rank_state(rank)["rng"] if rank in entries and optimizer.buckets else None
    return states, own


def load_checkpoint(
    path: Path,
    *,
    optimizer: ShardedOptimizer,
    group: CommGroup,
    rank: int,
    slices: Mapping[str, TensorSlice] | None = None,
) -> CheckpointInfo:
    """Load ``path`` (a checkpoint, or a directory of them: the latest complete one) into
    ``optimizer``'s shards and all-gather the parameters. Collective over ``group``.
    ``slices``: as for :func:`save_checkpoint`, what this rank holds now (the checkpoint
    may have been written under other slices or none). Any rank's problem is raised as a
    :class:`SpecError` on every rank."""
    error: SpecError | None = None
    info: CheckpointInfo | None = None
    states: dict[str, dict[str, torch.Tensor]] = {}
    rng: torch.Tensor | None = None
    try:
        path, manifest = _read_manifest(path)
        states, rng = _assemble(path, manifest, optimizer, rank=rank, slices=slices or {})
        info = _info(path, manifest)
        scaler = manifest.get("loss_scaler")
        if (scaler is None) != (optimizer.loss_scaler is None):
            raise _fail(
                path / MANIFEST,
                "loss_scaler",
                scaler,
                "a loss-scaler state exactly when training uses one (fp16)",
            )
    except SpecError as caught:
        error = _with_fallback(caught, path)
    except Exception as caught:  # any rank's surprise must not leave the others waiting
        error = _with_fallback(
            _fail(path, "", repr(caught), "a checkpoint written by piebald (corrupt?)"), path
        )
    # Agree on the verdict before any collective, and raise the same line everywhere.
    verdict = None if error is None else error_fields(error)
    verdicts = _all_gather_objects(verdict, group)
    if error is not None:
        raise error
    for fields in verdicts:
        if fields is not None:
            raise SpecError(**fields)
    assert info is not None
    optimizer.load_shard_states(states, num_updates=info.num_updates)
    if optimizer.loss_scaler is not None:
        optimizer.loss_scaler.load_state_dict(manifest["loss_scaler"])
    if rng is not None:
        torch.set_rng_state(rng)
    logger.info("checkpoint step %d loaded from %s", info.step, info.path)
    return info
