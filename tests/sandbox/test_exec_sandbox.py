"""`opsctl exec` and the transport: argv is byte-exact, exit codes pass through,
deadlines leave nothing behind."""

from __future__ import annotations

import shutil
import time

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl import errors
from opsctl.cli import cli
from opsctl.config import inventory
from opsctl.remote.transport import Remote
from tests.waiting import wait_for

pytestmark = pytest.mark.sandbox

# printf '%s\0' prints each argument followed by NUL: an exact, unambiguous echo of argv
# (the sentinel keeps printf from printing the format once when no argument follows).
ECHO_ARGV = ["printf", "%s\\0", "<argv>"]

HOSTILE = [
    "it's", 'say "hi"', "$(touch /tmp/pwned)", "`id`", "a;b", "a && b", "line1\nline2",
    "*", "?", "[a-z]", "~", "ünïcødé ✓", "", "-n", "--help", "--", "$HOME", "\\", "'\"'\"'",
    "tab\there", " leading space", "trailing space ", "%s", "!", "#comment", "a|b", ">out",
]


@pytest.fixture
def remote(sandbox, isolated_env):
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    with Remote(inventory.load().resolve("sandbox")) as r:
        yield r


def echoed(out: bytes) -> list[str]:
    parts = out.split(b"\0")
    assert parts[0] == b"<argv>" and parts[-1] == b"", out
    return [x.decode() for x in parts[1:-1]]


def test_hostile_strings_reach_the_container_byte_exact_via_the_cli(remote):
    res = CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--",
                                   *ECHO_ARGV, *HOSTILE], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert echoed(res.stdout_bytes) == HOSTILE
    check = CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--",
                                     "sh", "-c", "test -e /tmp/pwned && echo PWNED || true"])
    assert "PWNED" not in check.stdout


# No NUL (argv cannot hold it); surrogates cannot be encoded.
argv_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(argv_text, max_size=6))
def test_any_argv_round_trips_through_pct_exec(remote, args):
    res = remote.pct_exec(200, [*ECHO_ARGV, *args], timeout=30)
    assert res.rc == 0, res.stderr
    assert echoed(res.stdout) == args


def test_the_exit_code_passes_through(remote):
    res = CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--", "sh", "-c", "exit 42"])
    assert res.exit_code == 42


def test_stdin_is_forwarded(remote):
    res = CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--", "wc", "-c"],
                             input=b"x" * 100000)
    assert res.stdout.strip() == "100000"


def test_a_fired_deadline_kills_the_remote_process_group(remote):
    marker = f"{time.time_ns() % 100000 + 300000}"
    start = time.monotonic()
    with pytest.raises(errors.DeadlineExceeded):
        remote.pct_exec(200, ["sh", "-c", f"sleep {marker} & sleep {marker}; wait"], timeout=2)
    assert time.monotonic() - start < 2 + 8
    wait_for(lambda: f"sleep {marker}" not in remote.pct_exec(200, ["ps", "-eo", "args"],
                                                              timeout=10).stdout.decode(), 10)
    ps = remote.pct_exec(200, ["ps", "-eo", "args"], timeout=10).stdout.decode()
    assert f"sleep {marker}" not in ps
    host_ps = remote.run(["ps", "-eo", "args"], timeout=10).stdout.decode()
    assert f"sleep {marker}" not in host_ps
