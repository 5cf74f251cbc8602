"""The path rules of push/pull (a delete never reaches a root, a home or the cwd; ``../``
never leaves the data dir), pure.

The guard, the container path parser and a pull's implied DEST are plain functions
(:mod:`opsctl.ops.filepaths`); the tar stream's torn-file handling is local file I/O
(:mod:`remote_payload.tarsync` on both ends). What the container does is in
``tests/sandbox/test_files_nothing_lost_sandbox.py``.
"""

from __future__ import annotations

import io
import os
import posixpath
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl import errors
from opsctl.ops import filepaths
from remote_payload import tarsync

ROOT = "/opt/opsctl"
REMOTE = filepaths.remote_protected(ROOT, ["/root"])
segment = st.text(alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)),
                  min_size=1, max_size=12)
segments = st.lists(segment, min_size=0, max_size=5)


def _norm(parts: list[str]) -> str:
    return posixpath.normpath("/" + "/".join(parts))


class TestDeleteNeverAppliesToRootHomeOrCwd:
    """``--delete`` never applies to /, a system dir, a home, the cwd or a parent."""

    @pytest.mark.parametrize("path", ["/", "/root", "/etc", "/tmp", "/home", "/lib64", "/usr",
                                      "/var", "/opt", "/proc", "/libx32"])
    def test_the_root_and_top_level_system_directories_are_refused(self, path):
        assert filepaths.delete_refusal(path, {}) is not None
        with pytest.raises(errors.DeleteRefused) as exc:
            filepaths.check_delete("container path", path, REMOTE)
        assert exc.value.exit_code == errors.USAGE and repr(path) in exc.value.message
        assert "nothing was sent or deleted" in exc.value.message

    @pytest.mark.parametrize("path", ["/opt/opsctl", "/opt/opsctl/data"])
    def test_opsctl_s_own_root_and_data_directory_are_refused(self, path):
        assert filepaths.delete_refusal(path, REMOTE) is not None

    @pytest.mark.parametrize("path", ["/opt/opsctl/data/run1", "/root/scratch", "/srv/x/y",
                                      "/tmp/job"])
    def test_a_directory_strictly_inside_is_allowed(self, path):
        assert filepaths.delete_refusal(path, REMOTE) is None

    def test_the_container_user_s_home_and_its_parents_are_refused(self):
        protected = filepaths.remote_protected(ROOT, ["/home/alice"])
        assert "home" in (filepaths.delete_refusal("/home/alice", protected) or "")
        assert filepaths.delete_refusal("/home", protected) is not None
        assert filepaths.delete_refusal("/home/alice/runs", protected) is None
        assert filepaths.delete_refusal("/home/alicex", protected) is None  # not a parent

    def test_the_local_home_the_cwd_and_their_parents_are_refused(self, tmp_path, monkeypatch):
        home, cwd = tmp_path / "h", tmp_path / "h" / "work"
        cwd.mkdir(parents=True)
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.chdir(cwd)
        protected = filepaths.local_protected()
        for path in (home, cwd, tmp_path):
            assert filepaths.delete_refusal(str(path), protected) is not None, path
        assert filepaths.delete_refusal(str(cwd / "out"), protected) is None

    def test_dot_dot_and_symlinks_are_resolved_before_judging(self, tmp_path, monkeypatch):
        monkeypatch.chdir(tmp_path)
        (tmp_path / "a").mkdir()
        (tmp_path / "to_cwd").symlink_to(tmp_path)
        protected = filepaths.local_protected()
        for typed in ("a/..", "to_cwd", "./a/../../" + tmp_path.name):
            paths = filepaths.local_delete_target(typed)
            assert any(filepaths.delete_refusal(p, protected) for p in paths), (typed, paths)

    @settings(max_examples=300, deadline=None)
    @given(protected=segments.filter(bool), cut=st.integers(min_value=0, max_value=5))
    def test_any_ancestor_or_equal_of_a_protected_path_is_refused(self, protected, cut):
        inner = _norm(protected)
        outer = _norm(protected[: max(0, len(protected) - cut)])
        assert filepaths.delete_refusal(outer, {inner: "a protected place"}) is not None

    @settings(max_examples=300, deadline=None)
    @given(below=segments.filter(lambda p: all(s not in (".", "..") for s in p) and bool(p)))
    def test_any_path_strictly_inside_a_scratch_dir_is_allowed(self, below):
        scratch = "/opt/opsctl/data/scratch"
        path = posixpath.join(scratch, *below)
        assert filepaths.delete_refusal(path, REMOTE) is None


