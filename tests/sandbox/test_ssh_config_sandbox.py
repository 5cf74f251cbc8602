"""A `--host` that is an alias in ~/.ssh/config: its HostName, User, Port,
IdentityFile and ProxyJump are honoured unless the inventory or `--host` sets them; the
jump host's key is checked like any other. HOME is a temporary directory here."""

from __future__ import annotations

import shutil
import socket
import textwrap
import time

import pytest
import yaml
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from opsctl.config import inventory
from opsctl.errors import ConfigError
from tests.second_sshd import SwitchingProxy


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    return h


def ssh_config(home, text: str) -> None:
    (home / ".ssh" / "config").write_text(textwrap.dedent(text))


class TestPrecedence:
    def test_an_alias_gets_hostname_user_port_and_identity_from_the_config(self, home):
        ssh_config(home, """
            Host box
              HostName 127.0.0.1
              User admin
              Port 2222
              IdentityFile ~/.ssh/box_key
              ProxyJump jumper@127.0.0.1:2200
        """)
        spec = inventory.load([]).resolve("box")
        assert (spec.address, spec.user, spec.port) == ("127.0.0.1", "admin", 2222)
        assert spec.identity_file == str(home / ".ssh" / "box_key")
        assert spec.proxy_jump == "jumper@127.0.0.1:2200"

    def test_user_and_port_in_host_win_over_the_config(self, home):
        ssh_config(home, "Host box\n  HostName 127.0.0.1\n  User admin\n  Port 2222\n")
        spec = inventory.load([]).resolve("ops@box:2022")
        assert (spec.address, spec.user, spec.port) == ("127.0.0.1", "ops", 2022)

    def test_inventory_fields_win_over_the_config_and_unset_ones_come_from_it(self, home, tmp_path):
        ssh_config(home, "Host box\n  HostName 127.0.0.1\n  User admin\n  Port 2222\n")
        inv = tmp_path / "inv"
        inv.mkdir()
        (inv / "h.yaml").write_text("hosts:\n  h:\n    address: box\n    user: root\n")
        spec = inventory.load([inv]).resolve("h")
        assert (spec.address, spec.user, spec.port) == ("127.0.0.1", "root", 2222)

    def test_without_a_matching_entry_the_defaults_stay(self, home):
        ssh_config(home, "Host other\n  User admin\n")
        spec = inventory.load([]).resolve("10.9.9.9")
        assert (spec.address, spec.user, spec.port, spec.proxy_jump) == ("10.9.9.9", "root", 22, None)

    def test_a_wildcard_host_block_applies_too(self, home):
        ssh_config(home, "Host *.lab !skip.lab\n  User labber\n")
        assert inventory.load([]).resolve("a.lab").user == "labber"
        # excluded from the block, in no inventory, not an address: never looked up
        with pytest.raises(ConfigError, match=r"unknown host 'skip\.lab'"):
            inventory.load([]).resolve("skip.lab")

    def test_a_catch_all_host_block_configures_no_name(self, home):
        ssh_config(home, "Host *\n  User everyone\n")
        with pytest.raises(ConfigError, match="unknown host 'nosuch'"):
            inventory.load([]).resolve("nosuch")
        assert inventory.load([]).resolve("127.0.0.1").user == "everyone"


@pytest.mark.sandbox
class TestAgainstTheSandbox:
    @pytest.fixture
    def alias(self, sandbox, isolated_env, home):
        shutil.copy(sandbox.known_hosts_file, home / ".ssh" / "known_hosts")
        ssh_config(home, f"""
            Host sbx
              HostName 127.0.0.1
              User root
              Port {sandbox.port}
              IdentityFile {sandbox.identity_file}
        """)
        return "sbx"

    def test_exec_reaches_the_container_through_the_alias(self, alias):
        res = CliRunner().invoke(cli, ["exec", "--host", alias, "--ct", "200", "--", "sh", "-c", "exit 5"])
        assert res.exit_code == 5, res.output

    def test_proxyjump_goes_through_the_jump_host_and_checks_its_key(self, sandbox, alias, home):
        jump = SwitchingProxy(first=sandbox.port, then=sandbox.port)  # counts connections
        try:
            with open(home / ".ssh" / "config", "a", encoding="utf-8") as f:
                f.write(f"Host via-jump\n  HostName 127.0.0.1\n  User root\n  Port {sandbox.port}\n"
                        f"  IdentityFile {sandbox.identity_file}\n"
                        f"  ProxyJump root@127.0.0.1:{jump.port}\n")
            # the jump host's key is unknown: refused, like any host
            res = CliRunner().invoke(cli, ["exec", "--host", "via-jump", "--ct", "200", "--", "true"])
            assert res.exit_code == errors.HOST_KEY, res.output
            key = (sandbox.state_dir / "ssh_host_ed25519_key.pub").read_text().split()
            with open(home / ".ssh" / "known_hosts", "a", encoding="utf-8") as f:
                f.write(f"[127.0.0.1]:{jump.port} {key[0]} {key[1]}\n")
            # the jump host authenticates with the target's IdentityFile only if it is given: use
            # the alias-independent default key location
            shutil.copy(sandbox.identity_file, home / ".ssh" / "id_ed25519")
            before = jump.connections
            res = CliRunner().invoke(cli, ["exec", "--host", "via-jump", "--ct", "200", "--",
                                           "sh", "-c", "exit 6"])
            assert res.exit_code == 6, res.output
            assert jump.connections == before + 1
        finally:
            jump.close()

    def test_a_target_behind_a_jump_that_never_speaks_ssh_is_named_within_its_timeout(
            self, sandbox, alias, home, isolated_env):
        shutil.copy(sandbox.identity_file, home / ".ssh" / "id_ed25519")  # the hop's key
        with socket.create_server(("127.0.0.1", 0)) as mute:  # the kernel accepts; nobody speaks
            inv = isolated_env / "inventory"
            inv.mkdir(parents=True, exist_ok=True)
            (inv / "m.yaml").write_text(yaml.safe_dump({"hosts": {"m": {
                "address": "127.0.0.1", "port": mute.getsockname()[1], "connect_timeout_s": 2,
                "proxy_jump": f"root@127.0.0.1:{sandbox.port}",
                "known_hosts": str(home / ".ssh" / "known_hosts"), "containers": {200: {}}}}}))
            start = time.monotonic()
            res = CliRunner().invoke(cli, ["status", "--json", "--host", "m", "--ct", "200"])
            took = time.monotonic() - start
        assert res.exit_code == errors.TRANSPORT, res.output
        assert "or a ProxyJump hop (root@127.0.0.1:" in res.output
        assert "accepted the connection but never spoke SSH (no SSH banner within 2 s)" in res.output
        assert took < 20, f"bounded by the 2 s connect timeout (and the hop's login): {took:.1f} s"

    def test_an_inventory_with_the_alias_as_address_uses_the_config(self, alias, isolated_env):
        inv = isolated_env / "inventory"
        inv.mkdir(parents=True, exist_ok=True)
        (inv / "a.yaml").write_text(yaml.safe_dump({"hosts": {"a": {"address": alias,
                                                                    "containers": {200: {}}}}}))
        res = CliRunner().invoke(cli, ["exec", "--host", "a", "--ct", "200", "--", "true"])
        assert res.exit_code == 0, res.output


def test_an_alias_with_an_underscore_is_a_host_name(home):
    ssh_config(home, "Host my_box\n  HostName 127.0.0.1\n  Port 2201\n")
    spec = inventory.load([]).resolve("my_box")
    assert (spec.address, spec.port) == ("127.0.0.1", 2201)
