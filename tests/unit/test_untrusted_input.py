"""Untrusted input never crashes or hangs opsctl: hostile files, flags,
playbooks and known_hosts lines are refused locally, with exit 2 and one line naming the
file:line or flag — nothing reaches a remote host (these tests never contact one)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import paramiko
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl import errors
from opsctl.cli import cli
from opsctl.config import inventory, playbook, yamlfile
from opsctl.config.inventory import HostSpec
from opsctl.errors import ConfigError
from opsctl.remote.command import MAX_COMMAND_BYTES
from opsctl.remote.transport import Remote, load_known_hosts
from tests.cli_runner import run_cli

# Port 9 on loopback has nothing behind it; these tests must fail before any connect anyway.
UNREACHABLE = "127.0.0.1:9"


def write(tmp_path: Path, text: str | bytes, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(textwrap.dedent(text))
    return p


def invoke(*args: str) -> tuple[int, str, str]:
    res = run_cli(*args)
    return res.exit_code, res.stdout, res.stderr


class TestYamlFiles:
    def test_an_alias_bomb_is_refused_at_its_first_alias(self, tmp_path):
        lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
        lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
        p = write(tmp_path, "\n".join(lines) + "\n")
        with pytest.raises(ConfigError) as exc:
            yamlfile.load(p)
        assert exc.value.message.startswith(f"{p}:2: ") and "aliases" in exc.value.message

    @pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
    def test_a_device_or_fifo_is_refused_without_reading_it(self, tmp_path, special):
        path = Path(special) if special.startswith("/") else tmp_path / special
        if special == "fifo":
            os.mkfifo(path)  # nobody writes: reading it would block forever
        with pytest.raises(ConfigError) as exc:
            playbook.load(path)
        assert "not a regular file" in exc.value.message

    def test_a_huge_file_is_refused_after_reading_at_most_the_limit(self, tmp_path):
        p = write(tmp_path, b"# x\n" * (yamlfile.MAX_BYTES // 4 + 1))
        with pytest.raises(ConfigError) as exc:
            yamlfile.load(p)
        assert "larger than" in exc.value.message

    def test_deep_nesting_is_refused_not_a_recursion_traceback(self, tmp_path):
        p = write(tmp_path, "[" * 50000)
        with pytest.raises(ConfigError) as exc:
            yamlfile.load(p)
        assert str(p) in exc.value.message

    def test_a_non_utf8_playbook_names_the_line(self, tmp_path):
        p = write(tmp_path, b"name: x\ncommand: [caf\xe9]\n")
        with pytest.raises(ConfigError) as exc:
            playbook.load(p)
        assert exc.value.message.startswith(f"{p}:2: not UTF-8")

    def test_a_duplicate_key_is_refused_with_both_lines(self, tmp_path):
        p = write(tmp_path, """
            name: x
            command: [a]
            env:
              A: "1"
              A: "2"
        """)
        with pytest.raises(ConfigError) as exc:
            playbook.load(p)
        assert exc.value.message.startswith(f"{p}:6: duplicate key 'A' (first at line 5)")

    def test_a_non_utf8_inventory_is_one_clear_line_for_every_command(self, tmp_path, isolated_env):
        inv = isolated_env / "inventory"
        inv.mkdir(parents=True, exist_ok=True)
        write(inv, b"hosts:\n  h:\n    address: \xff\n", "bad.yaml")
        code, _, err = invoke("hosts")
        assert code == errors.USAGE
        assert f"{inv / 'bad.yaml'}:3: not UTF-8" in err and "Traceback" not in err


class TestPlaybookFields:
    @pytest.mark.parametrize(("fields", "problem"), [
        ('command: [""]', "command[0] is empty"),
        ('command: [a]\nenv: {"BAD-NAME": "1"}', "env names must match"),
        ('command: [a]\nenv: {"": "1"}', "env names must match"),
        ('command: ["a\\0b"]', "NUL bytes cannot be passed to a process: command[0]"),
        ('command: [a]\nenv: {A: "x\\0y"}', "NUL bytes cannot be passed to a process: env.A"),
        (f'command: [a, "{"x" * 60000}"]', "fit on the launch command line"),
    ])
    def test_what_the_remote_wrapper_would_crash_on_is_refused_locally(self, tmp_path, fields, problem):
        p = write(tmp_path, "name: x\n" + fields + "\n")
        with pytest.raises(ConfigError) as exc:
            playbook.load(p)
        assert problem in exc.value.message

    def test_deploy_of_such_a_playbook_exits_2_before_connecting(self, tmp_path):
        p = write(tmp_path, 'name: x\ncommand: [""]\n')
        code, _, err = invoke("deploy", "--host", UNREACHABLE, "--ct", "200", "--playbook", str(p))
        assert code == errors.USAGE, err
        assert "command[0] is empty" in err


class TestHostFlag:
    @pytest.mark.parametrize(("host", "problem"), [
        ("host:99999", "port 99999 is out of range"),
        ("host:0", "port 0 is out of range"),
        ("a..b", "not a valid host name"),
        ("-oProxyCommand=x", "not in the inventory and not an address"),
        ("-a.b", "not a valid host name"),
        ("[::1]:99999", "port 99999 is out of range"),
        ("[zz::q]:22", "not in the inventory and not an address"),
        ("1.2.3.999", "not a valid IP address"),
    ])
    def test_a_malformed_host_is_a_usage_error(self, host, problem):
        code, _, err = invoke("status", "--host", host, "--ct", "200")
        assert code == errors.USAGE, err
        assert problem in err and "Traceback" not in err

    @pytest.mark.parametrize(("host", "address", "port"), [
        ("[::1]:2222", "::1", 2222),
        ("[127.0.0.1]:2222", "127.0.0.1", 2222),  # the form known_hosts and key hints use
        ("admin@localhost", "localhost", 22),  # a DNS name must be configured
    ])
    def test_bracketed_and_plain_addresses_parse(self, host, address, port):
        spec = inventory.load([]).resolve(host)
        assert (spec.address, spec.port) == (address, port)

    def test_an_inventory_address_is_checked_too(self, tmp_path):
        write(tmp_path, "hosts:\n  h:\n    address: a..b\n", "inv.yaml")
        with pytest.raises(ConfigError) as exc:
            inventory.load([tmp_path])
        assert f"{tmp_path / 'inv.yaml'}:3: hosts.h.address" in exc.value.message


class TestOptionValues:
    @pytest.mark.parametrize("args", [
        ["exec", "--timeout", "nan", "--", "true"],
        ["exec", "--timeout", "-1", "--", "true"],
        ["exec", "--timeout", "inf", "--", "true"],
        ["stop", "--grace", "nan"],
        ["stop", "--grace", "-1"],
        ["status", "--poll", "0"],
        ["status", "--lines", "-1"],
        ["logs", "--offset", "-5"],
        ["status", "--job", "../../etc"],
        ["stop", "--job", "-rf"],
    ])
    def test_a_bad_value_is_refused_with_exit_2_before_connecting(self, args):
        code, _, err = invoke(*args[:1], "--host", UNREACHABLE, "--ct", "200", *args[1:])
        assert code == errors.USAGE, err
        assert "Invalid value" in err

    def test_a_usage_error_with_json_still_prints_the_error_document(self):
        code, out, _ = invoke("status", "--json", "--host", UNREACHABLE, "--ct", "200", "--poll", "nan")
        assert code == errors.USAGE
        doc = json.loads(out)
        assert doc["ok"] is False and doc["error"]["exit_code"] == errors.USAGE
        assert "--poll" in doc["error"]["message"]

    def test_an_unknown_option_with_json_prints_one_document_in_a_nested_group(self):
        code, out, _ = invoke("sandbox", "status", "--json", "--bogus")
        assert code == errors.USAGE
        assert json.loads(out)["error"]["type"] == "UsageError"


class TestRemoteArgv:
    def remote(self) -> Remote:
        return Remote(HostSpec(name="nowhere", address="127.0.0.1", port=9), use_mux=False)

    def test_a_nul_byte_in_argv_is_refused_before_connecting(self):
        with pytest.raises(ConfigError) as exc:
            self.remote().pct_exec(200, ["echo", "a\0b"])
        assert "NUL" in exc.value.message and "nothing was sent" in exc.value.message

    def test_a_command_over_the_remote_limit_is_refused_before_connecting(self):
        with pytest.raises(ConfigError) as exc:
            self.remote().pct_exec(200, ["echo", "x" * MAX_COMMAND_BYTES])
        assert f"over the {MAX_COMMAND_BYTES} bytes" in exc.value.message

    def test_exec_with_960_kb_of_argv_exits_2(self):
        code, _, err = invoke("exec", "--host", UNREACHABLE, "--ct", "200", "--", "echo",
                              *(["y" * 1000] * 960))
        assert code == errors.USAGE, err


class TestKnownHosts:
    def test_malformed_lines_for_other_hosts_are_skipped_with_a_warning(self, tmp_path, capsys):
        key = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else None
        good = key or paramiko.RSAKey.generate(1024)
        kh = write(tmp_path, "\n".join([
            "other.example ssh-ed25519 !!!not-base64!!!",
            "third.example ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQ",  # a truncated key blob
            "\xff\xfe garbage",
            f"[127.0.0.1]:2222 {good.get_name()} {good.get_base64()}",
        ]) + "\n", "known_hosts")
        keys = paramiko.HostKeys()
        skipped = load_known_hosts(keys, kh)
        assert skipped >= 2
        assert keys.lookup("[127.0.0.1]:2222")[good.get_name()] == good
        assert f"{kh}:1: unreadable known_hosts line ignored" in capsys.readouterr().err

    def test_marker_lines_are_understood_not_reported_as_broken(self, tmp_path, capsys):
        a, b = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)
        kh = write(tmp_path, "\n".join([
            f"@cert-authority *.example {a.get_name()} {a.get_base64()}",
            f"@revoked * {b.get_name()} {b.get_base64()}",
        ]) + "\n", "known_hosts")
        keys, revoked = paramiko.HostKeys(), []
        assert load_known_hosts(keys, kh, revoked) == 0
        assert revoked == [b] and len(keys) == 0
        assert capsys.readouterr().err == ""


class TestExecRefusals:
    """What would reach the host is refused here (exit 2, nothing sent:
    the host is 127.0.0.1:9, so a connect attempt would be exit 10)."""

    @pytest.mark.parametrize("ct", ["99999999999999999999", "99", "0", "-5", "1000000000", "2_00",
                                    " 200", "+200", "２００", "0x100", "", "1e3", "9" * 5000, "x" * 5000])
    def test_exec_refuses_absurd_ct_and_empty_argv_locally(self, ct):
        code, _, err = invoke("exec", "--host", UNREACHABLE, "--ct", ct, "--", "true")
        assert code == errors.USAGE, err
        assert "Invalid value for '--ct'" in err and "Traceback" not in err
        assert len(err) < 400, "one clear line, not the whole value"

    @pytest.mark.parametrize("argv, says", [
        ([""], "program name (argument 0) is empty"),
        (["", "x"], "program name (argument 0) is empty"),
        (["echo", "a\0b"], "argument 1 contains a NUL byte"),
        (["\0"], "argument 0 contains a NUL byte"),
    ])
    def test_an_empty_program_or_a_nul_byte_is_refused_before_connecting(self, argv, says):
        code, _, err = invoke("exec", "--host", UNREACHABLE, "--ct", "200", "--", *argv)
        assert code == errors.USAGE, err
        assert says in err and "nothing was sent" in err

    @pytest.mark.parametrize("command", [["status"], ["jobs"], ["stop", "-y"], ["logs"]])
    def test_every_command_taking_ct_uses_the_same_rule(self, command):
        code, _, err = invoke(*command, "--host", UNREACHABLE, "--ct", "99999999999999999999")
        assert code == errors.USAGE, err
        assert "100-999999999" in err

    def test_an_inventory_container_id_out_of_range_is_refused(self, tmp_path):
        p = write(tmp_path, "hosts:\n  h:\n    address: 127.0.0.1\n    containers:\n"
                            "      99999999999: {gpus: 1}\n", "inv.yaml")
        with pytest.raises(ConfigError, match="100-999999999"):
            inventory.load([tmp_path])
        assert p.exists()

    @settings(max_examples=300, deadline=None)
    @given(text=st.text(max_size=30))
    def test_any_ct_text_is_an_id_in_range_or_a_usage_error(self, text):
        from opsctl.config.ctid import MAX_CTID, MIN_CTID, parse_ctid

        try:
            got = parse_ctid(text)
        except ConfigError as exc:
            assert "--ct" in exc.message
            assert not (text.isascii() and text.isdigit() and MIN_CTID <= int(text) <= MAX_CTID)
        else:
            assert MIN_CTID <= got <= MAX_CTID and got == int(text)

    @settings(max_examples=100, deadline=None)
    @given(text=st.text(st.characters(blacklist_characters="\0"), max_size=24))
    def test_any_ct_on_the_command_line_never_tracebacks(self, text):
        res = CliRunner().invoke(cli, ["jobs", "--host", UNREACHABLE, "--ct", text])
        assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
        assert res.exit_code in (errors.USAGE, errors.TRANSPORT), res.output

    @settings(max_examples=300, deadline=None)
    @given(argv=st.lists(st.text(max_size=12), max_size=5))
    def test_any_exec_argv_is_run_as_given_or_refused_with_its_reason(self, argv):
        from opsctl.remote.command import check_argv

        try:
            got = check_argv("h", "exec", argv)
        except ConfigError as exc:
            assert not argv or argv[0] == "" or any("\0" in a for a in argv)
            assert "nothing" in exc.message
        else:
            assert got == argv and argv[0] and not any("\0" in a for a in argv)
