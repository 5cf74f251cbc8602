"""The one receiver on this machine (:mod:`opsctl.remote.receiver`): what a container sends
back never creates anything outside the destination, never keeps a link leaving it, never
sets local permissions, never creates a device or FIFO, and a directory swapped for a link
while a stream is received is never written through. The tar stream here is the one
``remote_payload.tarsync`` sends; a hostile container can send any other, so the streams are
also built by hand and by hypothesis. The same rules through the real sandbox, on both the
tar and the rsync path: ``tests/sandbox/test_files_hostile_sandbox.py``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl.remote import receiver, rsync
from opsctl.remote.receiver import Receiver, ReceiveRefused
from remote_payload import tarsync


def _member(tar: tarfile.TarFile, name: str, kind: str = "file", data: bytes = b"",
            mode: int = 0o644, link: str = "", digest: str | None = None) -> None:
    info = tarfile.TarInfo(name)
    info.mode = mode
    if kind == "file":
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        s = (digest or hashlib.sha256(data).hexdigest()).encode()
        sinfo = tarfile.TarInfo(tarsync.SUM)
        sinfo.size = len(s)
        tar.addfile(sinfo, io.BytesIO(s))
        return
    info.type = {"dir": tarfile.DIRTYPE, "link": tarfile.SYMTYPE, "fifo": tarfile.FIFOTYPE,
                 "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE, "hard": tarfile.LNKTYPE}[kind]
    info.linkname = link
    tar.addfile(info)


def _stream(members: list[tuple], root: str = "dir") -> io.BytesIO:
    """A stream as tarsync sends it: the listing, then ``data/<rel>`` members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        names = json.dumps({"root": root, "entries": [""] + [m[0] for m in members]}).encode()
        info = tarfile.TarInfo(tarsync.LIST)
        info.size = len(names)
        tar.addfile(info, io.BytesIO(names))
        for rel, *rest in members:
            _member(tar, f"{tarsync.DATA}/{rel}" if rel else tarsync.DATA, *rest)
    buf.seek(0)
    return buf


def _receive(dest: Path, stream: io.BytesIO, **kw) -> tuple[dict, Receiver]:
    into = Receiver(dest, **kw)
    return tarsync.receive(str(dest), stream, writer=into), into


def _modes(root: Path) -> dict[str, int]:
    out = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(here) / name
            out[str(p.relative_to(root))] = os.lstat(p).st_mode
    return out


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# -- modes --------------------------------------------------------------------------------

@pytest.mark.parametrize(("sent", "directory", "umask", "want"), [
    (0o4755, False, 0o022, 0o755),  # a setuid-root shell arrives as a plain executable
    (0o2755, False, 0o022, 0o755),
    (0o0666, False, 0o022, 0o644),
    (0o1777, True, 0o022, 0o755),  # a sticky world-writable dir arrives as the user's own
    (0o0666, False, 0o077, 0o600),
    (0o0000, False, 0o022, 0o600),  # the owner can always read and replace its copy
    (0o0000, True, 0o022, 0o700),
    (0o7777, True, 0o027, 0o750),
])
def test_a_received_mode_is_the_sent_bits_less_the_umask_without_special_bits(
        sent, directory, umask, want):
    assert receiver.local_mode(sent, directory=directory, umask=umask) == want


@given(st.integers(0, 0o177777), st.booleans(), st.integers(0, 0o777))
def test_no_received_mode_ever_has_a_special_bit_or_a_bit_the_umask_masks(sent, directory, umask):
    mode = receiver.local_mode(sent, directory=directory, umask=umask)
    assert mode & 0o7000 == 0 and mode & umask == 0


def test_the_umask_is_read_without_being_changed(umask022):
    assert receiver.current_umask() == 0o022
    assert receiver.current_umask() == 0o022


