"""opsctl on a host the way Proxmox really is: a non-root user with a pct-only sudoers rule,
an old pve-container, pct or a container's command missing. Each failure names what is missing.

Everything runs through the real sshd, real sudo and the pct stand-in (tests/sandbox/test_sandbox.py
shows the stand-in answers like the real pct).
"""

from __future__ import annotations

import pytest

from opsctl import errors
from opsctl.config.inventory import HostSpec
from opsctl.config.sudoers import sudoers_rule
from opsctl.remote.agent_client import Agent
from opsctl.remote.command import pct_argv
from opsctl.remote.transport import Remote, classify_pct_failure
from opsctl.sandbox import host as sandbox_mod
from tests.sandbox_plugin import sandbox_home

pytestmark = pytest.mark.sandbox

ECHO_ARGV = ["printf", "%s\\0", "<argv>"]
HOSTILE = ["it's", "$(touch /tmp/pwned)", "`id`", "a;b", "line1\nline2", "*", "ünïcødé ✓", "",
           "-n", "--", "--keep-env", "$HOME", "\\", "tab\there", "%s", "-la"]


def spec(info: sandbox_mod.SandboxInfo, **changes: object) -> HostSpec:
    base = HostSpec(name="sandbox", address=info.host, port=info.port, user=info.user,
                    identity_file=str(info.identity_file), known_hosts=str(info.known_hosts_file),
                    host_key_fingerprint=info.host_key_fingerprint)
    return base.model_copy(update=changes)


@pytest.fixture(scope="module")
def sudo_user(sandbox) -> str:
    """A non-root user whose sudoers is the docs' rule for the stand-in pct's path: the pct
    subcommands opsctl runs, nothing else."""
    return sandbox_mod.ensure_sudo_user(sandbox_home())


def echoed(out: bytes) -> list[str]:
    parts = out.split(b"\0")
    assert parts[0] == b"<argv>" and parts[-1] == b"", out
    return [x.decode() for x in parts[1:-1]]


def test_a_user_allowed_only_pct_runs_commands_byte_exact(sandbox, sudo_user):
    host = spec(sandbox, user=sudo_user, sudo=True, pct_path=str(sandbox.pct_path))
    with Remote(host, use_mux=False) as r:
        res = r.pct_exec(200, [*ECHO_ARGV, *HOSTILE], timeout=30)
        assert res.rc == 0, res.stderr
        assert echoed(res.stdout) == HOSTILE
        assert r.pct_exec(200, ["sh", "-c", "exit 42"], timeout=30).rc == 42
        # sudo guards pct alone: anything else under sudo is refused
        assert r.run(["sudo", "-n", "true"], timeout=10).stderr.startswith(b"sudo: ")


def test_the_docs_sudoers_rule_refuses_pct_push_and_pull_of_a_host_file(sandbox, sudo_user):
    """``pct push``/``pull`` copy any host file: a rule that allowed them would be host root."""
    host = spec(sandbox, user=sudo_user, sudo=True, pct_path=str(sandbox.pct_path))
    with Remote(host, use_mux=False) as r:
        for argv in (["push", "200", "/etc/shadow", "/tmp/shadow"],
                     ["pull", "200", "/etc/hostname", "/tmp/stolen"],
                     ["destroy", "200"], ["set", "200", "--memory", "1"]):
            res = r.run(["sudo", "-n", str(sandbox.pct_path), *argv], timeout=10)
            assert res.rc != 0 and res.stderr.startswith(b"sudo: "), (argv, res.stderr)
        assert r.run(["sudo", "-n", str(sandbox.pct_path), "status", "200"], timeout=10).rc == 0
        assert r.run(["sudo", "-n", str(sandbox.pct_path), "list"], timeout=10).rc == 0


def test_opsctl_runs_through_exactly_the_docs_sudoers_rule(sandbox, sudo_user):
    rule = sandbox_mod._sudoers_file(sandbox_mod._Layout.of(sandbox_home())).read_text()
    assert rule == sudoers_rule(sudo_user, str(sandbox.pct_path)) + "\n"
    host = spec(sandbox, user=sudo_user, sudo=True, pct_path=str(sandbox.pct_path))
    with Remote(host, use_mux=False) as r:
        assert r.pct_exec(200, ["true"], timeout=30).rc == 0
        assert r.run(["pct", "status", "200"], timeout=10).rc == 0


