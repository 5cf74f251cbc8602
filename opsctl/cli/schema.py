"""``opsctl schema [COMMAND]``: the JSON Schema of a command's ``--json`` document.

Listed in :data:`COMMANDS` (assembled by :mod:`opsctl.cli`). The schemas are built in
:mod:`opsctl.cli.schemas` from the types that produce the documents, so a script written
against them keeps working exactly as long as the output does.
"""

from __future__ import annotations

import json
import sys

import click

from opsctl import errors
from opsctl.cli.app import JsonOnlyCommand


@click.command(cls=JsonOnlyCommand, context_settings={"ignore_unknown_options": True}, examples=(
    "opsctl schema",
    "opsctl schema status",
))
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def schema(command: tuple[str, ...]) -> None:
    """The JSON Schema (draft 2020-12) of `opsctl COMMAND --json`; `event` for trainer events,
    `playbook` and `inventory` for those files.

    Without COMMAND, lists every schema (with --json as one document). `opsctl schema status
    --all` is the fleet view's. Exit 2 for a command without a schema.
    """
    from opsctl.cli import schemas

    ctx = click.get_current_context()
    as_json = "--json" in command or bool(ctx.find_root().params.get("as_json"))
    if as_json:
        ctx.meta["opsctl_json"] = True
    if not command or command == ("--json",):
        if as_json:  # the list as one document too
            from opsctl.cli.jsonout import print_json

            print_json({"schemas": [{"name": n, "what": schemas.what(n)} for n in schemas.names()]})
            return
        width = max(len(n) for n in schemas.names())
        for name in schemas.names():
            sys.stdout.write(f"{name:<{width}}  {schemas.what(name)}\n")
        return
    # `--json` (here or `opsctl --json schema`) is a whole word (`jobs--json` names no
    # command); with it, an error is the `{"ok": false}` document too
    name = " ".join(" ".join(w for w in command if w != "--json").split())
    if name not in schemas.names():
        raise errors.ConfigError(f"no schema for {name!r}; there is one for: "
                                 f"{', '.join(schemas.names())}", hint="opsctl schema")
    sys.stdout.write(json.dumps(schemas.document_schema(name), indent=2) + "\n")


COMMANDS = [schema]