def test_a_tree_sent_by_tarsync_arrives_with_the_users_modes_and_without_specials(
        tmp_path, umask022):
    src = tmp_path / "src"
    (src / "sticky").mkdir(parents=True)
    os.chmod(src / "sticky", 0o1777)
    (src / "suid").write_text("#!/bin/sh\n")
    os.chmod(src / "suid", 0o4755)
    (src / "open").write_text("x")
    os.chmod(src / "open", 0o666)
    os.mkfifo(src / "fifo")
    doc = receiver.check_listing(tarsync.listing(str(src), sums=True))
    dest = tmp_path / "dest"
    buf = io.BytesIO()
    tarsync.send(str(src), tarsync.listing(str(src)), tarsync.scan(str(dest), doc), buf)
    buf.seek(0)
    into = Receiver(dest)
    for rel in doc["skipped"]:
        into.refuse(rel, "special")
    tarsync.receive(str(dest), buf, writer=into)
    modes = _modes(dest)
    assert {k: oct(stat.S_IMODE(v)) for k, v in modes.items()} == {
        "sticky": "0o755", "suid": "0o755", "open": "0o644"}
    assert [r.rel for r in into.refused] == ["fifo"]


# -- devices and FIFOs ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "chr", "blk", "hard"])
def test_a_device_fifo_or_hard_link_member_is_never_created_and_is_named(tmp_path, kind):
    dest = tmp_path / "dest"
    reply, into = _receive(dest, _stream([("ok", "file", b"x"), ("odd", kind, b"", 0o666,
                                                                   "ok")]))
    assert os.listdir(dest) == ["ok"]
    assert [r.rel for r in into.refused] == ["odd"], into.refused
    assert reply["files"] == 1


# -- links ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("rel", "target"), [
    ("l", "/"), ("l", "/etc/shadow"), ("l", ".."), ("d/l", "../.."), ("l", "../x"),
    ("d/l", "x/../.."), ("d/l", "s/../../x"), ("", "anything"), ("l", ""),
    ("d/e/l", "../../../etc"),
])
def test_a_link_that_is_absolute_or_may_climb_out_of_the_copy_is_refused(rel, target):
    assert receiver.link_refusal(rel, target) is not None


@pytest.mark.parametrize(("rel", "target"), [
    ("l", "f"), ("l", "./d/f"), ("d/l", "../f"), ("d/e/l", "../../f"), ("d/l", "../d/e/f"),
])
def test_a_relative_link_that_stays_inside_the_copy_is_kept(rel, target):
    assert receiver.link_refusal(rel, target) is None


_NAMES = st.sampled_from(["a", "b", "..", ".", "", "c d", "é"])


@given(st.lists(_NAMES, min_size=1, max_size=4), st.lists(_NAMES, max_size=6),
       st.booleans())
def test_every_kept_link_resolves_inside_the_copy_by_its_own_path(rel_parts, target_parts, absolute):
    rel, target = "/".join(rel_parts), ("/" if absolute else "") + "/".join(target_parts)
    try:
        receiver.split_rel(rel)
    except ReceiveRefused:
        return
    if receiver.link_refusal(rel, target) is None:
        resolved = os.path.normpath(os.path.join("/copy", os.path.dirname(rel), target))
        assert resolved == "/copy" or resolved.startswith("/copy/"), (rel, target)


def test_kept_links_resolve_inside_even_through_each_other(tmp_path):
    """A chain (``x/s -> ..``, then ``l -> x/s/..``) is where a lexical check alone fails: ``..``
    after a name is refused, so no chain of kept links climbs out."""
    dest = tmp_path / "dest"
    _, into = _receive(dest, _stream([("x", "dir"), ("x/s", "link", b"", 0o777, ".."),
                                      ("l", "link", b"", 0o777, "x/s/..")]))
    assert [r.rel for r in into.refused] == ["l"]
    for p in dest.rglob("*"):
        assert p.resolve().is_relative_to(dest.resolve()), p


def test_a_link_in_the_stream_is_never_written_through(tmp_path):
    """``a -> /tmp/outside`` refused, then ``a/x`` becomes a file in a new directory ``a``."""
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    _, into = _receive(dest, _stream([("a", "link", b"", 0o777, str(outside)),
                                      ("a/x", "file", b"evil")]))
    assert os.listdir(outside) == []
    assert (dest / "a" / "x").read_bytes() == b"evil" and not (dest / "a").is_symlink()
    assert [r.rel for r in into.refused] == ["a"]


def test_a_link_planted_where_a_directory_goes_is_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(ReceiveRefused, match="not a directory here"):
        _receive(dest, _stream([("sub/f", "file", b"x")]))
    assert os.listdir(outside) == []