class TestRelativeDestWithDotDot:
    """a relative container path stays under <root>/data; `..` out of it is refused."""

    def test_a_relative_path_is_under_the_data_dir(self):
        assert filepaths.container_path(ROOT, "runs/q8") == "/opt/opsctl/data/runs/q8"
        assert filepaths.container_path(ROOT, "a/../b") == "/opt/opsctl/data/b"
        assert filepaths.container_path(ROOT, "/etc/x/../y") == "/etc/y"

    @pytest.mark.parametrize("path", ["..", "../jobs", "a/../../jobs", "../../../etc"])
    def test_dot_dot_leaving_the_data_dir_is_refused_with_the_absolute_path_as_hint(self, path):
        with pytest.raises(errors.ConfigError) as exc:
            filepaths.container_path(ROOT, path)
        assert "leaves /opt/opsctl/data" in exc.value.message and exc.value.hint

    @pytest.mark.parametrize("path", ["", "a\0b"])
    def test_an_empty_path_or_a_nul_byte_is_refused(self, path):
        with pytest.raises(errors.ConfigError):
            filepaths.container_path(ROOT, path)

    @settings(max_examples=400, deadline=None)
    @given(parts=st.lists(st.one_of(segment, st.sampled_from(["..", ".", ""])), max_size=8),
           absolute=st.booleans())
    def test_any_path_parses_to_an_absolute_normal_path_or_a_usage_error(self, parts, absolute):
        raw = ("/" if absolute else "") + "/".join(parts)
        absolute = raw.startswith("/")  # a leading empty segment makes it absolute too
        try:
            got = filepaths.container_path(ROOT, raw)
        except errors.ConfigError:
            assert not absolute
            return
        assert got.startswith("/") and posixpath.normpath(got) == got and "//" not in got
        if not absolute:
            assert filepaths.contains("/opt/opsctl/data", got)


class TestPullWithoutDestNeverWritesIntoCwd:
    """a pull's implied DEST is ./<basename of SRC>, never the cwd; `/` is refused."""

    @pytest.mark.parametrize("src,name", [("/opt/opsctl/data/runs/q8", "q8"), ("/etc/", "etc"),
                                          ("/opt/opsctl/data", "data")])
    def test_the_implied_dest_is_the_basename(self, src, name):
        assert filepaths.implied_pull_dest(src) == name

    @pytest.mark.parametrize("src", ["/", "//", "/."])
    def test_the_root_has_no_basename_and_is_refused(self, src):
        with pytest.raises(errors.ConfigError) as exc:
            filepaths.implied_pull_dest(src)
        assert "DEST" in exc.value.message

    @settings(max_examples=300, deadline=None)
    @given(parts=segments)
    def test_the_implied_dest_is_one_plain_name(self, parts):
        try:
            name = filepaths.implied_pull_dest(_norm(parts))
        except errors.ConfigError:
            assert _norm(parts) == "/"
            return
        assert name not in ("", ".", "..") and "/" not in name


