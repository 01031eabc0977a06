"""Every file piebald writes for a user goes through here: one policy, one place.

* An existing path is refused unless ``force``; ``force`` replaces only a regular file,
  never a directory, a symbolic link (or what it points to) or a device node.
* Output locations are checked *before* any expensive work (``check_output_file``,
  ``check_output_directory``, ``check_new_directory``): the parent is a directory, or can
  be created below the nearest existing directory, and a file can really be created there
  (a probe file, removed at once: permission bits say nothing to root, /proc or a
  read-only mount).
* Files are written atomically: a temporary file in the same directory, fsync, then a
  rename; without ``force`` the rename itself refuses a path that appeared meanwhile.
* One permission policy: what a plain ``open()`` would give under the current umask
  (0o666 & ~umask; 0o777 & ~umask for executables), never mkstemp's private 0o600.
* Every failure is an :class:`OutputError`: one line naming the flag, the path and the
  reason (the OS's words for an OS error), which the CLI prints with exit code 2.
* A file a run owns while it runs (the checkpoint lock, a manifest, a shard, metrics, an
  exported model's pieces) is opened by :func:`open_run_file`, and the directories it
  makes by :func:`make_run_directory`: never through a symbolic link, never anything but
  a regular file (a directory), and a file said to be new really is (``O_EXCL``).
  :func:`write_error` turns an OS error met while writing (a full disk) into the one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from piebald.errors import SpecError

__all__ = [
    "FORCE_HINT",
    "OutputError",
    "check_appendable_file",
    "check_new_directory",
    "check_output_directory",
    "check_output_file",
    "check_writable_location",
    "file_kind",
    "file_mode",
    "make_run_directory",
    "open_run_file",
    "rename_no_replace",
    "write_atomic",
    "write_error",
]

_PROBE_PREFIX = ".piebald-write-test."


class OutputError(SpecError):
    """An output path piebald will not or cannot write: ``FLAG: got PATH; expected ...``."""

    def __init__(self, *, flag: str, path: str | Path, expected: str) -> None:
        super().__init__(source=flag, field="", value=str(path), expected=expected)
        # The whole path, never shortened as other values are (a path is bounded by the OS
        # and its last part is what the user needs to see); repr keeps it on one line.
        self.args = (f"{flag}: got {str(path)!r}; expected {expected}",)


def file_kind(mode: int) -> str:
    """What the file of ``st_mode`` ``mode`` is, in words ('a named pipe'), for refusals."""
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a parent is a file: reported by the directory check
        return None


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


FORCE_HINT = "pass --force to replace the file"


def _check_replaceable(path: Path, *, flag: str, force: bool, hint: str = FORCE_HINT) -> None:
    """Absent, or (with ``force``) a regular file; anything else is refused. ``hint`` says
    what the user can do instead (commands without --force say something else)."""
    info = _lstat(path)
    if info is None:
        return
    if not force:
        raise OutputError(
            flag=flag,
            path=path,
            expected=f"a path that does not exist yet (it already exists; nothing was "
            f"overwritten; {hint})",
        )
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(
            flag=flag,
            path=path,
            expected=f"a regular file to replace (it is {file_kind(info.st_mode)}; --force "
            "replaces only regular files; nothing was changed)",
        )


def _nearest_existing(directory: Path) -> Path:
    """``directory`` or its nearest ancestor that exists (the one new directories go in)."""
    current = directory.absolute()
    while not os.path.lexists(current) and current != current.parent:
        current = current.parent
    return current


def _probe(directory: Path) -> None:
    """Create and remove a file in ``directory``: the only honest test of writability."""
    handle, name = tempfile.mkstemp(dir=directory, prefix=_PROBE_PREFIX)
    os.close(handle)
    os.unlink(name)


def check_writable_location(directory: str | Path, *, flag: str, path: str | Path) -> None:
    """``directory`` (where ``path`` will go) is a directory that can be written, or can be
    created inside the nearest existing directory; raises :class:`OutputError` otherwise."""
    directory = Path(directory)
    existing = _nearest_existing(directory)
    if not existing.is_dir():
        raise OutputError(
            flag=flag,
            path=path,
            expected=f"a location inside a directory ({existing} is not a directory)",
        )
    try:
        _probe(existing)
    except OSError as error:
        raise OutputError(
            flag=flag,
            path=path,
            expected=f"a location piebald can write (cannot create files in {existing}: "
            f"{_reason(error)})",
        ) from None


def check_output_file(
    path: str | Path, *, flag: str, force: bool = False, hint: str = FORCE_HINT
) -> None:
    """Before any work: ``path`` may be written as a file by ``write_atomic(force=force)``;
    ``hint`` replaces "pass --force ..." in the refusal where a command has no --force."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise OutputError(flag=flag, path=path, expected="a file name, not a directory")
    check_writable_location(path.parent, flag=flag, path=path)
    _check_replaceable(path, flag=flag, force=force, hint=hint)


