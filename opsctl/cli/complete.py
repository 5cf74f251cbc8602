"""Shell completion: ``opsctl completion bash|zsh`` and the completers of hosts, playbooks, jobs.

click generates the completion scripts (``_OPSCTL_COMPLETE=bash_source opsctl``); this module
only names them as a command, so users need not know click's environment variable, and
supplies the values click cannot know: inventory hosts (``--host``), playbook names
(``--playbook``) and job ids (positional ``JOB``).

Job ids come from the container, through the agent's ``jobs`` verb on the target the command
line names so far (``--host``/``--ct``) or the last one. A completion must never hang a
shell or print an error into it: the call runs in a daemon thread given
:data:`JOBS_TIMEOUT_S` (``$OPSCTL_COMPLETE_TIMEOUT_S``), and any failure (no target, host
down, no payload) completes nothing.
"""

from __future__ import annotations

import os
import threading

import click
from click.shell_completion import CompletionItem

from opsctl.cli.command import OpsctlCommand

JOBS_TIMEOUT_S = 5.0  # a first connection (no mux yet) to a loaded host takes 1-3 s
MAX_TIMEOUT_S = 60.0  # $OPSCTL_COMPLETE_TIMEOUT_S above this (or not a number) is ignored
SHELLS = ("bash", "zsh", "fish")


def printable(text: str) -> bool:
    """No control character (newline, tab, escape, DEL): the shell reads one candidate per
    line, so ``a\nb`` would become two candidates (and an escape would reach the terminal)."""
    return all(ch >= " " and ch != "\x7f" and not 0x80 <= ord(ch) < 0xA0 for ch in text)


def candidates(values: list[str], incomplete: str, *,
               helps: dict[str, str] | None = None) -> list[CompletionItem]:
    """The completion items among ``values``: those that start with ``incomplete`` and are
    printable (any other is skipped, never escaped into something that is not its name)."""
    helps = helps or {}
    out = []
    for v in values:
        if v and v.startswith(incomplete) and printable(v):
            text = helps.get(v, "").strip()
            out.append(CompletionItem(v, help=text if text and printable(text) else None))
    return out


def hosts(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Inventory host names (every inventory file on the lookup path)."""
    try:
        from opsctl.config import inventory

        names = sorted(inventory.load().hosts)
    except Exception:  # a broken inventory completes nothing; the command itself will say why
        return []
    return candidates(names, incomplete)


def playbooks(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Playbook names found on the playbook path (a path still completes as a file)."""
    try:
        from opsctl.config import playbook

        names = playbook.available_names()
    except Exception:
        return []
    found = candidates(names, incomplete)
    return found or [CompletionItem(incomplete, type="file")]


def jobs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Job ids of the target's container, newest first (empty on any failure or timeout)."""
    host, ctid = ctx.params.get("host"), ctx.params.get("ctid")
    found: list[CompletionItem] = []
    try:
        timeout = float(os.environ.get("OPSCTL_COMPLETE_TIMEOUT_S", JOBS_TIMEOUT_S))
    except ValueError:
        timeout = JOBS_TIMEOUT_S
    if not 0 < timeout <= MAX_TIMEOUT_S:  # nan, inf, 1e308, -1: the default
        timeout = JOBS_TIMEOUT_S

    def fetch() -> None:
        from opsctl.ops import jobs as jobs_ops

        with jobs_ops.open_target(host, ctid) as tgt:
            listed = jobs_ops.list_jobs(tgt, timeout=timeout)
        found.extend(candidates(
            [r["job_id"] for r in listed["jobs"]], incomplete,
            helps={r["job_id"]: f"{r.get('name') or ''} {r.get('state') or ''}"
                   for r in listed["jobs"]}))

    def guarded() -> None:
        try:
            fetch()
        except Exception:  # nothing to complete, and nothing printed into the user's shell
            found.clear()

    worker = threading.Thread(target=guarded, daemon=True)
    worker.start()
    worker.join(timeout)
    return list(found) if not worker.is_alive() else []


def script(shell: str, prog: str = "opsctl") -> str:
    """click's completion script for ``shell`` (what ``_OPSCTL_COMPLETE=<shell>_source`` prints)."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    if cls is None:  # pragma: no cover - SHELLS lists what click ships
        raise click.UsageError(f"no completion for {shell}")
    root = click.get_current_context().find_root().command  # the opsctl group
    complete_var = "_" + prog.replace("-", "_").upper() + "_COMPLETE"
    return cls(root, {}, prog, complete_var).source()


@click.command(cls=OpsctlCommand, examples=(
    "opsctl completion bash",
    "opsctl completion zsh",
))
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL.

    \b
    bash: eval "$(opsctl completion bash)"     (in ~/.bashrc)
    zsh:  eval "$(opsctl completion zsh)"      (in ~/.zshrc, after compinit)
    Completes commands, options, inventory hosts (--host), playbooks (--playbook) and the
    target container's job ids (JOB).
    """
    click.echo(script(shell))


#: This family's commands (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (completion,)

