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
"""

from __future__ import annotations

import shutil
import subprocess
import time
import typing as t

from opsctl.errors import DeadlineExceeded
from opsctl.remote import hostkeys
from opsctl.remote.transport import CommandResult, known_hosts_name

if t.TYPE_CHECKING:
    from opsctl.remote.mux_client import MuxHost

#: What ssh exits with when ssh itself failed (and what a remote command rarely does).
SSH_FAILED_RC = 255


class SshHost(t.Protocol):
    """What a call needs of its host (a ``HostSpec`` or the target cache's ``CachedHost``)."""

    @property
    def connect_timeout_s(self) -> float: ...


def run(spec: MuxHost, command: str, argv: list[str], *, local_deadline: float | None,
        what: str) -> CommandResult | None:
    """``command`` on the host through ``ssh``; None when this lane cannot say (nothing
    known to have run: the caller takes the paramiko path).

    Raises:
        DeadlineExceeded: no answer within ``local_deadline`` plus the connect timeout
            (ssh is killed, which closes the channel; the remote deadlines fire on their own).
    """
    from opsctl.remote import sshclient

    if spec.proxy_jump or shutil.which("ssh") is None:
        return None
    name = known_hosts_name(spec.address, spec.port)
    known = hostkeys.private_file(spec.known_hosts_path(), name, spec.host_key_fingerprint)
    if known is None:
        return None
    connect_s = float(t.cast(SshHost, spec).connect_timeout_s)
    ssh = sshclient.ssh_argv(spec, known, options=["-o", "BatchMode=yes"],  # type: ignore[arg-type]
                             command=command)
    limit = None if local_deadline is None else local_deadline + connect_s
    start = time.monotonic()
    try:
        proc = subprocess.run(ssh, stdin=subprocess.DEVNULL, capture_output=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise DeadlineExceeded(f"{spec.label}: {what} did not answer within {limit:g} s; "
                               "connection to it closed", argv=argv) from None
    except OSError:
        return None
    if proc.returncode == SSH_FAILED_RC:
        return None
    return CommandResult(tuple(argv), command, proc.returncode, proc.stdout, proc.stderr,
                         time.monotonic() - start, via="openssh")
