"""The host's sudoers rule for a non-root opsctl user (inventory ``sudo: true``).

The rule allows the ``pct`` subcommands opsctl runs and nothing else: ``pct push``/``pct pull``
copy any host file in or out of a container, so a rule that allows all of ``pct`` amounts to
host root. ``pct exec`` runs a command inside a container; ``status``, ``config`` and ``list``
only read. Every place that shows or writes the rule (the error that names a missing rule, the
sandbox's non-root user, the docs) takes it from :func:`sudoers_rule`, and
``tests/unit/test_sudoers_rule.py`` checks that every ``pct`` subcommand opsctl runs is in
:data:`PCT_SUBCOMMANDS`.

A direct host (inventory ``enter: direct``) needs no rule: only ``pct`` ever runs under
``sudo`` (:func:`opsctl.remote.command.host_command`), a direct host runs no ``pct``, and
what opsctl does there (the agent, tmux, its jobs, ``nvidia-smi``) needs no root once the
host's ``root`` is a directory the SSH user owns; ``sudo: true`` is refused there.
"""

from __future__ import annotations

#: subcommand -> what may follow it (sudoers: ``*`` any arguments; nothing: exactly none)
PCT_SUBCOMMANDS: dict[str, str] = {"exec": "*", "status": "*", "config": "*", "list": ""}


def sudoers_rule(user: str, pct_path: str = "/usr/sbin/pct") -> str:
    """One sudoers line: ``user`` may run ``pct_path`` with the subcommands opsctl needs."""
    commands = ", ".join(f"{pct_path} {sub} {args}".rstrip() for sub, args in PCT_SUBCOMMANDS.items())
    return f"{user} ALL=(root) NOPASSWD: {commands}"
