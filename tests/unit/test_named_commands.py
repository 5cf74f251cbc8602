"""Every ``opsctl …`` command line that opsctl shows a person exists in the real CLI tree.

A fix text that names a command which does not exist sends the user nowhere (doctor once
advised ``opsctl torch swap``; the verb is ``swap-torch``). The command lines looked at:

- in the docs and the README: inline code that starts with ``opsctl `` and the lines of fenced
  shell blocks that do;
- in the source of both sides: string constants holding inline code ```opsctl …``` or starting
  with ``opsctl `` (messages, hints, fix texts).

Each line is read up to its first comment, pipe or prose: the command words must name a
command (``a|b`` alternatives each), and every ``--option`` up to there must be one of the
command it follows (or of the ``opsctl`` group itself).
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterator

import click
import pytest

from opsctl.cli import cli
from tests.paths import REPO

_CODE = re.compile(r"`(opsctl [^`\n]+)`")
_FENCE = re.compile(r"```(?:bash|sh|console|shell|text)?\n(.*?)```", re.S)
_WORD = re.compile(r"[a-z][a-z0-9-]*")


def _named_in_docs() -> Iterator[tuple[str, str]]:
    for page in sorted([*(REPO / "docs").rglob("*.md"), REPO / "README.md"]):
        text = page.read_text(encoding="utf-8")
        where = str(page.relative_to(REPO))
        for m in _CODE.finditer(text):
            yield where, m.group(1)
        for block in _FENCE.findall(text):
            for line in block.splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("opsctl "):
                    yield where, line


def _named_in_source() -> Iterator[tuple[str, str]]:
    for pkg in ("opsctl", "remote_payload"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            where = str(path.relative_to(REPO))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for m in _CODE.finditer(node.value):
                        yield where, m.group(1)
                    if node.value.startswith("opsctl ") and "`" not in node.value:
                        yield where, node.value.splitlines()[0]


def _options(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}


def _takes_value(cmds: list[click.Command], name: str) -> bool:
    return any(isinstance(p, click.Option) and name in p.opts and not p.is_flag and not p.count
               for c in cmds for p in c.params)


def problem(line: str) -> str | None:
    """Why ``line`` names no real command or option, or None."""
    line = re.split(r"\s#|\s\|\s|\s->|\s…\s*\|", line)[0]
    try:
        tokens = shlex.split(line)[1:]
    except ValueError:
        tokens = line.split()[1:]
    cmd: click.Command = cli
    path = ["opsctl"]
    global_options = _options(cli) | {"--version"}
    skip = False
    for raw in tokens:
        token = raw.rstrip(").,;`'\"")
        if skip:
            skip = False
            continue
        if token == "--":
            return None
        if token.startswith("-"):
            for alt in token.split("|"):
                name = alt.split("=")[0].lstrip("[").rstrip("]")
                if name.startswith("-") and name not in _options(cmd) | global_options:
                    return f"`{' '.join(path)}` has no option {name}"
                skip = "=" not in alt and _takes_value([cmd, cli], name)
            continue
        if not isinstance(cmd, click.Group):
            continue  # an argument of a command
        alternatives = token.split("|")
        if not all(_WORD.fullmatch(a) for a in alternatives):
            return None  # a placeholder or prose: the command words ended
        missing = [a for a in alternatives if a not in cmd.commands]
        if missing:
            return f"`{' '.join(path)}` has no command {missing[0]}"
        if len(alternatives) > 1:
            return None  # each alternative exists; their options differ
        cmd = cmd.commands[token]
        path.append(token)
    return None


_LINES = sorted({*_named_in_docs(), *_named_in_source()})


def test_the_scan_finds_the_command_lines_it_checks() -> None:
    # a broken pattern would find nothing and pass every check below
    assert len(_LINES) > 200


@pytest.mark.parametrize("line", ["opsctl torch swap --host H --ct N <build>",
                                  "opsctl status --hots pve1", "opsctl cache wipe"])
def test_a_command_or_option_that_does_not_exist_is_found(line: str) -> None:
    assert problem(line) is not None


@pytest.mark.parametrize("line", ["opsctl swap-torch cu130 --host H --ct N",
                                  "opsctl --json jobs --host pve1 --ct 200",
                                  "opsctl queue rm JOB | queue move JOB --before|--after JOB2",
                                  "opsctl exec --host H --ct 200 -- nvidia-smi --query"])
def test_a_real_command_line_passes(line: str) -> None:
    assert problem(line) is None


def test_every_opsctl_command_line_in_the_docs_and_the_messages_exists() -> None:
    wrong = [f"{where}: {line!r}: {why}" for where, line in _LINES
             if (why := problem(line)) is not None]
    assert wrong == []
