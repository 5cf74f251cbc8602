"""The command string sent to sshd is built once, from argv, in one place; pct's refusals are
recognised by their exact text (the texts below are what pct, sudo, coreutils and lxc-attach
print, as the sandbox tests show against the real programs and the stand-in)."""

from __future__ import annotations

import shlex

import pytest

from opsctl import errors
from opsctl.config.inventory import HostSpec
from opsctl.config.sudoers import sudoers_rule
from opsctl.remote.command import CommandResult, host_command, pct_argv
from opsctl.remote.transport import classify_pct_failure

HOST = HostSpec(name="pve1", address="10.1.2.6")
ADMIN = HostSpec(name="pve1", address="10.1.2.6", user="admin", sudo=True)


def test_pct_exec_argv_is_explicit_about_the_environment_and_the_deadline():
    assert pct_argv(200, ["nvidia-smi"]) == ["pct", "exec", "200", "--keep-env", "0", "--", "nvidia-smi"]
    assert pct_argv(200, ["true"], timeout=5, keep_env=True) == [
        "pct", "exec", "200", "--keep-env", "1", "--", "timeout", "-k", "2", "5", "true"]


def test_every_host_command_runs_under_a_utf8_locale():
    assert shlex.split(host_command(["pct", "list"])) == ["env", "LC_ALL=C.UTF-8", "pct", "list"]


def test_non_root_users_run_only_pct_under_sudo_by_its_full_path():
    cmd = host_command(["pct", "list"], timeout=10, sudo=True)
    assert shlex.split(cmd) == ["env", "LC_ALL=C.UTF-8", "timeout", "-k", "2", "13",
                                "sudo", "-n", "/usr/sbin/pct", "list"]
    other = host_command(["ps", "-e"], sudo=True, pct_path="/opt/pct")
    assert shlex.split(other) == ["env", "LC_ALL=C.UTF-8", "ps", "-e"]


def test_hostile_argv_survives_the_join_exactly():
    argv = ["pct", "exec", "200", "--", "echo", "$(rm -rf /)", "a'b\"c", "`x`", "; ls", ""]
    assert shlex.split(host_command(argv))[2:] == argv


def result(rc: int, stderr: str, stdout: bytes = b"", argv: list[str] | None = None) -> CommandResult:
    argv = argv or pct_argv(200, ["true"], timeout=5)
    return CommandResult(tuple(argv), "", rc, stdout, stderr.encode(), 0.1)


PCT_REFUSALS = [
    # (host, rc, stderr, error class, words the message must contain)
    (HOST, 2, "Configuration file 'nodes/pve1/lxc/200.conf' does not exist\n",
     errors.ContainerMissing, "container 200 does not exist"),
    (HOST, 255, "Configuration file 'nodes/pve1/lxc/200.conf' does not exist\n",
     errors.ContainerMissing, "container 200 does not exist"),
    (HOST, 25, "container '200' not running!\n", errors.ContainerNotRunning, "is not running"),
    (HOST, 255, "Unknown option: keep-env\n400 unable to parse option\n"
                "pct exec <vmid> [<extra-args>] [OPTIONS]\n", errors.PctTooOld, "older than 5.0.9"),
    (HOST, 127, "timeout: failed to run command 'pct': No such file or directory\n",
     errors.HostSetupError, "`pct` not found on the host"),
    (HOST, 127, "env: 'timeout': No such file or directory\n",
     errors.HostSetupError, "`timeout` (coreutils) not found on the host"),
    (ADMIN, 1, "sudo: a password is required\n", errors.HostSetupError,
     f"sudoers lacks the line `{sudoers_rule('admin')}`"),
    (ADMIN, 127, "timeout: failed to run command 'sudo': No such file or directory\n",
     errors.HostSetupError, "`sudo` not found on the host"),
    (ADMIN, 1, "sudo: /usr/sbin/pct: command not found\n",
     errors.HostSetupError, "`/usr/sbin/pct` not found on the host"),
    (HOST, 127, 'lxc-attach: 200: ../src/lxc/attach.c: lxc_attach_run_command: 1841 No such file '
                'or directory - Failed to exec "timeout"\n', errors.HostSetupError,
     "container 200 has no `timeout` (coreutils)"),
]


@pytest.mark.parametrize(("host", "rc", "stderr", "cls", "words"), PCT_REFUSALS)
def test_pct_refusals_are_classified_by_their_text_not_the_rc(host, rc, stderr, cls, words):
    with pytest.raises(cls) as exc:
        classify_pct_failure(host, 200, result(rc, stderr), "agent status")
    assert type(exc.value) is cls
    assert words in exc.value.message
    assert "pve1" in exc.value.message and "agent status" in exc.value.message
    assert exc.value.hint


def test_the_missing_piece_is_a_field_the_caller_can_act_on():
    with pytest.raises(errors.HostSetupError) as exc:
        classify_pct_failure(ADMIN, 200, result(1, "sudo: a password is required\n"), "exec")
    assert exc.value.missing == sudoers_rule("admin")
    with pytest.raises(errors.HostSetupError) as exc:
        classify_pct_failure(HOST, 200, result(127, "env: 'timeout': No such file or directory\n"),
                             "exec")
    assert exc.value.missing == "timeout"


def test_each_host_setup_problem_has_its_own_exit_code():
    assert errors.HostSetupError.exit_code == 22
    assert errors.PctTooOld.exit_code == 23
    assert {errors.HostSetupError.exit_code, errors.PctTooOld.exit_code} <= set(errors.EXIT_CODES)


@pytest.mark.parametrize(("rc", "stderr", "stdout"), [
    (1, "Configuration file 'nodes/pve1/lxc/200.conf' does not exist\n", b"some output"),
    (3, "grep: Configuration file 'nodes/pve1/lxc/200.conf' does not exist\n", b""),
    (1, "container '201' not running!\n", b""),  # another container's message
    (127, "timeout: failed to run command 'python3': No such file or directory\n", b""),
    (1, "sudo: a password is required\n", b""),  # sudo inside the container, host is root
])
def test_a_command_that_merely_prints_similar_text_is_not_pcts_refusal(rc, stderr, stdout):
    classify_pct_failure(HOST, 200, result(rc, stderr, stdout), "exec")