def test_a_directory_swapped_for_a_link_while_receiving_is_never_written_through(tmp_path):
    """Another process swaps ``dest/sub`` between a directory and a link to ``outside`` in a
    loop while 400 files are received into it: none lands outside (there is no check-then-
    write window: every write is relative to a directory opened with O_NOFOLLOW)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    (dest / "sub").mkdir(parents=True)
    members = [("sub", "dir")] + [(f"sub/f{i}", "file", b"x" * 100) for i in range(400)]
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            try:
                os.rename(dest / "sub", dest / "sub.real")
                os.symlink(outside, dest / "sub")
                os.unlink(dest / "sub")
                os.rename(dest / "sub.real", dest / "sub")
            except OSError:
                pass

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        for _ in range(5):
            try:
                _receive(dest, _stream(members))
            except (ReceiveRefused, OSError):
                pass
    finally:
        stop.set()
        swapper.join(10)
    assert os.listdir(outside) == []


def test_the_copy_itself_is_never_a_link(tmp_path):
    dest = tmp_path / "dest"
    _, into = _receive(dest, _stream([("", "link", b"", 0o777, "/")], root="link"))
    assert not os.path.lexists(dest)
    assert [r.rel for r in into.refused] == [""]


# -- names and the stream's own shape -------------------------------------------------------

@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/.", "a\0b"])
def test_a_name_leaving_the_destination_stops_the_stream(tmp_path, rel):
    dest = tmp_path / "dest"
    with pytest.raises((ReceiveRefused, tarsync.Refused)):
        _receive(dest, _stream([(rel, "file", b"x")]))
    assert sorted(os.listdir(tmp_path)) in ([], ["dest"])


def test_more_file_data_than_the_cap_stops_the_stream_and_leaves_no_part_file(tmp_path):
    dest = tmp_path / "dest"
    with pytest.raises(ReceiveRefused, match="more than 1000 bytes"):
        _receive(dest, _stream([("a", "file", b"x" * 600), ("b", "file", b"y" * 600)]),
                 max_bytes=1000)
    assert os.listdir(dest) == ["a"]


def test_a_listing_member_larger_than_its_cap_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(tarsync, "LIST_BYTES", 10)
    with pytest.raises(tarsync.Refused, match="more than 10"):
        _receive(tmp_path / "d", _stream([("a", "file", b"x")]))


_REL = st.lists(st.sampled_from(["a", "b", "..", ".", "", "/", "sub", "x y"]), min_size=1,
                max_size=4).map("/".join)
_MEMBER = st.tuples(_REL, st.sampled_from(["file", "dir", "link", "fifo", "chr", "hard"]),
                    st.binary(max_size=20), st.integers(0, 0o7777),
                    st.sampled_from(["/", "..", "../..", "a", "/tmp", "sub/../..", "b/c"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_MEMBER, max_size=8))
def test_any_stream_writes_only_inside_the_destination_with_safe_modes_and_kinds(
        tmp_path_factory, members):
    base = tmp_path_factory.mktemp("fuzz")
    (base / "outside").mkdir()
    dest = base / "dest"
    try:
        _receive(dest, _stream(members))
    except (ReceiveRefused, tarsync.Refused, tarfile.TarError, OSError):
        pass
    assert sorted(os.listdir(base)) in (["outside"], ["dest", "outside"])
    assert os.listdir(base / "outside") == []
    if dest.exists():
        for rel, mode in _modes(dest).items():
            assert stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode), rel
            assert mode & 0o7000 == 0, rel
            assert not rel.endswith(receiver.PART_SUFFIX), rel
            p = dest / rel
            if p.is_symlink():
                assert os.path.realpath(p).startswith(str(dest.resolve())), (rel, os.readlink(p))


# -- the listing and rsync's lines: parsers of the container's text -------------------------

def test_an_honest_listing_passes_the_check(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    (tmp_path / "d" / "l").symlink_to("f")
    doc = tarsync.listing(str(tmp_path / "d"), sums=True)
    assert receiver.check_listing(json.loads(json.dumps(doc)))["entries"] == doc["entries"]


@pytest.mark.parametrize("doc", [
    None, [], {"root": "dir"}, {"root": "x", "entries": []},
    {"root": "dir", "entries": [["../x", "file", 1, 1, 0o644, None]]},
    {"root": "dir", "entries": [["", "dir", 0, 0, 0o755, None], ["a", "file", -1, 0, 0, None]]},
    {"root": "dir", "entries": [["", "dir", 0, 0, 0o755, None], ["a", "file", 1.5, 0, 0, None]]},
    {"root": "dir", "entries": [["", "dir", 0, 0, 0o755, None], ["a", "link", 0, 0, 0, None]]},
    {"root": "dir", "entries": [["", "dir", 0, 0, 0o755, None], ["a", "file", 0, 0, 0, "/x"]]},
    {"root": "dir", "entries": [["a", "file", 0, 0, 0, None]]},
    {"root": "dir", "entries": [["", "dir", 0, 0, 0o755, None]], "sha256": {"zz": "0" * 64}},
    {"root": "dir", "entries": [["", "dir", 0, 0, 0o755, None]], "skipped": ["/etc"]},
])
def test_a_malformed_listing_is_refused_before_it_is_used(doc):
    with pytest.raises(ReceiveRefused, match=r"malformed|unsafe"):
        receiver.check_listing(doc)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=6)
                     | st.dictionaries(st.sampled_from(["root", "entries", "sha256", "skipped",
                                                        "x"]), kids, max_size=4), max_leaves=30)


@given(_JSON | st.fixed_dictionaries({"root": st.sampled_from(["dir", "file"]),
                                      "entries": st.lists(st.lists(_JSON, min_size=6,
                                                                   max_size=6), max_size=4)}))
def test_any_listing_is_either_checked_safe_or_refused(doc):
    try:
        out = receiver.check_listing(doc)
    except ReceiveRefused:
        return
    for rel, kind, *_ in out["entries"]:
        receiver.split_rel(rel)
        assert kind in ("file", "dir", "link", "other")


@pytest.mark.parametrize(("line", "rel"), [
    (b'skipping non-regular file "jobs/fifo"', "jobs/fifo"),
    (b'ignoring unsafe symlink "root" -> "/"', "root"),
    (b'ignoring unsafe symlink "a" -> "b" -> "c"', 'a" -> "b'),
    (b"events.out.tfevents.9.big is over max-size", "events.out.tfevents.9.big"),
])
def test_rsyncs_skip_lines_name_the_entry(line, rel):
    r = rsync.parse_refusals(line)
    assert r is not None and r.rel == rel


@given(st.binary(max_size=2000))
def test_any_rsync_line_parses_to_a_short_refusal_or_nothing(line):
    r = rsync.parse_refusals(line)
    assert r is None or (len(r.rel) <= 300 and len(r.why) < 400)


@given(st.text(max_size=50))
def test_split_rel_accepts_only_plain_relative_names(rel):
    try:
        parts = receiver.split_rel(rel)
    except ReceiveRefused:
        return
    assert all(p not in ("", ".", "..") and "/" not in p and "\0" not in p for p in parts)


# -- rsync's local result, checked by the same rules ----------------------------------------

def test_confine_removes_what_breaks_the_rules_and_clears_special_bits(tmp_path, umask022):
    dest = tmp_path / "copy"
    (dest / "d").mkdir(parents=True)
    (dest / "f").write_text("x")
    os.chmod(dest / "f", 0o4777)
    os.chmod(dest / "d", 0o1777)
    (dest / "d" / "out").symlink_to("/")
    (dest / "d" / "in").symlink_to("../f")
    os.mkfifo(dest / "p")
    found = receiver.confine(dest, since_ns=0)
    assert sorted(r.rel for r in found.refused) == ["d/out", "p"]
    assert sorted(os.listdir(dest)) == ["d", "f"] and os.listdir(dest / "d") == ["in"]
    assert oct(stat.S_IMODE(os.stat(dest / "f").st_mode)) == "0o755"
    assert oct(stat.S_IMODE(os.stat(dest / "d").st_mode)) == "0o755"
    assert found.bytes == 1


def test_confine_names_but_keeps_what_was_there_before_the_pull(tmp_path):
    dest = tmp_path / "copy"
    dest.mkdir()
    (dest / "mine").symlink_to("/etc")
    found = receiver.confine(dest, since_ns=2 ** 62)
    assert (dest / "mine").is_symlink()
    assert "left as it was" in found.refused[0].why
