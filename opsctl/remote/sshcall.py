"""One command over the OpenSSH client: the first ``status`` of a session, when no mux is up.

Why: without a multiplexer, ``status`` paid the pydantic/PyYAML/paramiko imports and a
paramiko key exchange (in Python) before its one ``pct exec``: 2.2× a raw
``ssh … pct exec 200 -- true`` (README, Speed). OpenSSH does the same handshake in C and
is already what opsctl runs for attach/shell/forward (:mod:`.sshclient`); here it runs the
*same* command string (:func:`opsctl.remote.transport.prepare`: argv joined once, the
host- and container-side ``timeout`` deadlines inside it).

Trust is unchanged: ssh may only talk to a key that opsctl's own connection accepts
(:mod:`.hostkeys`, ``StrictHostKeyChecking yes``, no global file, no user config).
Whatever ssh itself refuses or fails at (exit 255: unknown or changed key, auth, network)
returns None and the caller takes the paramiko path, which builds opsctl's own error
(a changed key: exit 12 and its message). A remote command can also exit 255; that case
then runs twice, which is fine for the read-only calls this serves. Hosts behind a
ProxyJump never come here: ssh would check the jump hosts its own way.

The call is started (:func:`start`) as soon as the command is known and collected later
(:meth:`SshCall.result`): what the caller needs to read and print the reply loads while the
handshake runs, and nothing loads before ``ssh`` starts that only the reply needs.
"""

from __future__ import annotations

import subprocess
import time
import typing as t

from opsctl.errors import DeadlineExceeded
from opsctl.remote import hostkeys, sshclient
from opsctl.remote.command import CommandResult, known_hosts_name

if t.TYPE_CHECKING:
    from opsctl.remote.mux_socket import MuxHost

#: What ssh exits with when ssh itself failed (and what a remote command rarely does).
SSH_FAILED_RC = 255


class SshHost(t.Protocol):
    """What a call needs of its host (a ``HostSpec`` or the target cache's ``CachedHost``)."""

    @property
    def connect_timeout_s(self) -> float: ...


class SshCall:
    """One ``ssh`` started by :func:`start`; :meth:`result` waits for it. As a context, it
    leaves no ``ssh`` behind when the caller fails before collecting it."""

    def __init__(self, proc: subprocess.Popen[bytes], label: str, command: str, argv: list[str],
                 limit: float | None, what: str):
        self.proc = proc
        self.label = label
        self.command = command
        self.argv = argv
        self.limit = limit
        self.what = what
        self.started = time.monotonic()

    def __enter__(self) -> SshCall:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.returncode is None:  # not collected: an error or Ctrl-C on our side
            self.proc.kill()
            self.proc.communicate()

    def result(self) -> CommandResult | None:
        """What the command did; None when ssh itself failed (exit 255: the caller takes the
        paramiko path, which says why).

        Raises:
            DeadlineExceeded: no answer within the local deadline plus the connect timeout
                (ssh is killed, which closes the channel; the remote deadlines fire on their own).
        """
        left = None if self.limit is None else max(0.0, self.limit - (time.monotonic() - self.started))
        try:
            out, err = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise DeadlineExceeded(f"{self.label}: {self.what} did not answer within "
                                   f"{self.limit:g} s; connection to it closed", argv=self.argv) from None
        if self.proc.returncode == SSH_FAILED_RC:
            return None
        return CommandResult(tuple(self.argv), self.command, self.proc.returncode, out, err,
                             time.monotonic() - self.started, via="openssh")


def start(spec: MuxHost, command: str, argv: list[str], *, local_deadline: float | None,
          what: str) -> SshCall | None:
    """``command`` on the host through ``ssh``, started now; None when this lane cannot take
    it (a ProxyJump, no ``ssh`` on PATH, no key the paramiko path would accept: nothing was
    started)."""
    if spec.proxy_jump:
        return None
    name = known_hosts_name(spec.address, spec.port)
    known = hostkeys.private_file(spec.known_hosts_path(), name, spec.host_key_fingerprint)
    if known is None:
        return None
    connect_s = float(t.cast(SshHost, spec).connect_timeout_s)
    ssh = sshclient.ssh_argv(spec, known, options=["-o", "BatchMode=yes"],  # type: ignore[arg-type]
                             command=command, program="ssh")
    limit = None if local_deadline is None else local_deadline + connect_s
    try:
        proc = subprocess.Popen(ssh, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except OSError:  # no ssh on PATH (or not runnable)
        return None
    return SshCall(proc, spec.label, command, argv, limit, what)

