"""One command over the OpenSSH client: the first ``status`` of a session, when no mux is up.

Why: without a multiplexer, ``status`` paid the pydantic/PyYAML/paramiko imports and a
paramiko key exchange (in Python) before its one ``pct exec``: 2.2× a raw
``ssh … pct exec 200 -- true`` (docs/benchmarks.md). OpenSSH does the same handshake in C and
is already what opsctl runs for attach/shell/forward (:mod:`.sshclient`); here it runs the
*same* command string (:func:`opsctl.remote.command.prepare`: argv joined once, the
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
handshake runs, and nothing loads before ``ssh`` starts that only the reply needs. That is
also why ``ssh`` is started with ``os.posix_spawnp`` and read by :meth:`SshCall.result`'s
short poll loop rather than through ``subprocess`` (:mod:`.sshspawn` says why). When the
launch record already started the same ``ssh`` (:mod:`.launchrecord`), :func:`start` adopts it.
"""

from __future__ import annotations

import os
import time
import typing as t

from opsctl.errors import DeadlineExceeded
from opsctl.remote import hostkeys, sshclient, sshspawn
from opsctl.remote.command import CommandResult, known_hosts_name

if t.TYPE_CHECKING:
    from opsctl.remote.launchrecord import Launched
    from opsctl.remote.mux_socket import MuxHost

#: What ssh exits with when ssh itself failed (and what a remote command rarely does).
SSH_FAILED_RC = 255
_READ_SIZE = 65536


class SshHost(t.Protocol):
    """What a call needs of its host (a ``HostSpec`` or the target cache's ``CachedHost``)."""

    @property
    def connect_timeout_s(self) -> float: ...


class SshCall:
    """One ``ssh`` started by :func:`start`: its pid and the read ends of its stdout and
    stderr; :meth:`result` waits for it. As a context, it leaves no ``ssh`` behind when the
    caller fails before collecting it."""

    def __init__(self, pid: int, stdout: int, stderr: int, label: str, command: str,
                 argv: list[str], limit: float | None, what: str, *,
                 ssh_argv: list[str] | None = None, known_hosts: str | None = None,
                 started: float | None = None, adopted: bool = False):
        self.pid = pid
        self.got = {stdout: bytearray(), stderr: bytearray()}  # fd -> what was read
        self.open_fds = set(self.got)
        self.out, self.err = stdout, stderr
        self.rc: int | None = None
        self.label = label
        self.command = command
        self.argv = argv
        self.limit = limit
        self.what = what
        self.ssh_argv = ssh_argv  # what was spawned (the launch record keeps it)
        self.known_hosts = known_hosts  # the private known_hosts in that argv (and its stat)
        self.adopted = adopted  # started from the launch record
        self.started = time.monotonic() if started is None else started

    def __enter__(self) -> SshCall:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.rc is None:  # not collected: an error or Ctrl-C on our side
            self._kill()

    def _kill(self) -> None:
        import signal

        self._close()
        try:
            os.kill(self.pid, signal.SIGKILL)  # closes the channel; the remote deadlines fire
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        self.rc = -signal.SIGKILL

    def _close(self) -> None:
        while self.open_fds:
            os.close(self.open_fds.pop())

    def result(self) -> CommandResult | None:
        """What the command did; None when ssh itself failed (exit 255: the caller takes the
        paramiko path, which says why).

        Raises:
            DeadlineExceeded: no answer within the local deadline plus the connect timeout
                (ssh is killed, which closes the channel; the remote deadlines fire on their own).
        """
        import select

        poller = select.poll()
        for fd in self.got:
            poller.register(fd, select.POLLIN)
        reading = set(self.got)
        while reading:
            left = None if self.limit is None else self.limit - (time.monotonic() - self.started)
            if left is not None and left <= 0:
                self._kill()
                raise DeadlineExceeded(f"{self.label}: {self.what} did not answer within "
                                       f"{self.limit:g} s; connection to it closed", argv=self.argv)
            for fd, _ in poller.poll(None if left is None else max(1, int(left * 1000))):
                data = os.read(fd, _READ_SIZE)
                if data:
                    self.got[fd] += data
                else:  # EOF: ssh closed it (at its exit)
                    poller.unregister(fd)
                    reading.discard(fd)
        self._close()
        self.rc = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        if self.rc == SSH_FAILED_RC:
            return None
        return CommandResult(tuple(self.argv), self.command, self.rc, bytes(self.got[self.out]),
                             bytes(self.got[self.err]), time.monotonic() - self.started,
                             via="openssh")


def ssh_command(spec: MuxHost, command: str) -> tuple[list[str], str] | None:
    """The ``ssh`` argv that runs ``command`` on the host, and the private known_hosts file it
    names; None when this lane cannot take it (a ProxyJump, no key the paramiko path would
    accept)."""
    if spec.proxy_jump:
        return None
    name = known_hosts_name(spec.address, spec.port)
    known = hostkeys.private_file(spec.known_hosts_path(), name, spec.host_key_fingerprint)
    if known is None:
        return None
    return sshclient.ssh_argv(spec, known, options=["-o", "BatchMode=yes"],  # type: ignore[arg-type]
                              command=command, program="ssh"), str(known)


def start(spec: MuxHost, command: str, argv: list[str], *, local_deadline: float | None,
          what: str, early: Launched | None = None) -> SshCall | None:
    """``command`` on the host through ``ssh``, started now; None when this lane cannot take
    it (a ProxyJump, no ``ssh`` on PATH, no key the paramiko path would accept: nothing was
    started).

    ``early``: the ``ssh`` the launch record started (:mod:`.launchrecord`), adopted when its
    argv is exactly the one this would start (its deadline counts from its own start), else
    killed.
    """
    spelled = ssh_command(spec, command)
    if spelled is None:
        return None
    ssh, known = spelled
    connect_s = float(t.cast(SshHost, spec).connect_timeout_s)
    limit = None if local_deadline is None else local_deadline + connect_s
    if early is not None and early.ssh_argv == ssh:
        pid, out_r, err_r, started = early.adopt()
        return SshCall(pid, out_r, err_r, spec.label, command, argv, limit, what, ssh_argv=ssh,
                       known_hosts=known, started=started, adopted=True)
    if early is not None:
        early.discard()
    got = sshspawn.spawn(ssh)
    if got is None:  # no ssh on PATH (or not runnable)
        return None
    return SshCall(*got, spec.label, command, argv, limit, what, ssh_argv=ssh, known_hosts=known)
