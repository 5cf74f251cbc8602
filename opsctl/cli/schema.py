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


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def schema(command: tuple[str, ...]) -> None:
    """The JSON Schema (draft 2020-12) of `opsctl COMMAND --json`; `event` for trainer events,
    `playbook` and `inventory` for those files.

    Without COMMAND, lists every schema. `opsctl schema status --all` is the fleet view's.
    Exit 2 for a command without a schema.
    """
    from opsctl.cli import schemas

    if not command:
        width = max(len(n) for n in schemas.names())
        for name in schemas.names():
            sys.stdout.write(f"{name:<{width}}  {schemas.what(name)}\n")
        return
    # `--json` is a whole word (`jobs--json` names no command); with it, an error is the
    # `{"ok": false}` document too
    if "--json" in command:
        click.get_current_context().meta["opsctl_json"] = True
    name = " ".join(" ".join(w for w in command if w != "--json").split())
    if name not in schemas.names():
        raise errors.ConfigError(f"no schema for {name!r}; there is one for: "
                                 f"{', '.join(schemas.names())}", hint="opsctl schema")
    sys.stdout.write(json.dumps(schemas.document_schema(name), indent=2) + "\n")


COMMANDS = [schema]
