"""``safe_write.remove_directory``: only a directory opsctl wrote, of the kind named, unchanged
since; never a link, a file, a protected place or someone else's directory."""

from __future__ import annotations

import os

import pytest

from remote_payload import safe_write


def _written(path, kind="checkpoint"):
    with safe_write.new_directory(path, kind=kind) as tmp:
        (tmp / "a.bin").write_bytes(b"x" * 10)
    return path


def test_a_directory_opsctl_wrote_is_removed_whole_and_leaves_no_sibling(tmp_path):
    d = _written(tmp_path / "ckpt-0000001")
    safe_write.remove_directory(d, kind="checkpoint")
    assert os.listdir(tmp_path) == []


def test_nothing_there_is_nothing_to_do(tmp_path):
    safe_write.remove_directory(tmp_path / "missing", kind="checkpoint")


@pytest.mark.parametrize("what", ["no marker", "other kind", "changed", "added", "link", "file"])
def test_what_opsctl_did_not_write_as_it_is_is_refused_and_kept(tmp_path, what):
    d = tmp_path / "ckpt-0000001"
    if what == "no marker":
        d.mkdir()
        (d / "a.bin").write_bytes(b"mine")
    elif what == "other kind":
        _written(d, kind="export")
    elif what in ("changed", "added"):
        _written(d)
        (d / ("a.bin" if what == "changed" else "notes.txt")).write_bytes(b"edited by hand")
    elif what == "link":
        _written(tmp_path / "real")
        d.symlink_to(tmp_path / "real")
    else:
        d.write_text("a file")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(safe_write.DestinationRefused, match="nothing removed"):
        safe_write.remove_directory(d, kind="checkpoint")
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("place", ["/", os.path.expanduser("~")])
def test_a_protected_place_is_refused(place):
    with pytest.raises(safe_write.DestinationRefused, match="refused for removal"):
        safe_write.remove_directory(place, kind="checkpoint")
