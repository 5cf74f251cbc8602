"""Only pct's own refusal is a container error: a command that happens to
print Proxmox's "does not exist" / "not running" text and exit with pct's code keeps its
own exit code and output; a really missing or stopped container is still reported."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli

pytestmark = pytest.mark.sandbox


@pytest.mark.parametrize("text", [
    "Configuration file 'nodes/pve/lxc/200.conf' does not exist",
    "CT 200 not running",
])
@pytest.mark.parametrize("rc", [255, 2])
def test_a_command_printing_pcts_words_keeps_its_exit_code(target, text, rc):
    res = CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--",
                                   "sh", "-c", 'echo "$1" >&2; exit "$2"', "sh", text, str(rc)])
    assert res.exit_code == rc, res.output
    assert text in res.stderr


def test_a_missing_container_is_still_reported(target, missing_ct):
    res = CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", str(missing_ct), "--", "true"])
    assert res.exit_code == errors.CONTAINER_MISSING


def test_a_stopped_container_is_still_reported(target, stopped_ct):
    res = CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", str(stopped_ct), "--", "true"])
    assert res.exit_code == errors.CONTAINER_NOT_RUNNING
