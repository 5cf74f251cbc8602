"""`opsctl exec` passes the remote exit code through whatever its stdin is — a pipe that
stays open after the command ended, a file, a closed descriptor, a terminal — with and
without the connection multiplexer, and never aborts at interpreter shutdown."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

pytestmark = pytest.mark.sandbox

COMMAND = ["sh", "-c", "echo hello; exit 42"]


def opsctl_exec(shell_prefix: str = "", **popen: object) -> subprocess.CompletedProcess[bytes]:
    """Run `opsctl exec` in a child, optionally behind a shell redirection/pipe."""
    argv = [sys.executable, "-m", "opsctl", "exec", "--host", "sandbox", "--ct", "200", "--", *COMMAND]
    if shell_prefix:
        argv = ["sh", "-c", f'{shell_prefix} "$@"', "sh", *argv]
    return subprocess.run(argv, capture_output=popen.pop("capture_output", True),  # type: ignore[call-overload]
                          timeout=60, **popen)


def assert_passed_through(res: subprocess.CompletedProcess[bytes]) -> None:
    assert b"Fatal Python error" not in res.stderr, res.stderr
    assert res.returncode == 42, (res.returncode, res.stderr)
    assert res.stdout == b"hello\n"


def test_a_pipe_that_stays_open_after_the_command_ended_keeps_the_exit_code(via):
    # the writer outlives the remote command by more than the 5 s the direct path waits
    assert_passed_through(opsctl_exec("sleep 6 |"))


def test_a_file_on_stdin_keeps_the_exit_code(via, tmp_path):
    f = tmp_path / "in.txt"
    f.write_bytes(b"x" * 200000)
    with f.open("rb") as stdin:
        assert_passed_through(opsctl_exec(stdin=stdin))


def test_a_closed_stdin_keeps_the_exit_code(via):
    assert_passed_through(opsctl_exec("exec 0<&-;"))


def test_a_terminal_on_stdin_keeps_the_exit_code(via):
    primary, secondary = pty.openpty()
    try:
        assert_passed_through(opsctl_exec(stdin=secondary))
    finally:
        os.close(primary)
        os.close(secondary)
