"""A copied tree is at most ``limits.TREE_DEPTH`` levels deep, and ``--delete`` removes only
what was confirmed.

A hostile stream once wrote a 2000-deep tree that the next ``pull --delete`` walked with
``os.walk`` (recursive before Python 3.12) into a RecursionError traceback, and a stream whose
own listing differed from the confirmed plan made ``--delete`` remove a file the plan kept.
So every walk of a copy (``tarsync.walk``, ``receiver.confine``) is iterative and refuses a
level past the cap, every name written is checked against it, and the receiver removes only
names the user approved, refusing (and naming) one the stream's listing would add.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from opsctl.remote import receiver
from remote_payload import limits, tarsync


def deep(root: Path, levels: int) -> Path:
    """``root/d/d/...`` with ``levels`` directories and a file in the deepest."""
    here = root
    for _ in range(levels):
        here = here / "d"
    here.mkdir(parents=True)
    (here / "f").write_text("x")
    return here


def test_tarsync_carries_the_same_depth_cap_as_limits():
    assert tarsync.TREE_DEPTH == limits.TREE_DEPTH == 256


def test_a_tree_at_the_cap_is_listed_whole(tmp_path):
    deep(tmp_path / "src", limits.TREE_DEPTH - 1)  # its file lies TREE_DEPTH levels down
    doc = tarsync.listing(str(tmp_path / "src"))
    assert len(doc["entries"]) == limits.TREE_DEPTH + 1


def test_listing_a_tree_past_the_cap_is_one_refusal_naming_the_cap(tmp_path):
    deep(tmp_path / "src", limits.TREE_DEPTH + 20)
    with pytest.raises(tarsync.Refused, match=f"more than the {limits.TREE_DEPTH} a copied tree"):
        tarsync.listing(str(tmp_path / "src"))


def test_the_extras_of_a_deep_destination_are_one_refusal(tmp_path):
    deep(tmp_path / "dest", limits.TREE_DEPTH + 20)
    with pytest.raises(tarsync.Refused, match=str(limits.TREE_DEPTH)):
        tarsync.extras(str(tmp_path / "dest"), [""])


def test_the_walks_never_recurse(tmp_path):
    """With Python's recursion limit a few frames above the caller's, a 200-deep tree still
    walks: neither walk uses a frame per level."""
    deep(tmp_path / "t", 200)
    frames = len(__import__("inspect").stack())
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(frames + 60)
    try:
        walked = sum(1 for _ in tarsync.walk(str(tmp_path / "t"), topdown=False))
        found = receiver.confine(tmp_path / "t", since_ns=0)
    finally:
        sys.setrecursionlimit(old)
    assert walked == 201 and found.bytes == 1


def test_the_bottom_up_walk_yields_children_before_their_parent(tmp_path):
    (tmp_path / "t" / "a" / "b").mkdir(parents=True)
    (tmp_path / "t" / "c").mkdir()
    order = [os.path.relpath(top, tmp_path / "t") for top, _d, _f in
             tarsync.walk(str(tmp_path / "t"), topdown=False)]
    assert order.index("a/b") < order.index("a") < order.index(".")
    assert order.index("c") < order.index(".")


def test_confine_refuses_a_copy_past_the_cap_and_closes_its_descriptors(tmp_path):
    deep(tmp_path / "copy", limits.TREE_DEPTH + 20)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(receiver.ReceiveRefused, match=f"more than {limits.TREE_DEPTH} levels"):
        receiver.confine(tmp_path / "copy", since_ns=0)
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("check", [receiver.split_rel, lambda rel: tarsync._target("/x", rel)])
def test_a_name_past_the_cap_is_refused_before_anything_is_written(check):
    with pytest.raises((receiver.ReceiveRefused, tarsync.Refused), match="levels deep"):
        check("/".join(["d"] * (limits.TREE_DEPTH + 1)))
    check("/".join(["d"] * limits.TREE_DEPTH))


def _stream(src: Path, doc: dict) -> io.BytesIO:
    out = io.BytesIO()
    tarsync.send(str(src), doc, [e[0] for e in doc["entries"] if e[1] == "dir"], out)
    out.seek(0)
    return out


def test_a_stream_whose_listing_differs_from_the_plan_deletes_nothing_and_names_the_entry(
        tmp_path):
    """The plan confirmed removing ``extra``; the stream lists ``extra`` and not ``keep``."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "extra").write_text("e")
    dest.mkdir()
    (dest / "keep").write_text("k")
    (dest / "extra").write_text("e")
    doc = tarsync.listing(str(src))
    with pytest.raises(tarsync.Refused, match=r"1 entry that was not confirmed \('keep'\)"):
        tarsync.receive(str(dest), _stream(src, doc), delete=True, max_delete=1,
                        confirmed=["extra"], writer=receiver.Receiver(dest))
    assert sorted(p.name for p in dest.iterdir()) == ["extra", "keep"]


def test_delete_removes_exactly_the_confirmed_entries(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "kept").write_text("k")
    dest.mkdir()
    (dest / "kept").write_text("k")
    (dest / "gone").write_text("g")
    doc = tarsync.listing(str(src))
    got = tarsync.receive(str(dest), _stream(src, doc), delete=True, max_delete=1,
                          confirmed=["gone"], writer=receiver.Receiver(dest))
    assert got["deleted"] == 1 and sorted(p.name for p in dest.iterdir()) == ["kept"]


@pytest.mark.parametrize("listing", [b"[" * 100_000, b"not json", b"[1, 2]",
                                     b'{"root": "dir", "entries": ["../x"]}'])
def test_a_hostile_stream_listing_is_one_refusal_before_anything_is_written(tmp_path, listing):
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|") as tar:
        info = tarfile.TarInfo(tarsync.LIST)
        info.size = len(listing)
        tar.addfile(info, io.BytesIO(listing))
    buf.seek(0)
    dest = tmp_path / "dest"
    with pytest.raises(tarsync.Refused, match=r"listing|unsafe path"):
        tarsync.receive(str(dest), buf, writer=receiver.Receiver(dest))
    assert not dest.exists()
