"""The OpenSSH client, for what needs a terminal or a port: ``attach``, ``shell``, ``forward``.

Why OpenSSH and not paramiko here: an interactive session needs the local terminal in raw
mode, window-size changes forwarded and the remote PTY's job control; ``ssh -t`` does all of
it and is well kept. A port forward is ``ssh -N -L``. Every other remote command goes through
:class:`~opsctl.remote.transport.Remote` (fabric on paramiko, directly or through the mux); rsync
also runs ssh, as its remote shell (:mod:`.rsync` says why).

Host keys stay opsctl's decision: the caller first connects through :class:`Remote` (its
policy: ``known_hosts``, a pinned fingerprint, ``--accept-new-host-key``) and this module
gives ssh a private known_hosts file holding exactly the key that connection verified, with
``StrictHostKeyChecking yes``, so ssh can only talk to that same key. ``-F none``: the user's
``~/.ssh/config`` was applied once already, into the :class:`HostSpec`
(``opsctl/config/sshconfig.py``). Jump hosts (``ProxyJump``) are checked by ssh itself
against the user's own known_hosts (ssh starts the jump with its defaults).

The remote command is the same one string :func:`.command.host_command` builds for every
other call (argv joined once by ``shlex``), so sudo-for-pct and the locale apply unchanged.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import typing as t
from pathlib import Path

from opsctl.errors import ConfigError
from opsctl.remote.command import host_command, known_hosts_name

if t.TYPE_CHECKING:
    from opsctl.config.inventory import HostSpec
    from opsctl.remote.transport import Remote


def ssh_binary() -> str:
    """The OpenSSH client.

    Raises:
        ConfigError: no ``ssh`` on PATH.
    """
    found = shutil.which("ssh")
    if found is None:
        raise ConfigError("no `ssh` (OpenSSH client) on PATH; attach, shell and forward need it",
                          hint="apt install openssh-client")
    return found


class VerifiedKey:
    """A private known_hosts file with the one host key ``remote`` verified; removed on exit."""

    def __init__(self, remote: Remote):
        key = remote.server_key()
        spec = remote.host
        self._dir = tempfile.mkdtemp(prefix="opsctl-ssh-")
        self.path = Path(self._dir) / "known_hosts"
        self.path.write_text(f"{known_hosts_name(spec.address, spec.port)} {key.get_name()} "
                             f"{key.get_base64()}\n", encoding="ascii")

    def __enter__(self) -> VerifiedKey:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def ssh_argv(spec: HostSpec, known_hosts: Path, *, tty: bool = False,
             options: t.Sequence[str] = (), command: str | None = None) -> list[str]:
    """``ssh`` with the target's user, port, identity and jump hosts, host keys pinned to
    ``known_hosts``; ``options`` go before the destination, ``command`` after it.

    Raises:
        ConfigError: no ``ssh`` on PATH.
    """
    argv = [ssh_binary(), "-F", "none", "-p", str(spec.port), "-l", spec.user,
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "UpdateHostKeys=no",
            "-o", f"ConnectTimeout={max(1, int(spec.connect_timeout_s))}",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
            "-o", "LogLevel=ERROR"]  # errors only: no "Connection to … closed." after a detach
    if spec.identity_file:
        argv += ["-i", os.path.expanduser(spec.identity_file), "-o", "IdentitiesOnly=yes"]
    if spec.proxy_jump:
        argv += ["-J", spec.proxy_jump]
    argv += ["-t" if tty else "-T", *options, spec.address]
    if command is not None:
        argv += ["--", command]
    return argv


def container_command(spec: HostSpec, ctid: int, argv: t.Sequence[str]) -> str:
    """The command string that runs ``argv`` in the target (container ``ctid``, or a direct
    host itself: :mod:`.entry`), as every opsctl call spells it."""
    from opsctl.remote import entry

    entered = entry.of(spec).argv(entry.check_ct(spec, ctid), argv)
    return host_command(entered, sudo=spec.sudo, pct_path=spec.pct_path)
