"""The one writer of files a user keeps (remote_payload/safe_write.py): atomic, durable, never
through a link, never over what opsctl did not write, never into the current directory, and
a bad destination is one line naming it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import subprocess
import sys
import threading
import typing as t
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload import safe_write
from remote_payload.safe_write import MARKER, DestinationRefused, WriteFailed

NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"),
                min_size=1, max_size=60).filter(lambda n: n not in (".", "..")
                                                and len(n.encode()) < 200)


def _leftovers(d: pathlib.Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith((".tmp", ".old")))


@contextlib.contextmanager
def _tmpfs(path: pathlib.Path, options: str) -> t.Iterator[pathlib.Path]:
    path.mkdir()
    rc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                        capture_output=True, check=False).returncode
    if rc != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


# --- single files ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(name=NAMES, data=st.binary(max_size=4096))
def test_any_name_and_content_round_trips_and_leaves_no_temporary_file(tmp_path_factory, name,
                                                                       data):
    d = tmp_path_factory.mktemp("w")
    safe_write.write_bytes(d / name, b"old")
    safe_write.write_bytes(d / name, data)
    assert (d / name).read_bytes() == data
    assert sorted(p.name for p in d.iterdir()) == [name]


def test_a_file_gets_0644_less_the_umask_set_on_its_descriptor(tmp_path):
    safe_write.write_text(tmp_path / "a", "x")
    assert oct((tmp_path / "a").stat().st_mode & 0o777) == oct(0o644 & ~safe_write.umask())
    safe_write.write_text(tmp_path / "s", "x", mode=0o600)
    assert oct((tmp_path / "s").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_at_the_destination_is_refused_and_its_target_untouched(tmp_path, dangling):
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_text("secret")
        victim.chmod(0o600)
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(DestinationRefused, match="symbolic link"):
        safe_write.write_text(tmp_path / "link", "pwned")
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_text() == "secret"
        assert victim.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "link").is_symlink()


def test_a_link_at_an_appended_log_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "log").symlink_to(victim)
    with pytest.raises(DestinationRefused, match="symbolic link"):
        safe_write.append_text(tmp_path / "log", "line\n")
    assert victim.read_text() == "keep\n"
    safe_write.append_text(tmp_path / "real.log", "a\n")
    safe_write.append_text(tmp_path / "real.log", "b\n")
    assert (tmp_path / "real.log").read_text() == "a\nb\n"


@pytest.mark.parametrize("where", ["dir", "device", "trailing-slash"])
def test_a_directory_or_a_device_is_never_replaced_by_a_file(tmp_path, where):
    path = {"dir": str(tmp_path), "device": "/dev/null", "trailing-slash": f"{tmp_path}/x/"}[where]
    with pytest.raises(DestinationRefused):
        safe_write.write_text(path, "x")


def test_a_file_where_a_directory_is_needed_is_one_line_naming_it(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(WriteFailed) as info:
        safe_write.write_text(tmp_path / "f" / "x", "y")
    assert str(info.value) == f"{tmp_path}/f/x: cannot write: {tmp_path}/f is not a directory"
    with pytest.raises(WriteFailed, match="/dev/full is not a directory"):
        safe_write.write_text("/dev/full/x", "y")


def test_a_full_disk_is_a_write_failure_and_the_old_file_stays_whole(tmp_path):
    with _tmpfs(tmp_path / "small", "size=64k") as d:
        safe_write.write_text(d / "f", "old")
        with pytest.raises(WriteFailed) as info:
            safe_write.write_bytes(d / "f", b"x" * (1 << 20))
        assert info.value.errno == errno.ENOSPC
        assert "No space left on device" in str(info.value) and "\n" not in str(info.value)
        assert (d / "f").read_text() == "old"
        assert _leftovers(d) == []


def test_a_read_only_file_system_is_a_write_failure(tmp_path):
    with _tmpfs(tmp_path / "ro", "ro,size=64k") as d:
        with pytest.raises(WriteFailed) as info:
            safe_write.write_text(d / "f", "x")
        assert info.value.errno == errno.EROFS
        with pytest.raises(WriteFailed), safe_write.new_directory(d / "out", kind="export"):
            pass


def test_no_permission_is_a_write_failure(tmp_path):
    d = tmp_path / "locked"
    d.mkdir(mode=0o555)
    d.chmod(0o555)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops root (which ignores modes) and reports what it got
        code = 1
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            safe_write.write_text(d / "f", "x")
        except WriteFailed as exc:
            os.write(write, f"{exc.errno} {exc}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    got = os.read(read, 4096).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0, got
    assert got == f"{errno.EACCES} {d}/f: cannot write: Permission denied"


def test_a_crash_between_the_temporary_write_and_the_rename_leaves_the_old_file_whole(tmp_path):
    target = tmp_path / "record.json"
    safe_write.write_text(target, "old")
    code = ("import os,sys\nfrom remote_payload import safe_write\n"
            "def fill(f):\n    f.write(b'half of the new'); f.flush(); os._exit(9)\n"
            "safe_write.write_with(sys.argv[1], fill)\n")
    rc = subprocess.run([sys.executable, "-c", code, str(target)], check=False,
                        env={**os.environ, "PYTHONPATH": os.getcwd()}).returncode
    assert rc == 9
    assert target.read_text() == "old"


def test_a_failing_rename_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "f"
    safe_write.write_text(target, "old")

    def boom(*_a: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(safe_write.os, "replace", boom)
    with pytest.raises(WriteFailed, match="Input/output error"):
        safe_write.write_text(target, "new")
    assert target.read_text() == "old" and _leftovers(tmp_path) == []


def test_concurrent_writers_leave_one_whole_version(tmp_path):
    target = tmp_path / "f"
    versions = [uuid.uuid4().hex.encode() * 2000 for _ in range(8)]

    def write(data: bytes) -> None:
        for _ in range(20):
            safe_write.write_bytes(target, data, durable=False)

    threads = [threading.Thread(target=write, args=(v,)) for v in versions]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert target.read_bytes() in versions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_json_is_sorted_newline_terminated_and_refuses_nan(tmp_path):
    safe_write.write_json(tmp_path / "a.json", {"b": 1, "a": [2]})
    assert (tmp_path / "a.json").read_text() == '{\n "a": [\n  2\n ],\n "b": 1\n}\n'
    with pytest.raises(ValueError):
        safe_write.write_json(tmp_path / "n.json", {"x": float("nan")})
    assert not (tmp_path / "n.json").exists()


# --- directories -----------------------------------------------------------------------------


def _fill(d: pathlib.Path, **files: str) -> None:
    for name, text in files.items():
        (d / name).write_text(text)


def test_a_directory_is_swapped_in_whole_with_opsctls_marker(tmp_path):
    out = tmp_path / "out"
    with safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="1", b="2")
    marker = json.loads((out / MARKER).read_text())
    assert (marker["kind"], marker["written_by"], sorted(marker["files"])) == \
        ("export", "opsctl", ["a", "b"])
    with safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="new")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "a"]
    assert (out / "a").read_text() == "new"
    assert oct(out.stat().st_mode & 0o777) == oct(0o755 & ~safe_write.umask())
    assert _leftovers(tmp_path) == []


def test_a_failure_while_filling_leaves_the_previous_directory_whole(tmp_path):
    out = tmp_path / "out"
    with safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="old")
    with pytest.raises(RuntimeError), safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="half")
        raise RuntimeError("the weights could not be converted")
    assert (out / "a").read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_a_full_disk_while_filling_a_directory_keeps_the_previous_one(tmp_path):
    with _tmpfs(tmp_path / "small", "size=64k") as m:
        with safe_write.new_directory(m / "out", kind="export") as d:
            _fill(d, a="old")
        with pytest.raises(WriteFailed) as info, \
                safe_write.new_directory(m / "out", kind="export") as d:
            (d / "a").write_bytes(b"x" * (1 << 20))
        assert info.value.errno == errno.ENOSPC
        assert (m / "out" / "a").read_text() == "old"
        assert sorted(p.name for p in m.iterdir()) == ["out"]


def test_a_directory_opsctl_did_not_write_is_replaced_only_with_force(tmp_path):
    model = tmp_path / "Qwen3-8B"
    model.mkdir()
    _fill(model, **{"config.json": "{}", "model.safetensors": "weights"})
    with pytest.raises(DestinationRefused, match=r"opsctl did not write .*--force"), \
            safe_write.new_directory(model, kind="export") as d:
        _fill(d, x="y")
    assert (model / "model.safetensors").read_text() == "weights"
    with safe_write.new_directory(model, kind="export", force=True) as d:
        _fill(d, x="y")
    assert sorted(p.name for p in model.iterdir()) == [MARKER, "x"]


def test_an_empty_directory_is_taken_without_force(tmp_path):
    (tmp_path / "out").mkdir()
    with safe_write.new_directory(tmp_path / "out", kind="export") as d:
        _fill(d, a="1")
    assert (tmp_path / "out" / "a").read_text() == "1"


def test_a_directory_of_another_kind_is_refused(tmp_path):
    with safe_write.new_directory(tmp_path / "ckpt", kind="checkpoint") as d:
        _fill(d, a="1")
    with pytest.raises(DestinationRefused, match="is a checkpoint opsctl wrote, not a export"):
        safe_write.check_directory(tmp_path / "ckpt", kind="export")


def test_a_link_as_the_directory_is_refused_and_its_target_untouched(tmp_path):
    real = tmp_path / "real"
    with safe_write.new_directory(real, kind="export") as d:
        _fill(d, a="1")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(DestinationRefused, match="symbolic link"):
        safe_write.check_directory(tmp_path / "link", kind="export", force=True)
    assert (real / "a").read_text() == "1"


def test_a_link_inside_the_previous_directory_is_never_followed(tmp_path):
    victim = tmp_path / "shadow"
    victim.write_text("root:x")
    victim.chmod(0o600)
    out = tmp_path / "out"
    with safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="1")
    (out / "config.json").symlink_to(victim)
    with safe_write.new_directory(out, kind="export", force=True) as d:
        _fill(d, **{"config.json": "{}"})
    assert victim.read_text() == "root:x" and victim.stat().st_mode & 0o777 == 0o600
    assert not (out / "config.json").is_symlink()


def test_a_file_where_the_directory_goes_is_refused(tmp_path):
    (tmp_path / "f").write_text("keep")
    with pytest.raises(DestinationRefused, match="is a file"):
        safe_write.check_directory(tmp_path / "f", kind="export", force=True)


@pytest.mark.parametrize("path", ["", " ", ".", "./", "/", "/tmp", "~", "..", "sub/.."])
def test_the_current_directory_a_home_and_top_level_directories_are_never_written(
        tmp_path, monkeypatch, path):
    work = tmp_path / "home" / "me" / "work"
    (work / "sub").mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work.parent))
    if path == "~":
        path = str(work.parent)
    with pytest.raises(DestinationRefused, match="refused as a destination"):
        safe_write.check_directory(path, kind="export", force=True)


def test_concurrent_directory_writers_each_leave_a_whole_directory(tmp_path):
    out = tmp_path / "out"
    errors: list[BaseException] = []

    def write(tag: str) -> None:
        try:
            for _ in range(5):
                with safe_write.new_directory(out, kind="export") as d:
                    _fill(d, a=tag, b=tag)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(str(i),)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert (out / "a").read_text() == (out / "b").read_text()
    assert _leftovers(tmp_path) == []


# --- opsctl's own writers use it -------------------------------------------------------------


def test_the_last_target_is_never_written_through_a_link(tmp_path, monkeypatch):
    from opsctl.errors import USAGE, LocalWriteError
    from opsctl.state import last_target

    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path / "home"))
    victim = tmp_path / "victim"
    victim.write_text("keep")
    last_target.path().parent.mkdir(parents=True)
    last_target.path().symlink_to(victim)
    with pytest.raises(LocalWriteError, match="symbolic link") as info:
        last_target.save(last_target.LastTarget("sandbox", 200))
    assert info.value.exit_code == USAGE and victim.read_text() == "keep"
    last_target.path().unlink()
    last_target.save(last_target.LastTarget("sandbox", 200))
    assert last_target.load() == last_target.LastTarget("sandbox", 200)


def test_a_home_that_is_a_file_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    from opsctl.errors import LocalWriteError
    from opsctl.state import last_target

    (tmp_path / "home").write_text("")
    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path / "home"))
    with pytest.raises(LocalWriteError, match=f"{tmp_path}/home is not a directory"):
        last_target.save(last_target.LastTarget("sandbox", 200))


def test_importing_the_writer_costs_the_agents_status_poll_nothing_heavy():
    """The agent imports it on every poll: tempfile, shutil, ctypes and pathlib wait until a
    directory is written."""
    code = ("import sys; import remote_payload.safe_write; "
            "print(sorted(m for m in ('tempfile', 'shutil', 'ctypes', 'pathlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout
    assert out.strip() == "[]"


# --- hostile destinations: planted markers, races, mounts, killed writers ----------------------


def test_a_fifo_planted_as_the_marker_is_refused_not_waited_on(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights").write_text("precious")
    os.mkfifo(model / MARKER)
    done: list[BaseException] = []

    def check() -> None:
        try:
            safe_write.check_directory(model, kind="export")
        except BaseException as exc:
            done.append(exc)

    th = threading.Thread(target=check, daemon=True)
    th.start()
    th.join(10)
    assert not th.is_alive(), "a FIFO marker hung the check"
    assert isinstance(done[0], DestinationRefused)


@pytest.mark.parametrize("marker", ['{"written_by": "opsctl", "kind": "export"}',
                                    '{"written_by": "opsctl", "kind": "export", "files": {}}',
                                    '{"written_by": "opsctl", "kind": "export", "files": []}',
                                    "x" * (2 << 20)])
def test_a_marker_planted_by_hand_does_not_make_a_directory_opsctls(tmp_path, marker):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights").write_text("precious")
    (model / MARKER).write_text(marker)
    with pytest.raises(DestinationRefused, match=r"(did not write|changed since)"), \
            safe_write.new_directory(model, kind="export") as d:
        _fill(d, a="1")
    assert (model / "weights").read_text() == "precious"


def test_a_file_added_or_changed_in_opsctls_directory_needs_force_unless_carried(tmp_path):
    out = tmp_path / "out"
    with safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="1", **{"README.md": "card"})
    (out / "README.md").write_text("the user's card")
    safe_write.check_directory(out, kind="export", keep=("README.md",))
    with pytest.raises(DestinationRefused, match=r"changed since \('README.md'\)"):
        safe_write.check_directory(out, kind="export")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DestinationRefused, match=r"changed since \('notes.txt'\)"):
        safe_write.check_directory(out, kind="export", keep=("README.md",))
    (out / "notes.txt").unlink()
    (out / "a").unlink()  # a file of ours removed: nothing of the user's to lose
    safe_write.check_directory(out, kind="export", keep=("README.md",))


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
@pytest.mark.parametrize("swapped_in", ["link", "foreign"])
def test_a_destination_swapped_after_the_check_is_put_back_and_refused(tmp_path, monkeypatch,
                                                                       exchange, swapped_in):
    out = tmp_path / "out"
    with safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="old")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    real_exchange = safe_write.exchange
    real_check = safe_write.check_directory
    calls: list[str] = []

    def check_then_race(path: t.Any, **kw: t.Any) -> None:
        real_check(path, **kw)
        calls.append(os.fspath(path))
        if len(calls) == 2:  # the check just before the swap
            os.rename(out, tmp_path / "moved")  # the racer, between check and swap
            if swapped_in == "link":
                out.symlink_to(victim)
            else:
                os.rename(victim, out)

    monkeypatch.setattr(safe_write, "check_directory", check_then_race)
    monkeypatch.setattr(safe_write, "exchange",
                        real_exchange if exchange else (lambda a, b: False))
    with pytest.raises(DestinationRefused), safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="new")
    if swapped_in == "link":
        assert out.is_symlink() and (victim / "precious").read_text() == "keep"
    else:
        assert (out / "precious").read_text() == "keep"
    assert _leftovers(tmp_path) == []


def test_a_mount_point_inside_the_destination_is_never_replaced_even_with_force(tmp_path):
    out = tmp_path / "out"
    with safe_write.new_directory(out, kind="export") as d:
        (d / "data").mkdir()
    with _tmpfs(out / "data" / "disk", "size=64k") as m:
        (m / "precious").write_text("keep")
        with pytest.raises(DestinationRefused, match=r"mount point \(data/disk\)"), \
                safe_write.new_directory(out, kind="export", force=True) as d:
            _fill(d, a="1")
        assert (m / "precious").read_text() == "keep"


_KILLED_WRITER = """
import os, sys, time
from remote_payload import safe_write
with safe_write.new_directory(sys.argv[1], kind="export") as d:
    (d / "half").write_text("x")
    print("filling", flush=True)
    time.sleep(600)
