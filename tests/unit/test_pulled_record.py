"""The record of what pulls wrote (opsctl/state/pulled.py): a damaged, oversized or planted
record (a link, a FIFO) remembers nothing and never hangs; it is never written through a
link; concurrent pulls each leave their path remembered."""

from __future__ import annotations

import json
import os
import pathlib
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.errors import LocalWriteError
from opsctl.state import pulled


@pytest.fixture
def home(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def _in_time(fn: object) -> list[object]:
    got: list[object] = []

    def go() -> None:
        try:
            got.append(fn())  # type: ignore[operator]
        except BaseException as exc:
            got.append(exc)

    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(10)
    assert not th.is_alive(), "hung"
    return got


def test_a_fifo_as_the_record_remembers_nothing_and_does_not_hang(home):
    os.mkfifo(home / "pulled.json")
    assert _in_time(lambda: pulled.was_pulled("/srv/copy")) == [False]


def test_a_fifo_or_a_link_as_the_lock_is_one_error_never_followed(home, tmp_path):
    os.mkfifo(home / ".pulled.lock")
    (got,) = _in_time(lambda: pulled.remember("/srv/copy"))
    assert isinstance(got, LocalWriteError) and "not a regular file" in str(got)
    (home / ".pulled.lock").unlink()
    (home / ".pulled.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LocalWriteError, match="symbolic link; not followed"):
        pulled.remember("/srv/copy")
    assert not (tmp_path / "elsewhere").exists()


def test_a_link_as_the_record_is_neither_read_nor_written_through(home, tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps({"paths": ["/srv/copy"]}))
    (home / "pulled.json").symlink_to(victim)
    assert not pulled.was_pulled("/srv/copy")
    with pytest.raises(LocalWriteError, match="symbolic link"):
        pulled.remember("/srv/other")
    assert json.loads(victim.read_text()) == {"paths": ["/srv/copy"]}


def test_an_oversized_record_remembers_nothing(home, monkeypatch):
    monkeypatch.setattr(pulled, "MAX_BYTES", 64)
    (home / "pulled.json").write_text(json.dumps({"paths": ["/srv/copy", "/x" * 64]}))
    assert not pulled.was_pulled("/srv/copy")
    pulled.remember("/srv/new")  # rewritten whole, readable again
    monkeypatch.setattr(pulled, "MAX_BYTES", 64 << 20)
    assert pulled.was_pulled("/srv/new")


@settings(max_examples=80, deadline=None)
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(
    lambda b: b.decode("latin-1")), st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                  max_size=4),
        max_leaves=12).map(json.dumps)))
def test_any_damaged_record_reads_as_a_list_of_paths_and_is_rewritten_whole(tmp_path_factory,
                                                                             text):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPSCTL_HOME", str(home))
        (home / "pulled.json").write_text(text, encoding="utf-8", errors="surrogatepass")
        assert pulled.was_pulled("/srv/copy") in (True, False)
        pulled.remember("/srv/copy")
        assert pulled.was_pulled("/srv/copy")
        assert all(isinstance(p, str)
                   for p in json.loads((home / "pulled.json").read_text())["paths"])


def test_concurrent_pulls_each_leave_their_path_remembered(home):
    dests = [f"/srv/copy-{i}" for i in range(8)]
    threads = [threading.Thread(target=pulled.remember, args=(d,)) for d in dests]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(pulled.was_pulled(d) for d in dests)