class TestTornFileIsNeverReportedAsSuccess:
    """a file that changes while it is sent is re-sent once, then named as torn."""

    def _transfer(self, src: Path, dest: Path, while_reading=None) -> tuple[list[str], dict]:
        doc = tarsync.listing(str(src))
        out = io.BytesIO()
        if while_reading is not None:
            real_open = open

            class Striking:  # the writer strikes after the first read, before the last
                def __init__(self, f):
                    self.f, self.reads = f, 0

                def fileno(self):
                    return self.f.fileno()

                def read(self, n=-1):
                    self.reads += 1
                    if self.reads == 1:
                        while_reading(self.f.name)
                    return self.f.read(n)

                def __enter__(self):
                    return self

                def __exit__(self, *exc):
                    self.f.close()

            def patched(path, mode="r", *a, **k):
                f = real_open(path, mode, *a, **k)
                return Striking(f) if str(path).endswith("grows.bin") else f
            tarsync.open = patched  # type: ignore[attr-defined]
        try:
            again = tarsync.send(str(src), doc, tarsync.scan(str(dest), doc), out)
        finally:
            if while_reading is not None:
                del tarsync.open  # type: ignore[attr-defined]
        out.seek(0)
        return again, tarsync.receive(str(dest), out)

    def test_a_file_changed_once_while_read_is_sent_again_and_arrives_whole(self, tmp_path):
        src, dest = tmp_path / "src", tmp_path / "dest"
        src.mkdir()
        (src / "grows.bin").write_bytes(b"a" * 10000)
        calls = []

        def append_once(path):
            if not calls:
                calls.append(path)
                with open(path, "ab") as f:
                    f.write(b"b" * 5000)
        again, reply = self._transfer(src, dest, append_once)
        assert (again, reply["torn"]) == ([], [])
        assert (dest / "grows.bin").read_bytes() == b"a" * 10000 + b"b" * 5000

    def test_a_file_that_keeps_changing_is_named_and_the_previous_copy_stays(self, tmp_path):
        src, dest = tmp_path / "src", tmp_path / "dest"
        src.mkdir()
        dest.mkdir()
        (dest / "grows.bin").write_bytes(b"old")
        (src / "grows.bin").write_bytes(b"a" * 10000)

        def append(path):
            with open(path, "ab") as f:
                f.write(b"b")
        again, reply = self._transfer(src, dest, append)
        assert again == ["grows.bin"] and reply["torn"] == ["grows.bin"]
        assert (dest / "grows.bin").read_bytes() == b"old"
        assert not [p for p in os.listdir(dest) if p.endswith(tarsync.PART)]

    def test_a_file_that_shrinks_while_read_keeps_the_stream_whole(self, tmp_path):
        src, dest = tmp_path / "src", tmp_path / "dest"
        src.mkdir()
        (src / "grows.bin").write_bytes(b"a" * 10000)
        (src / "after.txt").write_text("still arrives")

        def truncate(path):
            os.truncate(path, 10)
        again, reply = self._transfer(src, dest, truncate)
        assert again == ["grows.bin"] and reply["torn"] == ["grows.bin"]
        assert (dest / "after.txt").read_text() == "still arrives"
        assert not (dest / "grows.bin").exists()


class TestDeleteCountIsPlannedFirst:
    """the plan names what --delete would remove; the receiver never removes more."""

    def test_the_plan_lists_extras_and_changes_nothing(self, tmp_path):
        src, dest = tmp_path / "src", tmp_path / "dest"
        src.mkdir()
        (src / "keep").write_text("k")
        (dest / "old").mkdir(parents=True)
        (dest / "old" / "x").write_text("x")
        (dest / "keep").write_text("k")
        plan = tarsync.plan(str(dest), tarsync.listing(str(src)))
        assert sorted(plan["delete"]) == ["old", "old/x"]
        assert (dest / "old" / "x").exists()

    def test_the_receiver_deletes_nothing_beyond_the_confirmed_count(self, tmp_path):
        src, dest = tmp_path / "src", tmp_path / "dest"
        src.mkdir()
        dest.mkdir()
        for i in range(3):
            (dest / f"extra{i}").write_text("x")
        doc = tarsync.listing(str(src))
        out = io.BytesIO()
        tarsync.send(str(src), doc, tarsync.scan(str(dest), doc), out)
        out.seek(0)
        with pytest.raises(tarsync.Refused, match="more than the 2 confirmed"):
            tarsync.receive(str(dest), out, delete=True, max_delete=2)
        assert len(os.listdir(dest)) == 3


def test_the_changed_files_of_two_snapshots_are_named(tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "b").write_text("1")
    before = tarsync.stats(str(tmp_path))
    with open(tmp_path / "b", "a") as f:
        f.write("2")
    assert tarsync.changed(before, tarsync.stats(str(tmp_path))) == ["b"]