"""


def test_a_killed_writers_temporary_directory_is_removed_by_the_next_write(tmp_path,
                                                                            monkeypatch):
    out = tmp_path / "out"
    with safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="old")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(out)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "filling\n"
        monkeypatch.setattr(safe_write, "STALE_AFTER_S", 0.0)
        safe_write.clean_stale(out)  # a live writer's directory is locked: left alone
        assert len(_leftovers(tmp_path)) == 1
    finally:
        proc.kill()
        proc.wait()
    assert (out / "a").read_text() == "old"
    with safe_write.new_directory(out, kind="export") as d:
        _fill(d, a="new")
    assert _leftovers(tmp_path) == [] and (out / "a").read_text() == "new"


def test_a_young_temporary_directory_is_left_to_its_writer(tmp_path):
    (tmp_path / ".out.0123456789ab.tmp").mkdir()
    safe_write.clean_stale(tmp_path / "out")
    assert _leftovers(tmp_path) == [".out.0123456789ab.tmp"]


def test_a_writer_killed_between_the_two_renames_gets_its_previous_directory_back(
        tmp_path, monkeypatch):
    old = tmp_path / ".out.0123456789ab.old"
    (old / "d").mkdir(parents=True)
    (old / "d" / "a").write_text("previous")
    monkeypatch.setattr(safe_write, "STALE_AFTER_S", 0.0)
    safe_write.clean_stale(tmp_path / "out")
    assert (tmp_path / "out" / "a").read_text() == "previous"
    assert _leftovers(tmp_path) == []


def test_a_file_named_like_a_temporary_is_not_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(safe_write, "STALE_AFTER_S", 0.0)
    (tmp_path / ".out.0123456789ab.tmp").write_text("a file of the user's")
    (tmp_path / ".out.notours.tmp").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".out.abcdefabcdef.old").symlink_to(tmp_path / "elsewhere")
    safe_write.clean_stale(tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".out.0123456789ab.tmp", ".out.abcdefabcdef.old", ".out.notours.tmp", "elsewhere"]


def test_a_temporary_lookalike_of_another_user_is_never_removed(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    monkeypatch.setattr(safe_write, "STALE_AFTER_S", 0.0)
    theirs = tmp_path / ".out.0123456789ab.tmp"
    theirs.mkdir()
    (theirs / "their-file").write_text("keep")
    os.chown(theirs, 65534, 65534)
    safe_write.clean_stale(tmp_path / "out")
    assert (theirs / "their-file").read_text() == "keep"


@settings(max_examples=80, deadline=None)
@given(text=st.one_of(st.binary(max_size=300), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                              max_size=4),
    max_leaves=16).map(lambda doc: json.dumps(
        {"written_by": "opsctl", "kind": "export", "files": doc}).encode())))
def test_any_marker_text_leaves_a_directory_with_a_file_of_the_users_refused(tmp_path_factory,
                                                                            text):
    model = tmp_path_factory.mktemp("m") / "model"
    model.mkdir()
    (model / "weights").write_text("precious")
    (model / MARKER).write_bytes(text)
    with pytest.raises(DestinationRefused):
        safe_write.check_directory(model, kind="export")
    assert safe_write.read_marker(model) is None or isinstance(safe_write.read_marker(model), dict)


@pytest.mark.parametrize("link", ["loop", "nowhere"])
def test_a_parent_link_that_leads_nowhere_is_named_as_such(tmp_path, link):
    (tmp_path / "bad").symlink_to("bad" if link == "loop" else "nowhere")
    with pytest.raises(WriteFailed, match=r"bad is a symbolic link that leads nowhere"), \
            safe_write.new_directory(tmp_path / "bad" / "out", kind="export") as d:
        _fill(d, a="1")
    with pytest.raises(WriteFailed, match=r"bad is a symbolic link that leads nowhere"):
        safe_write.write_text(tmp_path / "bad" / "f", "x")


@settings(max_examples=60, deadline=None)
@given(name=NAMES)
def test_a_refusal_naming_any_path_is_one_line(tmp_path_factory, name):
    d = tmp_path_factory.mktemp("n")
    (d / name).mkdir()
    (d / name / "mine").write_text("x")
    with pytest.raises(DestinationRefused) as info:
        safe_write.check_directory(d / name, kind="export")
    assert "\n" not in str(info.value) and "\r" not in str(info.value)


def test_a_directory_holding_only_what_the_caller_carries_is_taken_without_force(tmp_path):
    clone = tmp_path / "hub-clone"
    clone.mkdir()
    (clone / "README.md").write_text("# my card")
    safe_write.check_directory(clone, kind="export", keep=("README.md",))
    (clone / ".gitattributes").write_text("*.safetensors filter=lfs")
    with pytest.raises(DestinationRefused, match="opsctl did not write"):
        safe_write.check_directory(clone, kind="export", keep=("README.md",))


def test_a_link_written_into_a_new_directory_is_kept_as_a_link(tmp_path):
    out = tmp_path / "out"
    with safe_write.new_directory(out, kind="export") as d:
        (d / "README.md").symlink_to(tmp_path / "nowhere.md")
        (d / "up").symlink_to("..")
    assert os.readlink(out / "README.md") == str(tmp_path / "nowhere.md")
    assert not (tmp_path / "nowhere.md").exists()


@pytest.mark.parametrize("kind", ["link", "directory"])
def test_a_marker_that_is_a_link_or_a_directory_is_no_marker(tmp_path, kind):
    real = tmp_path / "real"
    with safe_write.new_directory(real, kind="export") as d:
        _fill(d, a="1")
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights").write_text("precious")
    if kind == "link":
        (model / MARKER).symlink_to(real / MARKER)
    else:
        (model / MARKER).mkdir()
    assert safe_write.read_marker(model) is None
    with pytest.raises(DestinationRefused, match="opsctl did not write"):
        safe_write.check_directory(model, kind="export")


# --- links, lines, and the writers that use them ------------------------------------------


def test_write_link_points_a_link_elsewhere_in_one_step(tmp_path):
    link = tmp_path / "current"
    safe_write.write_link(link, "build-a")
    safe_write.write_link(link, "build-b")
    assert os.readlink(link) == "build-b"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("what", ["file", "directory"])
def test_write_link_never_replaces_what_is_not_a_link(what, tmp_path):
    there = tmp_path / "current"
    if what == "file":
        there.write_text("x")
    else:
        there.mkdir()
    with pytest.raises(DestinationRefused, match="not a symbolic link"):
        safe_write.write_link(there, "build-a")
    assert not there.is_symlink()


@pytest.mark.parametrize("ending", ["", "last line\n", "last line"])
def test_append_line_makes_the_line_one_of_its_own(ending, tmp_path):
    path = tmp_path / "lines"
    path.write_text(ending)
    safe_write.append_line(path, "new")
    assert path.read_text().splitlines() == [*ending.splitlines(), "new"]
    assert path.read_text().endswith("new\n")


def test_append_line_refuses_a_line_break_in_the_line(tmp_path):
    with pytest.raises(DestinationRefused, match="line break"):
        safe_write.append_line(tmp_path / "lines", "a\nb")
    assert not (tmp_path / "lines").exists()


def test_check_file_refuses_a_link_or_a_directory_before_any_work(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "victim")
    for path in (tmp_path / "dir", tmp_path / "link", f"{tmp_path}/x/"):
        with pytest.raises(DestinationRefused):
            safe_write.check_file(path)
    safe_write.check_file(tmp_path / "new.json")
    assert not (tmp_path / "victim").exists()


def test_eval_json_out_through_a_link_is_refused_before_the_measurement(tmp_path):
    pytest.importorskip("torch")
    from remote_payload.trainer import evaluate

    victim = tmp_path / "victim"
    victim.write_text("the user's")
    (tmp_path / "out.json").symlink_to(victim)
    with pytest.raises(DestinationRefused, match="symbolic link"):
        evaluate.parse(["--ckpt", "c", "--target-path", "t", "--prompts", "p",
                        "--json-out", str(tmp_path / "out.json")])
    assert victim.read_text() == "the user's"


def test_a_stack_dump_is_never_written_through_a_planted_link(tmp_path):
    from remote_payload.agent import jobstore, stacks

    victim = tmp_path / "victim"
    victim.write_text("the user's")
    folder = tmp_path / "job" / jobstore.STACK_DUMPS
    folder.mkdir(parents=True)
    (folder / "dump.txt").symlink_to(victim)
    proc = stacks.ProcessStacks(pid=1, rank=0, role="train", gpu=None, cmd="python", dump="x",
                                threads=1, where="", collective=None, caller=None)
    with pytest.raises(DestinationRefused):
        stacks.save(str(tmp_path / "job"), [proc], "dump")
    assert victim.read_text() == "the user's"
    path = stacks.save(str(tmp_path / "job"), [proc], "other")
    assert pathlib.Path(path).read_text().startswith("=== pid 1 rank 0")


def test_torch_history_is_appended_never_through_a_link(tmp_path):
    from remote_payload.agent.torchenv.layout import Layout, append_history

    layout = Layout(str(tmp_path))
    append_history(layout, {"a": 1})
    append_history(layout, {"a": 2})
    assert [json.loads(x) for x in pathlib.Path(layout.history).read_text().splitlines()] == [
        {"a": 1}, {"a": 2}]
    victim = tmp_path / "victim"
    victim.write_text("")
    os.unlink(layout.history)
    os.symlink(victim, layout.history)
    with pytest.raises(DestinationRefused):
        append_history(layout, {"a": 3})
    assert victim.read_text() == ""
