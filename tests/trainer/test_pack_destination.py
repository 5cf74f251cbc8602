"""``pack DATA OUT`` writes a token store whole or not at all, and only where it may.

OUT is filled under a temporary sibling and swapped in (remote_payload/safe_write.py): a
user's directory without opsctl's marker is refused unless ``--force``; the current
directory, a home and ``/`` are refused even so; a file or a link as OUT is a one-line error
with exit code 2; a failure leaves nothing behind, and a kill at any step leaves the
previous store readable and its temporary sibling is removed by the next write.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numpy")

from remote_payload import safe_write
from remote_payload.trainer.commands import main as trainer_main
from remote_payload.trainer.token_store import open_store, write_store
from tests.paths import REPO


def _data(tmp_path: pathlib.Path, records: int = 3) -> pathlib.Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"input_ids": [1, 2, 3, i]}) + "\n"
                            for i in range(records)))
    return path


def _pack(capsys, *argv: object) -> tuple[int, str]:
    rc = trainer_main(["pack", *map(str, argv)])
    return rc, capsys.readouterr().err


def _siblings(where: pathlib.Path) -> list[str]:
    return sorted(p.name for p in where.iterdir() if p.name.startswith("."))


def test_a_store_is_written_with_the_marker_and_packed_again_in_place(tmp_path, capsys):
    data, out = _data(tmp_path), tmp_path / "store"
    assert _pack(capsys, data, out)[0] == 0
    assert safe_write.read_marker(out)["kind"] == "token-store"
    assert len(open_store(str(out))) == 3
    assert _pack(capsys, _data(tmp_path, records=5), out)[0] == 0, "opsctl's own store"
    assert len(open_store(str(out))) == 5
    assert _siblings(tmp_path) == []


def test_a_users_directory_is_refused_and_kept_unless_force(tmp_path, capsys):
    data, out = _data(tmp_path), tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    rc, err = _pack(capsys, data, out)
    assert rc == 2
    assert "holds files opsctl did not write" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1
    assert (out / "thesis.tex").read_text() == "years of work"
    assert _siblings(tmp_path) == []
    assert _pack(capsys, data, out, "--force")[0] == 0
    assert not (out / "thesis.tex").exists() and len(open_store(str(out))) == 3


def test_a_store_without_the_marker_is_packed_again(tmp_path, capsys):
    data, out = _data(tmp_path), tmp_path / "store"
    assert _pack(capsys, data, out)[0] == 0
    (out / safe_write.MARKER).unlink()
    assert _pack(capsys, _data(tmp_path, records=4), out)[0] == 0
    assert len(open_store(str(out))) == 4


def test_the_current_directory_is_refused_even_with_force(tmp_path, capsys, monkeypatch):
    data = _data(tmp_path)
    here = tmp_path / "work"
    here.mkdir()
    (here / "keep.txt").write_text("x")
    monkeypatch.chdir(here)
    for argv in ([data, "."], [data, ".", "--force"], [data, ""], [data, str(here)]):
        rc, err = _pack(capsys, *argv)
        assert rc == 2, argv
        assert "refused as a destination" in err, err
    assert (here / "keep.txt").read_text() == "x"
    assert sorted(p.name for p in here.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("where", ["/", "~", "home"])
def test_root_and_a_home_are_refused_even_with_force(where, tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    out = {"/": "/", "~": os.path.expanduser("~"), "home": str(home)}[where]
    rc, err = _pack(capsys, _data(tmp_path), out, "--force")
    assert rc == 2 and "refused as a destination" in err
    assert (home / ".bashrc").read_text() == "x"


def test_a_file_or_a_link_as_out_is_a_one_line_error(tmp_path, capsys):
    data = _data(tmp_path)
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    afile = tmp_path / "afile"
    afile.write_text("notes")
    link = tmp_path / "link"
    link.symlink_to(target)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    for out, words in ((afile, "is a file"), (link, "symbolic link"),
                       (dangling, "symbolic link")):
        rc, err = _pack(capsys, data, out, "--force")
        assert rc == 2, out
        assert words in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    assert afile.read_text() == "notes" and (target / "keep").read_text() == "x"
    assert link.is_symlink() and dangling.is_symlink()
    assert _siblings(tmp_path) == []


def test_the_pack_command_names_a_refused_out_in_one_line_without_a_traceback(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("notes")
    child = subprocess.run([sys.executable, "-m", "remote_payload.trainer", "pack",
                            str(_data(tmp_path)), str(afile)],
                           cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 2
    assert child.stderr.splitlines() == [f"error: {afile}: is a file, not a directory; "
                                         "nothing written"]
    assert afile.read_text() == "notes"


def test_a_bad_record_leaves_the_previous_store_and_no_leftovers(tmp_path, capsys):
    out = tmp_path / "store"
    assert _pack(capsys, _data(tmp_path), out)[0] == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n" + json.dumps({"x": 1}) + "\n")
    rc, err = _pack(capsys, bad, out)
    assert rc == 2 and "needs 'input_ids'" in err
    assert len(open_store(str(out))) == 3
    assert _siblings(tmp_path) == []


_KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from remote_payload import safe_write
    from remote_payload.trainer.token_store import write_store

    out, step = sys.argv[1], sys.argv[2]

    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)

    if step == "before-swap":      # the new store is complete, nothing swapped yet
        safe_write._swap_in = die
    elif step == "after-swap":     # the new store is in place, the old one not yet removed
        import shutil
        shutil.rmtree = die
    elif step == "mid-records":    # half the records streamed
        def records():
            for i in range(1000):
                if i == 500:
                    die()
                yield [1, 2, 3, i], [1, 1, 1, 1]
        write_store(out, records())
    write_store(out, [([1, 2, 3, i], [1, 1, 1, 1]) for i in range(7)])
""")


@pytest.mark.parametrize("step", ["mid-records", "before-swap", "after-swap"])
def test_a_writer_killed_at_any_step_leaves_a_whole_store(step, tmp_path):
    out = tmp_path / "store"
    write_store(str(out), [([1, 2, 3, i], [1, 1, 1, 1]) for i in range(3)])
    child = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(out), step],
                           cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert len(open_store(str(out))) in ((7,) if step == "after-swap" else (3,))
    assert _siblings(tmp_path), "the killed writer's temporary sibling is still there"
    for name in _siblings(tmp_path):  # the next writer takes it for a killed one's
        os.utime(tmp_path / name, (1, 1))
    write_store(str(out), [([1, 2, 3, i], [1, 1, 1, 1]) for i in range(2)])
    assert len(open_store(str(out))) == 2
    assert _siblings(tmp_path) == []
