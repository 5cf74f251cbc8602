"""``opsctl help TOPIC``: reference text that belongs to no single command (``gh help exit-codes``).

Listed in :data:`COMMANDS` (assembled by :mod:`opsctl.cli`). ``opsctl help exit-codes`` prints
the table docs/exit-codes.md shows, made from the same source (:data:`opsctl.errors.EXIT_CODES`
and :data:`opsctl.errors.PASSED_THROUGH`), so the terminal and the docs cannot disagree.
Plain text, no rich: it must read the same in a pipe, a pager and a terminal.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
import typing as t

import click

from opsctl import errors
from opsctl.cli.app import OpsctlGroup, json_option

#: The column the meanings start at (the widest code, ``130``, and two spaces).
CODE_WIDTH = 5


def exit_code_rows() -> list[tuple[str, str]]:
    """(code, meaning) of every exit status, in numeric order, then the passed-through one."""
    rows = [(str(code), meaning) for code, meaning in sorted(errors.EXIT_CODES.items())]
    return [*rows, ("n", errors.PASSED_THROUGH)]


def exit_code_table(width: int) -> str:
    """The exit-code table as plain text, meanings wrapped to ``width`` columns (at least 40)."""
    wrap = max(40, width) - CODE_WIDTH
    lines = []
    for code, meaning in exit_code_rows():
        text = textwrap.wrap(meaning.replace("`", ""), wrap, break_on_hyphens=False) or [""]
        lines.append(f"{code:<{CODE_WIDTH}}{text[0]}")
        lines += [" " * CODE_WIDTH + more for more in text[1:]]
    return "\n".join(lines) + "\n"


class ExitCodeRow(t.TypedDict):
    """One exit status: its number (None: the command's own, passed through) and meaning."""

    code: int | None
    meaning: str


class ExitCodesDocument(t.TypedDict):
    """``help exit-codes --json``: every exit status opsctl ends with, in the docs' order."""

    exit_codes: list[ExitCodeRow]


@click.group("help", invoke_without_command=True, cls=OpsctlGroup, examples=(
    "opsctl help exit-codes",
))
@click.pass_context
def help_(ctx: click.Context) -> None:
    """Reference topics: `opsctl help exit-codes`. Without a topic, opsctl's own --help."""
    if ctx.invoked_subcommand is None:
        parent = ctx.find_root()
        click.echo(parent.get_help())


@help_.command("exit-codes", examples=(
    "opsctl help exit-codes",
    "opsctl help exit-codes --json",
))
@json_option
def exit_codes(as_json: bool) -> None:
    """Every exit status opsctl ends with and what it means (docs/exit-codes.md)."""
    if as_json:
        from opsctl.cli.jsonout import print_json

        doc: ExitCodesDocument = {"exit_codes": [
            {"code": int(code) if code.isdigit() else None, "meaning": meaning}
            for code, meaning in exit_code_rows()]}
        print_json(doc)
        return
    width = shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 100
    sys.stdout.write(exit_code_table(width))


COMMANDS = [help_]
