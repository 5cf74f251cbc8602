"""``swap-torch --dry-run`` of a wheelhouse build checks, from this machine, the index its
wheels would be downloaded from (``download_index_url``, else the build's ``index_url``):
it answers and has the version, within a time bound; whatever the index serves, the answer
is a fact or one TorchEnvError, never a traceback or a false "ok". It looks up no host name:
an index on a named host is "not checked here". Local ``file:`` indexes and a loopback socket
only."""

from __future__ import annotations

import ipaddress
import socket
import time
import typing as t
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.config.torch_builds import TorchBuild
from opsctl.errors import ConfigError, TorchEnvError
from opsctl.ops.torch import check_wheelhouse_index


def _index(root: Path, page: str | bytes) -> str:
    (root / "torch").mkdir(parents=True, exist_ok=True)
    data = page.encode() if isinstance(page, str) else page
    (root / "torch" / "index.html").write_bytes(data)
    return root.as_uri()


def _build(index: str, version: str = "2.13.0", *, download: str | None = None) -> TorchBuild:
    return TorchBuild("cpu", version, index, wheelhouse=True, download_index_url=download)


_HAS_2_13 = '<a href="torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl">w</a>'


def test_an_index_with_the_version_is_a_checked_fact(tmp_path):
    fact = check_wheelhouse_index(_build(_index(tmp_path, _HAS_2_13)))
    assert "2.13.0+cpu" in fact


def test_an_index_without_the_version_is_refused_and_lists_what_it_has(tmp_path):
    with pytest.raises(TorchEnvError, match=r"torch 9\.9\.9\+cpu is not on .*2\.13\.0\+cpu"):
        check_wheelhouse_index(_build(_index(tmp_path, _HAS_2_13), "9.9.9"))


def test_the_download_index_is_the_one_checked_not_the_containers(tmp_path):
    good = _index(tmp_path / "good", _HAS_2_13)
    empty = _index(tmp_path / "empty", "<html>nothing</html>")
    assert check_wheelhouse_index(_build(empty, download=good))
    with pytest.raises(TorchEnvError, match="is not on"):
        check_wheelhouse_index(_build(good, download=empty))


@pytest.mark.parametrize("where", ["missing", "a file", "no torch dir"])
def test_an_index_that_is_not_there_is_refused(tmp_path, where):
    target = tmp_path / "idx"
    if where == "a file":
        target.write_text("x")
    elif where == "no torch dir":
        target.mkdir()
    with pytest.raises(TorchEnvError, match="cannot reach"):
        check_wheelhouse_index(_build(target.as_uri()))


def test_an_index_that_refuses_connections_is_refused_quickly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens
    with pytest.raises(TorchEnvError, match="cannot reach"):
        check_wheelhouse_index(_build(f"http://127.0.0.1:{port}/simple"))


def test_a_mute_index_is_a_bounded_wait_not_a_hang():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts, never answers
        started = time.monotonic()
        with pytest.raises(TorchEnvError, match="cannot reach"):
            check_wheelhouse_index(_build(f"http://127.0.0.1:{listener.getsockname()[1]}/s"),
                                   timeout_s=0.5)
    assert time.monotonic() - started < 10


def test_an_index_url_with_another_scheme_is_refused(tmp_path):
    with pytest.raises(ConfigError):
        check_wheelhouse_index(_build("ftp://127.0.0.1/simple"))


@pytest.mark.parametrize("page", [b"\0" * 10000, b"\xff\xfe<a href=torch-", b"x" * 3_000_000,
                                  b'<a href="torch--.whl">', b'<a href="torch-2.13.0+cpu">'])
def test_a_hostile_page_is_refused_never_a_traceback(tmp_path, page):
    with pytest.raises(TorchEnvError, match="is not on"):
        check_wheelhouse_index(_build(_index(tmp_path, page)))


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_any_page_is_a_fact_or_one_torch_env_error(tmp_path_factory, page):
    root = tmp_path_factory.mktemp("idx")
    try:
        fact = check_wheelhouse_index(_build(_index(root, page)))
    except TorchEnvError as exc:
        assert "nothing was changed" in str(exc)
    else:
        assert "2.13.0+cpu" in fact


@pytest.fixture
def no_lookups(monkeypatch):
    """A resolver that fails the test if anything looks a name up (the calls are kept too, so a
    caller that swallows the error still fails it)."""
    calls: list[tuple[object, ...]] = []
    real_getaddrinfo = socket.getaddrinfo

    def refuse(*args: object, **kwargs: object) -> t.NoReturn:
        calls.append(args)
        raise AssertionError(f"a dry run looked up a host name: {args[:2]}")

    def numeric_only(host: str, *args: t.Any, **kwargs: t.Any) -> t.Any:
        try:  # an IP literal is no lookup: the socket module passes those through too
            ipaddress.ip_address(host)
        except ValueError:
            refuse(host, *args)
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", numeric_only)
    monkeypatch.setattr(socket, "gethostbyname", refuse)
    monkeypatch.setattr(socket, "gethostbyname_ex", refuse)
    yield calls
    assert calls == []


@pytest.mark.parametrize("index", ["https://download.pytorch.org/whl/cpu",
                                   "http://mirror.internal:8080/simple", "https://localhost/simple"])
def test_a_dry_run_looks_up_no_host_name_and_says_the_index_was_not_checked(no_lookups, index):
    fact = check_wheelhouse_index(_build("file:///nowhere", download=index))
    assert fact.startswith("not checked here") and "looks up no host names" in fact
    fact = check_wheelhouse_index(_build(index))
    assert fact.startswith("not checked here")


def test_an_index_on_an_ip_literal_is_still_checked_without_a_lookup(no_lookups):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens
    with pytest.raises(TorchEnvError, match="cannot reach"):
        check_wheelhouse_index(_build(f"http://127.0.0.1:{port}/simple"))
