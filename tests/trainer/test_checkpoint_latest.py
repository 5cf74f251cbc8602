"""``<run>/latest`` is read as untrusted text: a damaged or planted one (a FIFO, a link, a
path out of the run, an empty line) is an error naming it, never taken for "no checkpoint"
(which would train again from step 0) and never a hang."""

from __future__ import annotations

import os
import pathlib
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from remote_payload.trainer import checkpoint
from remote_payload.trainer.checkpoint import CheckpointError


def _run(tmp: pathlib.Path) -> pathlib.Path:
    run = tmp / "run"
    (run / "ckpt-0000005").mkdir(parents=True)
    (run / "ckpt-0000005" / "meta.json").write_text("{}")
    return run


def test_no_latest_is_a_fresh_start_and_a_good_one_names_its_checkpoint(tmp_path):
    run = _run(tmp_path)
    assert checkpoint.resolve("auto", str(run)) is None
    (run / "latest").write_text("ckpt-0000005\n")
    assert checkpoint.resolve("auto", str(run)) == run / "ckpt-0000005"


@pytest.mark.parametrize("text", ["", "\n", "../other/ckpt-0000005", "/", "ckpt-0000009",
                                  "ckpt-0000005/..", "meta.json"])
def test_a_latest_naming_no_checkpoint_of_this_run_is_an_error_naming_it(tmp_path, text):
    run = _run(tmp_path)
    (run / "latest").write_text(text)
    with pytest.raises(CheckpointError, match=r"latest: names .*remove it to start fresh"):
        checkpoint.resolve("auto", str(run))


@pytest.mark.parametrize("kind", ["fifo", "link", "directory", "huge"])
def test_a_latest_that_is_not_a_small_file_is_an_error_never_a_hang(tmp_path, kind):
    run = _run(tmp_path)
    latest = run / "latest"
    if kind == "fifo":
        os.mkfifo(latest)
    elif kind == "link":
        (tmp_path / "elsewhere").write_text("ckpt-0000005")
        latest.symlink_to(tmp_path / "elsewhere")
    elif kind == "directory":
        latest.mkdir()
    else:
        latest.write_text("ckpt-0000005" + " " * 10_000)
    got: list[BaseException] = []

    def go() -> None:
        try:
            checkpoint.resolve("auto", str(run))
        except BaseException as exc:
            got.append(exc)

    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(10)
    assert not th.is_alive(), "hung on latest"
    assert len(got) == 1 and isinstance(got[0], CheckpointError)
    assert "unreadable" in str(got[0])


@settings(max_examples=150, deadline=None)
@given(text=st.binary(max_size=64))
def test_any_latest_is_its_checkpoint_or_an_error(tmp_path_factory, text):
    run = _run(tmp_path_factory.mktemp("l"))
    (run / "latest").write_bytes(text)
    try:
        got = checkpoint.resolve("auto", str(run))
    except CheckpointError:
        return
    assert got == run / "ckpt-0000005"
