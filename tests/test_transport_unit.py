"""The command string sent to sshd is built once, from argv, in one place."""

from __future__ import annotations

import shlex

from opsctl.transport import host_command, pct_argv


def test_pct_exec_argv_is_explicit_about_the_environment_and_the_deadline():
    assert pct_argv(200, ["nvidia-smi"]) == ["pct", "exec", "200", "--keep-env", "0", "--", "nvidia-smi"]
    assert pct_argv(200, ["true"], timeout=5, keep_env=True) == [
        "pct", "exec", "200", "--keep-env", "1", "--", "timeout", "-k", "2", "5", "true"]


def test_non_root_users_get_sudo_n_in_front_of_everything():
    cmd = host_command(["pct", "list"], timeout=10, sudo=True)
    assert shlex.split(cmd) == ["sudo", "-n", "timeout", "-k", "2", "13", "pct", "list"]


def test_hostile_argv_survives_the_join_exactly():
    argv = ["pct", "exec", "200", "--", "echo", "$(rm -rf /)", "a'b\"c", "`x`", "; ls", ""]
    assert shlex.split(host_command(argv)) == argv
