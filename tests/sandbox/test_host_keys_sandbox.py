"""Host keys against real sshds: `host trust` records exactly the key
it showed, from one connection; the unknown-key hint names a `--host` that `host trust`
accepts; a malformed known_hosts line for another host does not stop any command."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from opsctl import errors
from tests.cli_runner import run_cli as run
from tests.second_sshd import SwitchingProxy, second_sshd

pytestmark = pytest.mark.sandbox


def write_inventory(isolated_env: Path, sandbox, **host: object) -> None:
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    doc = {"hosts": {"h": {"address": "127.0.0.1", "user": "root",
                           "identity_file": str(sandbox.identity_file), "containers": {200: {}},
                           **host}}}
    (inv / "h.yaml").write_text(yaml.safe_dump(doc))


def test_trust_records_exactly_the_key_it_showed_even_if_the_server_swaps_it_after(
        sandbox, isolated_env, tmp_path, monkeypatch):
    monkeypatch.setattr("opsctl.cli.app.interactive", lambda: True)  # a person answers "y"
    known = tmp_path / "known_hosts"
    with second_sshd(sandbox, tmp_path / "other") as other:
        # connection 1 reaches the sandbox sshd; every later one reaches a server with another key
        proxy = SwitchingProxy(first=sandbox.port, then=other.port)
        try:
            write_inventory(isolated_env, sandbox, port=proxy.port, known_hosts=str(known))
            res = run("host", "trust", "--host", "h", input="y\n")
            assert res.exit_code == 0, res.output
            assert sandbox.host_key_fingerprint in res.output
            assert proxy.connections == 1  # shown and recorded from the same connection
            recorded = known.read_text().split()
            sandbox_key = (sandbox.state_dir / "ssh_host_ed25519_key.pub").read_text().split()[1]
            assert recorded == [f"[127.0.0.1]:{proxy.port}", "ssh-ed25519", sandbox_key]
            # the swapped server is now refused, not trusted behind the user's "y"
            res = run("exec", "--host", "h", "--ct", "200", "--", "true")
            assert res.exit_code == errors.HOST_KEY and "CHANGED" in res.output
        finally:
            proxy.close()


def test_trust_of_an_already_known_key_says_so_and_records_nothing(sandbox, isolated_env, tmp_path):
    known = tmp_path / "known_hosts"
    shutil.copy(sandbox.known_hosts_file, known)
    write_inventory(isolated_env, sandbox, port=sandbox.port, known_hosts=str(known))
    before = known.read_text()
    res = run("host", "trust", "--host", "h", "--yes")
    assert res.exit_code == 0 and "already trusted" in res.output
    assert known.read_text() == before


def test_the_unknown_key_hint_names_a_host_that_trust_accepts(sandbox, isolated_env, tmp_path,
                                                               monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sandbox.identity_file, home / ".ssh" / "id_ed25519")
    monkeypatch.setenv("HOME", str(home))  # a bare address uses ~/.ssh/known_hosts
    bare = f"127.0.0.1:{sandbox.port}"
    res = run("exec", "--host", bare, "--ct", "200", "--", "true")
    assert res.exit_code == errors.HOST_KEY
    hint = res.output.split("opsctl host trust --host ", 1)[1].split("`", 1)[0]
    res = run("host", "trust", "--host", hint, "--yes")
    assert res.exit_code == 0, res.output
    assert run("exec", "--host", bare, "--ct", "200", "--", "true").exit_code == 0
    # the known_hosts spelling of the same host is accepted too
    res = run("host", "trust", "--host", f"[127.0.0.1]:{sandbox.port}", "--yes")
    assert res.exit_code == 0 and "already trusted" in res.output


def test_a_malformed_known_hosts_line_for_another_host_does_not_stop_commands(
        sandbox, isolated_env, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("other.example ssh-ed25519 !!!not-base64!!!\n" + sandbox.known_hosts_file.read_text())
    write_inventory(isolated_env, sandbox, port=sandbox.port, known_hosts=str(known))
    res = run("exec", "--host", "h", "--ct", "200", "--", "sh", "-c", "exit 7")
    assert res.exit_code == 7, res.output
    assert "unreadable" not in res.stderr, "another host's line is not even parsed (as OpenSSH)"


def test_a_malformed_line_for_the_host_itself_is_named_and_the_host_is_unknown(
        sandbox, isolated_env, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sandbox.port} ssh-ed25519 !!!not-base64!!!\n")
    write_inventory(isolated_env, sandbox, port=sandbox.port, known_hosts=str(known))
    res = run("exec", "--host", "h", "--ct", "200", "--", "true")
    assert res.exit_code == errors.HOST_KEY, res.output
    assert f"{known}:1: unreadable known_hosts line ignored" in res.stderr
    assert "is not in" in res.output


def test_a_key_marked_revoked_is_refused(sandbox, isolated_env, tmp_path):
    known = tmp_path / "known_hosts"
    key = (sandbox.state_dir / "ssh_host_ed25519_key.pub").read_text().split()
    known.write_text(sandbox.known_hosts_file.read_text() + f"@revoked * {key[0]} {key[1]}\n")
    write_inventory(isolated_env, sandbox, port=sandbox.port, known_hosts=str(known))
    res = run("exec", "--host", "h", "--ct", "200", "--", "true")
    assert res.exit_code == errors.HOST_KEY, res.output
    assert "@revoked" in res.output


def test_accept_new_into_a_known_hosts_that_cannot_be_written_is_a_host_key_error_not_a_connect_one(
        sandbox, isolated_env):
    # procfs: a regular file to stat and read, that refuses every write (root included)
    write_inventory(isolated_env, sandbox, port=sandbox.port, known_hosts="/proc/version")
    res = run("exec", "--accept-new-host-key", "--host", "h", "--ct", "200", "--", "true")
    assert res.exit_code == errors.HOST_KEY, res.output
    assert "cannot record the host key of [127.0.0.1]:" in res.output
    assert "in /proc/version" in res.output and "nothing was run" in res.output


OTHER_HOST = "other.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.mark.parametrize("how", ["host trust", "--accept-new-host-key"])
def test_a_key_recorded_after_a_last_line_without_newline_keeps_both_entries_whole(
        how, sandbox, isolated_env, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(OTHER_HOST)  # a hand edit left no newline at the end
    write_inventory(isolated_env, sandbox, port=sandbox.port, known_hosts=str(known))
    if how == "host trust":
        res = run("host", "trust", "--host", "h", "--yes")
    else:
        res = run("exec", "--accept-new-host-key", "--host", "h", "--ct", "200", "--", "true")
    assert res.exit_code == 0, res.output
    sandbox_key = (sandbox.state_dir / "ssh_host_ed25519_key.pub").read_text().split()[1]
    assert known.read_text().splitlines() == [
        OTHER_HOST, f"[127.0.0.1]:{sandbox.port} ssh-ed25519 {sandbox_key}"]
    res = run("exec", "--host", "h", "--ct", "200", "--", "true")
    assert res.exit_code == 0, res.output
    assert "unreadable" not in res.stderr