@settings(max_examples=500, deadline=None)
@given(rel=st.text(alphabet=st.sampled_from(["a", "/", ".", "\\", "\0", "é", " "]), max_size=16))
def test_a_member_name_from_the_peer_never_leaves_the_destination(rel):
    """A pull's tar members come from the container: untrusted names, parsed by _target."""
    try:
        got = tarsync._target("/dest", rel)
    except tarsync.Refused:
        return
    assert got == "/dest" if rel == "" else filepaths.contains("/dest", posixpath.normpath(got))
    assert got == "/dest" or posixpath.normpath(got) != "/dest"


class TestPlaybookOutputsNeverCollide:
    def test_two_outputs_with_one_name_are_refused_naming_both(self):
        from opsctl.ops import files

        with pytest.raises(errors.ConfigError) as info:
            files.output_dests("/opt/opsctl", ["run-a/data", "/scratch/data"])
        assert str(info.value) == ("pull: outputs '/opt/opsctl/data/run-a/data' and "
                                   "'/scratch/data' would both land in ./data; nothing fetched")

    def test_distinct_names_each_land_in_their_own_directory(self):
        from opsctl.ops import files

        assert files.output_dests("/opt/opsctl", ["ckpts", "/scratch/logs", "ckpts/"]) == {
            "/opt/opsctl/data/ckpts": "ckpts", "/scratch/logs": "logs"}

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.text(st.sampled_from("ab/."), min_size=1, max_size=6), max_size=5))
    def test_any_outputs_get_distinct_local_names_or_a_config_error(self, outputs):
        from opsctl.ops import files

        try:
            dests = files.output_dests("/opt/opsctl", outputs)
        except errors.ConfigError:
            return
        assert len(set(dests.values())) == len(dests)


class TestContentIsComparedNotAssumed:
    def test_a_file_with_the_same_size_and_mtime_but_other_bytes_is_sent(self, tmp_path):
        src, dest = tmp_path / "src", tmp_path / "dest"
        src.mkdir()
        dest.mkdir()
        (src / "f").write_bytes(b"remote!")
        (dest / "f").write_bytes(b"local!!")
        st = (src / "f").stat()
        os.utime(dest / "f", ns=(st.st_atime_ns, st.st_mtime_ns))
        assert tarsync.scan(str(dest), tarsync.listing(str(src), sums=True)) == ["f"]
        (dest / "f").write_bytes(b"remote!")
        os.utime(dest / "f", ns=(st.st_atime_ns, st.st_mtime_ns))
        assert tarsync.scan(str(dest), tarsync.listing(str(src), sums=True)) == []


OWN = [(ROOT, f"{ROOT}/data")]


@pytest.mark.parametrize("path", [f"{ROOT}/envs", f"{ROOT}/jobs", f"{ROOT}/payloads",
                                  f"{ROOT}/envs/cu124-2.5.1", f"{ROOT}/jobs/x/y", f"{ROOT}/other"])
def test_delete_never_reaches_opsctls_own_state_in_the_container(path):
    with pytest.raises(errors.DeleteRefused, match="opsctl's own state"):
        filepaths.check_delete("container path", path, REMOTE, OWN)


@pytest.mark.parametrize("path", [f"{ROOT}/data/run", f"{ROOT}/data/a/b", "/scratch/out"])
def test_delete_into_a_directory_of_the_users_under_data_is_allowed(path):
    filepaths.check_delete("container path", path, REMOTE, OWN)


@given(st.lists(st.sampled_from(["data", "envs", "jobs", "x", ".."]), min_size=1, max_size=4))
def test_no_normalized_path_inside_the_root_but_outside_data_passes(parts):
    path = posixpath.normpath(posixpath.join(ROOT, *parts))
    inside_data = path.startswith(f"{ROOT}/data/")
    inside_root = path.startswith(f"{ROOT}/") or path == ROOT
    refused = filepaths.delete_refusal(path, REMOTE) or filepaths.own_state_refusal(
        path, ROOT, f"{ROOT}/data")
    if inside_root and not inside_data:
        assert refused is not None, path
