"""The one output helper (``piebald.outputs``): never overwrite without --force, --force
replaces only regular files, output locations are checked before any work, writes are
atomic and get the permissions a plain ``open()`` gives (findings 8, 21, 26, 35)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from piebald.outputs import (
    OutputError,
    check_appendable_file,
    check_new_directory,
    check_output_directory,
    check_output_file,
    make_run_directory,
    open_run_file,
    rename_no_replace,
    write_atomic,
    write_error,
)


def special_file(path: Path) -> Path:
    """A device node (a copy of /dev/null's) where this user may make one, else a FIFO:
    either way something that is not a regular file, made inside the test's directory."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except OSError:
        os.mkfifo(path)
    return path


@pytest.fixture
def umask_027() -> Iterator[int]:
    """An unusual umask for the test (so the mode cannot match by accident), restored."""
    previous = os.umask(0o027)
    try:
        yield 0o027
    finally:
        os.umask(previous)


def test_existing_file_is_refused_and_kept(tmp_path: Path) -> None:
    """Finding 8's class: no --force, no replacing; the refusal names the flag and path."""
    path = tmp_path / "plan.json"
    path.write_text("precious\n")
    with pytest.raises(OutputError) as caught:
        write_atomic(path, "new", flag="--out")
    message = str(caught.value)
    assert message.startswith("--out: got ") and str(path) in message
    assert "already exists" in message and "--force" in message and "\n" not in message
    assert path.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temporary left


def test_force_replaces_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("old\n")
    write_atomic(path, "new\n", flag="--out", force=True)
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_force_never_replaces_a_directory_link_or_device(tmp_path: Path) -> None:
    """Finding 8: `plan --out /dev/full --force` replaced the device node with a file."""
    directory = tmp_path / "dir"
    directory.mkdir()
    (directory / "inside").write_text("kept")
    target = tmp_path / "target.json"
    target.write_text("the link's target\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    device = special_file(tmp_path / "device")
    device_mode = device.lstat().st_mode
    for path, kind in ((directory, "a directory"), (link, "a symbolic link")):
        with pytest.raises(OutputError, match=f"it is {kind}; --force replaces only regular"):
            write_atomic(path, "new", flag="--out", force=True)
    with pytest.raises(OutputError, match="--force replaces only regular files"):
        write_atomic(device, "new", flag="--out", force=True)
    assert (directory / "inside").read_text() == "kept"
    assert link.is_symlink() and target.read_text() == "the link's target\n"
    assert device.lstat().st_mode == device_mode  # still the device node (or FIFO)


def test_a_parent_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    """Finding 26: `--out afile/p.json` printed `[Errno 17] File exists: 'afile'`."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    for deep in (afile / "p.json", afile / "sub" / "p.json"):
        with pytest.raises(OutputError) as caught:
            check_output_file(deep, flag="--out")
        message = str(caught.value)
        assert message.startswith("--out: ") and f"{afile} is not a directory" in message
        assert "Errno" not in message
    assert afile.read_text() == "x"


def test_unwritable_location_is_one_line_with_the_os_reason(tmp_path: Path) -> None:
    """Finding 21: /proc cannot hold new files, whatever the permission bits say to root."""
    with pytest.raises(OutputError) as caught:
        write_atomic("/proc/piebald-test.json", "x", flag="--trace")
    message = str(caught.value)
    assert message.startswith("--trace: got '/proc/piebald-test.json'; expected a location")
    assert "\n" not in message and not Path("/proc/piebald-test.json").exists()
    # The directories that would be created are checked too, below the nearest existing one.
    with pytest.raises(OutputError, match="expected a location piebald can write"):
        check_output_file("/proc/new-dir/deeper/out.json", flag="--out")


def test_new_directories_are_created_only_when_writing(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "out.json"
    check_output_file(path, flag="--out")
    assert not (tmp_path / "a").exists()  # the check leaves nothing behind
    write_atomic(path, "x", flag="--out")
    assert path.read_text() == "x"


def test_written_files_get_the_mode_a_plain_open_gives(tmp_path: Path, umask_027: int) -> None:
    """Finding 35: plans were 0600 (mkstemp) while other outputs followed the umask."""
    plain = tmp_path / "plain"
    with plain.open("w"):
        pass
    written = tmp_path / "written"
    write_atomic(written, "x", flag="--out")
    assert stat.S_IMODE(written.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o640
    replaced = tmp_path / "replaced"
    replaced.write_text("old")
    replaced.chmod(0o600)
    write_atomic(replaced, "x", flag="--out", force=True)
    assert stat.S_IMODE(replaced.stat().st_mode) == 0o640  # the policy, not the old mode
    script = tmp_path / "script.sh"
    write_atomic(script, "#!/bin/sh\n", flag="--out", executable=True)
    assert stat.S_IMODE(script.stat().st_mode) == 0o777 & ~umask_027


def test_rename_never_replaces_what_appeared_meanwhile(tmp_path: Path) -> None:
    """Findings 7 and 8: the final rename itself refuses a path that exists."""
    for make in ("file", "directory", "empty directory"):
        source = tmp_path / f"source-{make}"
        target = tmp_path / f"target-{make}"
        if make == "file":
            source.write_text("mine")
            target.write_text("theirs")
        else:
            source.mkdir()
            (source / "mine").write_text("mine")
            target.mkdir()
            if make == "directory":
                (target / "theirs").write_text("theirs")
        with pytest.raises(FileExistsError):
            rename_no_replace(source, target)
        assert source.exists()
        if make == "file":
            assert target.read_text() == "theirs"
        else:
            assert not (target / "mine").exists()
    rename_no_replace(tmp_path / "source-file", tmp_path / "fresh")
    assert (tmp_path / "fresh").read_text() == "mine"


def test_write_without_force_refuses_a_file_that_appears_during_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check before the work passed; someone creates the path before the rename."""
    import piebald.outputs as outputs

    path = tmp_path / "out.json"
    real_check = outputs.check_output_file

    def check_then_someone_writes(*args: object, **kwargs: object) -> None:
        real_check(*args, **kwargs)  # type: ignore[arg-type]
        path.write_text("theirs")

    monkeypatch.setattr(outputs, "check_output_file", check_then_someone_writes)
    with pytest.raises(OutputError, match="already exists"):
        write_atomic(path, "mine", flag="--out")
    assert path.read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_directory_outputs(tmp_path: Path) -> None:
    """Profile DBs, checkpoint and TensorBoard directories: added to, so they may exist,
    but must be directories (finding 5: a checkpoint dir that is a file)."""
    check_output_directory(tmp_path, flag="--checkpoint-dir")
    check_output_directory(tmp_path / "new" / "deeper", flag="--checkpoint-dir")
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputError, match=r"--checkpoint-dir: .*expected a directory \(it is a"):
        check_output_directory(afile, flag="--checkpoint-dir")
    with pytest.raises(OutputError, match=r"--out: .*is not a directory"):
        check_output_directory(afile / "db", flag="--out")
    with pytest.raises(OutputError, match=r"--out: .*expected a location piebald can write"):
        check_output_directory("/proc/piebald-db", flag="--out")
    # A new directory (--save-model) must not exist at all, whatever it is.
    (tmp_path / "model").mkdir()
    for existing in (tmp_path / "model", afile):
        with pytest.raises(OutputError, match=r"already exists.*choose another --save-model"):
            check_new_directory(existing, flag="--save-model")
    check_new_directory(tmp_path / "fresh-model", flag="--save-model")
    with pytest.raises(OutputError, match=r"--save-model: .*expected a location"):
        check_new_directory("/proc/w.pt", flag="--save-model")


def test_appendable_files(tmp_path: Path) -> None:
    """A resumed run's --metrics: absent or a regular file, never a directory or device."""
    metrics = tmp_path / "metrics.jsonl"
    check_appendable_file(metrics, flag="--metrics")
    metrics.write_text("line\n")
    check_appendable_file(metrics, flag="--metrics")
    assert metrics.read_text() == "line\n"
    with pytest.raises(OutputError, match="a regular file to append to"):
        check_appendable_file(tmp_path, flag="--metrics")


def test_open_run_file_never_follows_a_link_nor_opens_a_special_file(tmp_path: Path) -> None:
    """The helper for files a run owns: a symbolic link (even to a file this user may
    write) or a FIFO is refused in one line naming the flag, and nothing is touched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("VICTIM DATA")
    link = tmp_path / "link"
    link.symlink_to(victim)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for how in ("create", "append", "update", "read"):
        for path in (link, fifo):
            with pytest.raises(OutputError) as caught:
                open_run_file(path, how, flag="--metrics")
            message = str(caught.value)
            assert message.startswith(f"--metrics: got {str(path)!r}") and "\n" not in message
    assert victim.read_text() == "VICTIM DATA"
    with pytest.raises(OutputError, match="a symbolic link"):
        open_run_file(link, "update", flag="--checkpoint-dir")
    with pytest.raises(OutputError, match="it already exists: a file"):
        open_run_file(victim, "create", flag="--checkpoint-dir")
    assert victim.read_text() == "VICTIM DATA"


def test_open_run_file_creates_appends_and_reads(tmp_path: Path, umask_027: int) -> None:
    path = tmp_path / "m.jsonl"
    with os.fdopen(open_run_file(path, "create", flag="--metrics"), "w") as stream:
        stream.write("a\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask_027
    with os.fdopen(open_run_file(path, "append", flag="--metrics"), "w") as stream:
        stream.write("b\n")
    with os.fdopen(open_run_file(path, "read", flag="--metrics")) as stream:
        assert stream.read() == "a\nb\n"
    with pytest.raises(OutputError, match="No such file or directory"):
        open_run_file(tmp_path / "absent", "read", flag="--metrics")


def test_make_run_directory_refuses_links_files_and_with_new_anything(tmp_path: Path) -> None:
    made = make_run_directory(tmp_path / "a" / "b", flag="--checkpoint-dir")
    assert made.is_dir()
    assert make_run_directory(made, flag="--checkpoint-dir") == made  # exists: fine
    with pytest.raises(OutputError, match="it already exists: a directory"):
        make_run_directory(made, flag="--checkpoint-dir", new=True)
    (tmp_path / "link").symlink_to(made)
    (tmp_path / "file").write_text("mine")
    for path in (tmp_path / "link", tmp_path / "file"):
        with pytest.raises(OutputError, match="--checkpoint-dir: got"):
            make_run_directory(path, flag="--checkpoint-dir")
    assert (tmp_path / "file").read_text() == "mine"


def test_write_error_is_one_line_with_the_os_words(tmp_path: Path) -> None:
    error = write_error(OSError(28, os.strerror(28)), flag="--save-model", path=tmp_path / "w")
    assert str(error) == (
        f"--save-model: got {str(tmp_path / 'w')!r}; expected a location piebald can write "
        "(No space left on device)"
    )