def test_a_missing_sudoers_rule_is_named_exactly(sandbox, sudo_user):
    host = spec(sandbox, user=sudo_user, sudo=True)  # pct_path /usr/sbin/pct: no rule for it
    with Remote(host, use_mux=False) as r, pytest.raises(errors.HostSetupError) as exc:
        r.pct_exec(200, ["true"], timeout=10, step="agent env")
    assert exc.value.exit_code == errors.HOST_SETUP
    assert f"`{sudoers_rule(sudo_user)}`" in exc.value.message
    assert "agent env" in exc.value.message
    assert "/etc/sudoers.d/" in (exc.value.hint or "")


def test_a_missing_container_is_exit_20_for_a_sudo_user_too(sandbox, sudo_user, missing_ct):
    host = spec(sandbox, user=sudo_user, sudo=True, pct_path=str(sandbox.pct_path))
    with Remote(host, use_mux=False) as r, pytest.raises(errors.ContainerMissing) as exc:
        r.pct_exec(missing_ct, ["true"], timeout=10)
    assert exc.value.exit_code == 20


def test_pct_not_on_the_path_of_a_root_session_is_named(sandbox):
    with Remote(spec(sandbox), use_mux=False) as r:
        # the same command opsctl sends, on a PATH without pct (coreutils' timeout says so)
        res = r.run(["env", "PATH=/usr/bin:/bin", "timeout", "5", *pct_argv(200, ["true"])],
                    timeout=10)
        with pytest.raises(errors.HostSetupError) as exc:
            classify_pct_failure(r.host, 200, res, "pct exec")
    assert res.rc == 127
    assert "`pct` not found on the host" in exc.value.message


def test_pve_container_before_5_0_9_is_detected_and_names_the_package(sandbox):
    with Remote(spec(sandbox), use_mux=False) as r:
        res = r.run(["env", "OPSCTL_SANDBOX_PVE_CONTAINER_VERSION=5.0.8", *pct_argv(200, ["true"])],
                    timeout=10)
        with pytest.raises(errors.PctTooOld) as exc:
            classify_pct_failure(r.host, 200, res, "agent env")
    assert exc.value.exit_code == errors.PCT_TOO_OLD
    assert "pve-container is older than 5.0.9" in exc.value.message
    assert "apt install pve-container" in (exc.value.hint or "")


def test_a_command_missing_in_the_container_is_named_not_blamed_on_python3(sandbox):
    with Remote(spec(sandbox), use_mux=False) as r:
        agent = Agent(r, 200, python="python3.99")
        with pytest.raises(errors.RemoteCommandFailed) as exc:
            agent.call("env", timeout=20)
    assert "`python3.99` not found in the container" in exc.value.message
    assert exc.value.hint == "install python3.99 in the container"


def test_the_cli_names_the_missing_sudoers_line_with_exit_22(sandbox, sudo_user, isolated_env):
    from click.testing import CliRunner

    from opsctl.cli import cli

    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "admin.yaml").write_text(
        "hosts:\n  lab:\n"
        f"    address: {sandbox.host}\n    port: {sandbox.port}\n    user: {sudo_user}\n"
        f"    identity_file: {sandbox.identity_file}\n    known_hosts: {sandbox.known_hosts_file}\n"
        "    sudo: true\n")  # pct_path: the default /usr/sbin/pct, which no rule allows here
    res = CliRunner().invoke(cli, ["exec", "--host", "lab", "--ct", "200", "--", "true"])
    assert res.exit_code == errors.HOST_SETUP, res.output
    assert sudoers_rule(sudo_user) in " ".join(res.output.split())
    # with the path the rule names, the command runs and its exit code passes through
    (inv / "admin.yaml").write_text((inv / "admin.yaml").read_text()
                                    + f"    pct_path: {sandbox.pct_path}\n")
    ran = CliRunner().invoke(cli, ["exec", "--host", "lab", "--ct", "200", "--", "sh", "-c", "exit 3"])
    assert ran.exit_code == 3, ran.output
