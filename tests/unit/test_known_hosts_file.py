"""A known_hosts file is the user's path: a FIFO, a link to a device, a directory or a huge
file is refused or read quickly, never waited on forever (opsctl/remote/knownhosts.py), and
only the lines for the host being connected to have their keys parsed
(opsctl/remote/transport.py load_known_hosts)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import paramiko
import pytest
from hypothesis import given
from hypothesis import strategies as st

from opsctl.errors import ConfigError, HostKeyError
from opsctl.remote import knownhosts
from opsctl.remote.transport import _for_names, load_known_hosts


def _fifo(tmp_path: Path) -> Path:
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


def _device_link(tmp_path: Path) -> Path:
    p = tmp_path / "zero"
    p.symlink_to("/dev/zero")
    return p


def _directory(tmp_path: Path) -> Path:
    p = tmp_path / "dir"
    p.mkdir()
    return p


@pytest.mark.parametrize("make", [_fifo, _device_link, _directory])
def test_a_known_hosts_that_is_not_a_regular_file_is_refused_at_once(make, tmp_path):
    path = make(tmp_path)
    start = time.monotonic()
    with pytest.raises(HostKeyError) as caught:
        load_known_hosts(paramiko.HostKeys(), path)
    assert caught.value.message == f"known_hosts {path} is not a regular file"
    assert time.monotonic() - start < 2.0, "never blocks on a FIFO nor reads a device"


@pytest.mark.parametrize("make", [_fifo, _device_link, _directory])
def test_push_and_pulls_openssh_client_is_never_run_on_such_a_known_hosts_or_key(make, tmp_path):
    """The OpenSSH client of a push or pull would wait on a FIFO for a writer forever (no
    deadline covers its start) and read ``/dev/zero`` without end: refused as a connection
    of the SSH library refuses it, before anything runs."""
    from opsctl.config.inventory import HostSpec
    from opsctl.remote.transport import openssh_argv

    path = make(tmp_path)
    spec = HostSpec(name="gpu1", address="127.0.0.1", port=1, known_hosts=str(path),
                    enter="direct", root="/srv/opsctl", target={"gpus": 0})
    with pytest.raises(HostKeyError) as caught:
        openssh_argv(spec)
    assert caught.value.message == f"known_hosts {path} is not a regular file"
    # and the same for its identity_file, which the client reads too
    spec = HostSpec(name="gpu1", address="127.0.0.1", port=1, identity_file=str(path),
                    enter="direct", root="/srv/opsctl", target={"gpus": 0})
    with pytest.raises(ConfigError) as refused:
        openssh_argv(spec)
    assert refused.value.message == f"gpu1: identity_file {path} is not a regular file"


def test_every_openssh_client_trusts_only_opsctls_known_hosts(tmp_path):
    """The transfers' client and the interactive one: the user's known_hosts file opsctl
    keeps, never the machine's global one (the SSH library's connections read neither)."""
    from opsctl.config.inventory import HostSpec
    from opsctl.remote.transport import openssh_argv

    kh = tmp_path / "known_hosts"
    kh.write_text("")
    spec = HostSpec(name="gpu1", address="127.0.0.1", port=1, known_hosts=str(kh),
                    enter="direct", root="/srv/opsctl", target={"gpus": 0})
    argv = openssh_argv(spec)
    opts = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-o"]
    assert "GlobalKnownHostsFile=/dev/null" in opts and f"UserKnownHostsFile={kh}" in opts
    assert "StrictHostKeyChecking=yes" in opts
    # and every module that points an OpenSSH client at a known_hosts file turns the global off
    from tests.paths import REPO

    for path in (REPO / "opsctl").rglob("*.py"):
        text = path.read_text()
        if "UserKnownHostsFile=" in text:
            assert "GlobalKnownHostsFile=/dev/null" in text, path


def test_a_known_hosts_over_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(knownhosts, "LIMIT", 1000)
    path = tmp_path / "known_hosts"
    path.write_bytes(b"# x\n" * 300)
    with pytest.raises(HostKeyError, match="is larger than"):
        load_known_hosts(paramiko.HostKeys(), path)


def test_a_missing_or_dangling_known_hosts_is_empty(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert load_known_hosts(paramiko.HostKeys(), tmp_path / "dangling") == 0
    assert load_known_hosts(paramiko.HostKeys(), tmp_path / "absent") == 0




def _key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def test_only_the_named_hosts_lines_are_parsed_plain_or_hashed(tmp_path, capsys):
    mine, other = _key(), _key()
    hashed = paramiko.HostKeys.hash_host("[127.0.0.1]:2222")
    path = tmp_path / "known_hosts"
    path.write_text("\n".join([
        "other.example ssh-ed25519 !!!broken-for-another-host!!!",
        f"other.example {other.get_name()} {other.get_base64()}",
        f"{hashed} {mine.get_name()} {mine.get_base64()}",
        f"alias,[127.0.0.1]:2222 {mine.get_name()} {mine.get_base64()}",
    ]) + "\n")
    keys = paramiko.HostKeys()
    assert load_known_hosts(keys, path, names=["[127.0.0.1]:2222"]) == 0
    assert keys.lookup("[127.0.0.1]:2222")[mine.get_name()] == mine
    assert keys.lookup("other.example") is None
    assert capsys.readouterr().err == "", "another host's broken line is not even read"


def test_a_hundred_thousand_other_hosts_cost_no_more_than_a_second(tmp_path):
    mine = _key()
    blob = f"{mine.get_name()} {mine.get_base64()}"
    lines = [f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256} {blob}" for i in range(100_000)]
    path = tmp_path / "known_hosts"
    path.write_text("\n".join([*lines, f"[127.0.0.1]:2222 {blob}"]) + "\n")
    keys = paramiko.HostKeys()
    start = time.monotonic()
    load_known_hosts(keys, path, names=["[127.0.0.1]:2222"])
    assert time.monotonic() - start < 3.0
    assert keys.lookup("[127.0.0.1]:2222")[mine.get_name()] == mine


def test_thousands_of_broken_lines_are_a_few_warnings_and_a_count(tmp_path, capsys):
    path = tmp_path / "known_hosts"
    path.write_text("h ssh-ed25519 !!!not-base64!!!\n" * 3000)
    assert load_known_hosts(paramiko.HostKeys(), path, names=["h"]) == 3000
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 6 and err[-1] == f"warning: {path}: 2995 more unreadable known_hosts lines ignored"


_FIELD = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=" \t\n\r"),
                 max_size=80)


@given(field=_FIELD, name=st.sampled_from(["h", "[127.0.0.1]:2222", "10.0.0.1"]))
def test_any_host_field_is_matched_or_refused_as_damaged_never_a_crash(field, name):
    hosts = field.split(",")
    try:
        got = _for_names(field, frozenset([name]))
    except ValueError:
        assert any(h.startswith("|1|") for h in hosts), "only a damaged hashed name is refused"
        return
    assert got == (name in hosts) or any(h.startswith("|1|") for h in hosts)
    assert _for_names(f"{field},{name}", frozenset([name]))


@pytest.mark.parametrize("damaged", ["|1|", "|1|!!!|x", "|1|YWJj", "|1|a|b|c"])
def test_a_damaged_hashed_name_is_a_skipped_line_and_lookups_still_work(damaged, tmp_path, capsys):
    mine = _key()
    path = tmp_path / "known_hosts"
    path.write_text(f"{damaged} {mine.get_name()} {mine.get_base64()}\n"
                    f"{paramiko.HostKeys.hash_host('h')} {mine.get_name()} {mine.get_base64()}\n")
    for names in (None, ["h"]):
        keys = paramiko.HostKeys()
        assert load_known_hosts(keys, path, names=names) == 1
        assert keys.lookup("h")[mine.get_name()] == mine, "paramiko's lookup does not trip on it"
    assert f"{path}:1: unreadable known_hosts line ignored (ValueError)" in capsys.readouterr().err


# --- the one appender: a last line without its newline stays a line of its own ------------


def _other_hosts_file(tmp_path: Path, other: paramiko.PKey) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(f"other.example {other.get_name()} {other.get_base64()}")  # no newline
    return path


def _both_whole(path: Path, mine: paramiko.PKey, other: paramiko.PKey, name: str) -> None:
    lines = path.read_text().splitlines()
    assert lines == [f"other.example {other.get_name()} {other.get_base64()}",
                     f"{name} {mine.get_name()} {mine.get_base64()}"]
    assert path.read_text().endswith("\n")
    keys = paramiko.HostKeys()
    assert load_known_hosts(keys, path) == 0, "no line is damaged"
    assert keys.lookup("other.example")[other.get_name()] == other
    assert keys.lookup(name)[mine.get_name()] == mine


def test_host_trust_adds_the_missing_newline_and_keeps_the_other_hosts_entry(tmp_path):
    from opsctl.config.inventory import HostSpec
    from opsctl.ops.hosts import ShownKey, record

    mine, other = _key(), _key()
    path = _other_hosts_file(tmp_path, other)
    spec = HostSpec(name="h", address="127.0.0.1", port=2222, known_hosts=str(path))
    assert record(ShownKey(spec, mine, "SHA256:x", trusted=False)) == path
    _both_whole(path, mine, other, "[127.0.0.1]:2222")


def test_accept_new_host_key_adds_the_missing_newline_and_keeps_the_other_hosts_entry(tmp_path):
    from opsctl.remote.transport import _make_policy

    mine, other = _key(), _key()
    path = _other_hosts_file(tmp_path, other)
    _make_policy(path, None, True, "h").missing_host_key(None, "[127.0.0.1]:2222", mine)
    _both_whole(path, mine, other, "[127.0.0.1]:2222")


def test_the_appender_keeps_the_files_inode_and_mode_and_adds_nothing_else(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text("a ssh-ed25519 AAAA\n")
    path.chmod(0o600)
    before = path.stat()
    knownhosts.append(path, "b ssh-ed25519 BBBB", what="b's key")
    after = path.stat()
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert path.read_text() == "a ssh-ed25519 AAAA\nb ssh-ed25519 BBBB\n"


def test_a_missing_known_hosts_and_its_folder_are_made(tmp_path):
    path = tmp_path / "home" / ".ssh" / "known_hosts"
    knownhosts.append(path, "b ssh-ed25519 BBBB", what="b's key")
    assert path.read_text() == "b ssh-ed25519 BBBB\n"
    assert (path.parent.stat().st_mode & 0o777) == 0o700


def test_the_appender_never_writes_through_a_link_nor_into_a_fifo(tmp_path):
    real = tmp_path / "real"
    real.write_text("a ssh-ed25519 AAAA\n")
    link = tmp_path / "known_hosts"
    link.symlink_to(real)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "elsewhere")
    for path, words in ((link, "symbolic link"), (dangling, "symbolic link"),
                        (_fifo(tmp_path), "not a regular file")):
        start = time.monotonic()
        with pytest.raises(HostKeyError) as caught:
            knownhosts.append(path, "b ssh-ed25519 BBBB", what="b's key")
        assert words in caught.value.message and "nothing was recorded" in caught.value.message
        assert time.monotonic() - start < 2.0
    assert real.read_text() == "a ssh-ed25519 AAAA\n"
    assert not (tmp_path / "elsewhere").exists()


def test_accept_new_into_a_linked_known_hosts_is_a_host_key_error_and_nothing_is_run(tmp_path):
    from opsctl.remote.transport import _make_policy

    real = tmp_path / "real"
    real.write_text("")
    link = tmp_path / "known_hosts"
    link.symlink_to(real)
    with pytest.raises(HostKeyError) as caught:
        _make_policy(link, None, True, "h").missing_host_key(None, "[127.0.0.1]:2222", _key())
    assert caught.value.message.startswith("cannot record the host key of [127.0.0.1]:2222")
    assert "nothing was run" in caught.value.message
    assert real.read_text() == ""


@given(text=st.text(alphabet="ab \n", max_size=40))
def test_whatever_the_file_ends_with_the_new_line_is_a_line_of_its_own(text):
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        path = Path(where) / "known_hosts"
        path.write_text(text)
        knownhosts.append(path, "new ssh-ed25519 NNNN", what="a key")
        got = path.read_text()
        assert got.startswith(text) and got.endswith("\n")
        assert got.splitlines()[-1] == "new ssh-ed25519 NNNN"
        assert got.splitlines()[:-1] == text.splitlines()
