"""rsync's progress lines prove a copy passes its cap only when it does (pure logic of
:func:`opsctl.remote.rsync.over_cap`), and the stop's clean-up removes rsync's partial
directory and nothing else."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from opsctl.remote import rsync


def _pct(done: int, total: int) -> int:
    """rsync's progress percentage: ``int(100.0 * ofs / size)``, 100 when done."""
    return 100 if done == total else int(100.0 * done / total)


@given(total=st.integers(1, 10**13), frac=st.floats(0, 1), cap=st.integers(0, 10**13))
def test_a_progress_line_stops_the_copy_only_when_the_copy_passes_the_cap(total, frac, cap):
    done = int(total * frac)
    if rsync.over_cap(done, _pct(done, total), cap):
        assert total > cap


@given(total=st.integers(2, 10**12))
def test_the_last_progress_line_of_a_copy_over_its_cap_stops_it(total):
    assert rsync.over_cap(total, 100, total - 1)


@given(pct=st.integers(-10**6, 10**6), done=st.integers(0, 10**15), cap=st.integers(0, 10**15))
def test_any_numbers_on_a_progress_line_are_an_answer_not_an_error(pct, done, cap):
    assert rsync.over_cap(done, pct, cap) in (True, False)


def test_the_stop_removes_the_partial_directories_and_keeps_everything_else(tmp_path: Path):
    dest = tmp_path / "copy"
    (dest / "sub" / rsync.PARTIAL_DIR).mkdir(parents=True)
    (dest / "sub" / rsync.PARTIAL_DIR / "f3").write_bytes(b"half")
    (dest / "sub" / "whole").write_bytes(b"kept")
    (dest / "mine").write_bytes(b"kept")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_bytes(b"kept")
    (dest / "sub" / "link").symlink_to(outside)
    rsync.remove_partials(str(dest))
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "copy", "copy/mine", "copy/sub", "copy/sub/link", "copy/sub/whole", "outside",
        "outside/x"]


def test_beside_a_single_file_only_that_files_part_is_removed(tmp_path: Path):
    (tmp_path / rsync.PARTIAL_DIR).mkdir()
    (tmp_path / rsync.PARTIAL_DIR / "pulled").write_bytes(b"half")
    (tmp_path / rsync.PARTIAL_DIR / "other").write_bytes(b"another pull's part")
    rsync.remove_partials(str(tmp_path / "pulled"))
    assert [p.name for p in (tmp_path / rsync.PARTIAL_DIR).iterdir()] == ["other"]
