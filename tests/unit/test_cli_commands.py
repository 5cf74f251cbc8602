"""Every command a family module defines is on ``opsctl`` (the list is explicit, so it can be
forgotten; this catches that), and the command set is the documented one."""

from __future__ import annotations

import click

from opsctl import cli as cli_pkg
from opsctl.cli import cli
from tests.paths import REPO


def _reachable(commands: list[click.Command]) -> set[int]:
    seen: set[int] = set()
    while commands:
        c = commands.pop()
        seen.add(id(c))
        if isinstance(c, click.Group):
            commands.extend(c.commands.values())
    return seen


def test_every_command_defined_in_a_family_is_listed():
    defined = {name: obj for fam in cli_pkg.FAMILIES for name, obj in vars(fam).items()
               if isinstance(obj, click.Command)}
    reachable = _reachable(list(cli.commands.values()))
    assert sorted(n for n, c in defined.items() if id(c) not in reachable) == []


def test_the_top_level_commands_are_the_documented_ones():
    assert sorted(cli.commands) == [
        "attach", "cache", "completion", "dashboard", "deploy", "doctor", "envs", "exec", "forward",
        "goodput", "help", "host", "hosts", "jobs", "logs", "mux", "playbooks", "plot", "probe", "pull",
        "push", "queue", "sandbox", "schema", "shell", "stacks", "status", "stop", "swap-torch",
        "tensorboard"]


def test_the_commands_page_shows_every_top_level_command_at_a_glance():

    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    glance = page[:page.index("## Reference")]
    assert [n for n in sorted(cli.commands) if f"opsctl {n}" not in glance] == []
