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

from opsctl.errors import HostKeyError
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