def check_appendable_file(path: str | Path, *, flag: str) -> None:
    """Before any work: ``path`` is absent or a regular file that can be appended to (a
    resumed run's metrics), in a writable location."""
    path = Path(path)
    check_writable_location(path.parent, flag=flag, path=path)
    info = _lstat(path)
    if info is None:
        return
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(
            flag=flag,
            path=path,
            expected=f"a regular file to append to (it is {file_kind(info.st_mode)})",
        )
    try:
        with path.open("ab"):  # appends nothing: proves the file can be written
            pass
    except OSError as error:
        raise OutputError(
            flag=flag, path=path, expected=f"a file piebald can append to ({_reason(error)})"
        ) from None


def check_output_directory(path: str | Path, *, flag: str) -> None:
    """Before any work: ``path`` is a directory files can be added to (a profile DB, a
    checkpoint or TensorBoard directory), or one that can be created."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(
            flag=flag,
            path=path,
            expected=f"a directory (it is {file_kind(path.lstat().st_mode)})",
        )
    check_writable_location(path, flag=flag, path=path)


def check_new_directory(path: str | Path, *, flag: str) -> None:
    """Before any work: ``path`` does not exist and can be created as a directory (outputs
    that are directories, like ``--save-model``, are never replaced)."""
    path = Path(path)
    check_writable_location(path.parent, flag=flag, path=path)
    info = _lstat(path)
    if info is not None:
        raise OutputError(
            flag=flag,
            path=path,
            expected=f"a path that does not exist yet (it already exists: "
            f"{file_kind(info.st_mode)}; nothing was overwritten; choose another {flag})",
        )


def _umask() -> int:
    """The process's umask. Linux says it in /proc; elsewhere reading it means setting it."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(*, executable: bool = False) -> int:
    """The permission bits a plain ``open()`` (or a compiler, for ``executable``) gives."""
    return (0o777 if executable else 0o666) & ~_umask()


def _libc_renameat2() -> Callable[..., int] | None:
    name = ctypes.util.find_library("c")
    try:
        library = ctypes.CDLL(name, use_errno=True)
        function: Callable[..., int] = library.renameat2
    except (OSError, AttributeError, TypeError):
        return None
    return function


_RENAMEAT2 = _libc_renameat2()
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def rename_no_replace(source: str | Path, target: str | Path) -> None:
    """Rename ``source`` to ``target``, raising FileExistsError when ``target`` exists,
    even when it appeared a moment ago (Linux renameat2 RENAME_NOREPLACE; elsewhere a
    hard link for files, a last check then rename for directories)."""
    source, target = Path(source), Path(target)
    if _RENAMEAT2 is not None:
        done = _RENAMEAT2(
            _AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE
        )
        if done == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # no support: fall back
            raise OSError(code, os.strerror(code), str(target))
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    if source.is_dir():
        os.rename(source, target)
        return
    os.link(source, target)  # fails if target exists: no window
    os.unlink(source)


def _sync_directory(directory: Path) -> None:
    """Make a rename durable. Some file systems cannot open or sync a directory: skip."""
    with contextlib.suppress(OSError):
        handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def write_atomic(
    path: str | Path,
    data: str | bytes,
    *,
    flag: str,
    force: bool = False,
    executable: bool = False,
    hint: str = FORCE_HINT,
) -> None:
    """Write ``data`` to ``path``: checked (``check_output_file``, whose ``hint`` a
    refusal ends with), written to a temporary file beside it, synced, and renamed into
    place, with ``file_mode`` permissions. Without ``force`` a path that appears meanwhile
    is still never replaced."""
    target = Path(path)
    check_output_file(target, flag=flag, force=force, hint=hint)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as error:
        raise OutputError(
            flag=flag, path=target, expected=f"a location piebald can write ({_reason(error)})"
        ) from None
    temporary = Path(name)
    try:
        try:
            with os.fdopen(handle, "wb") as stream:
                os.fchmod(stream.fileno(), file_mode(executable=executable))
                stream.write(payload)
                stream.flush()
                os.fsync(stream.fileno())
            if force:
                _check_replaceable(target, flag=flag, force=True)  # still a regular file?
                os.replace(temporary, target)
            else:
                rename_no_replace(temporary, target)
        except FileExistsError:
            _check_replaceable(target, flag=flag, force=False, hint=hint)  # says it in one line
            raise
        except IsADirectoryError:  # a directory appeared under --force's feet
            _check_replaceable(target, flag=flag, force=True)
            raise
        except OSError as error:
            raise OutputError(
                flag=flag,
                path=target,
                expected=f"a location piebald can write ({_reason(error)})",
            ) from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_directory(target.parent)


def write_error(error: OSError, *, flag: str, path: str | Path) -> OutputError:
    """The one line for an OS error met while writing ``path`` for ``flag``: ``FLAG: got
    PATH; expected a location piebald can write (No space left on device)``."""
    return OutputError(
        flag=flag, path=path, expected=f"a location piebald can write ({_reason(error)})"
    )


RunFileMode = Literal["create", "append", "update", "read"]
_OPEN_FLAGS: dict[str, int] = {
    "create": os.O_WRONLY | os.O_CREAT | os.O_EXCL,  # a new file, never one that exists
    "append": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    "update": os.O_RDWR | os.O_CREAT,
    "read": os.O_RDONLY,
}


def open_run_file(path: str | Path, how: RunFileMode, *, flag: str, mode: int | None = None) -> int:
    """Open a file the run owns and return its descriptor (the caller closes it, e.g. with
    ``os.fdopen``). ``how``: ``"create"`` a new file (``O_EXCL``: refused if anything is
    there already, also a link or a file that appeared a moment ago), ``"append"`` to it
    or ``"update"`` it in place (created when missing), or ``"read"`` it.

    Never follows a symbolic link in the last component (``O_NOFOLLOW``) and never opens
    anything but a regular file (a FIFO, a device or a directory is refused without
    blocking on it). New files get ``mode`` (default :func:`file_mode`). Every refusal and
    OS error is an :class:`OutputError` naming ``flag`` and ``path``; nothing that is there
    is changed by a refusal."""
    path = Path(path)
    flags = _OPEN_FLAGS[how] | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, file_mode() if mode is None else mode)
    except FileExistsError:
        info = _lstat(path)
        kind = file_kind(info.st_mode) if info is not None else "something"
        raise OutputError(
            flag=flag,
            path=path,
            expected=f"a path this run creates (it already exists: {kind}; nothing was "
            "overwritten)",
        ) from None
    except OSError as error:
        info = _lstat(path)
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise _not_regular(path, flag=flag, mode=info.st_mode) from None
        raise write_error(error, flag=flag, path=path) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(path, flag=flag, mode=info.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_regular(path: Path, *, flag: str, mode: int) -> OutputError:
    return OutputError(
        flag=flag,
        path=path,
        expected=f"a regular file of this run (it is {file_kind(mode)}; piebald neither "
        "follows nor writes it; nothing was changed)",
    )


def make_run_directory(path: str | Path, *, flag: str, new: bool = False) -> Path:
    """Create the directory ``path`` (and missing parents) for the run, or with ``new``
    refuse one that exists; an existing ``path`` must be a real directory, not a symbolic
    link to one nor a file. Returns ``path``; failures are :class:`OutputError` lines."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, file_mode(executable=True))
    except FileExistsError:
        info = _lstat(path)
        if new or info is None or not stat.S_ISDIR(info.st_mode):
            kind = file_kind(info.st_mode) if info is not None else "something"
            raise OutputError(
                flag=flag,
                path=path,
                expected=f"a directory this run creates (it already exists: {kind}; "
                "nothing was changed)",
            ) from None
    except OSError as error:
        raise write_error(error, flag=flag, path=path) from None
    return path
