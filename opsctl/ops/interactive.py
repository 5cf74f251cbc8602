"""Interactive use of a container: attach to the job's tmux pane, a login shell, a port forward.

All three run the OpenSSH client (:mod:`opsctl.remote.sshclient`) after one direct connection
through :class:`~opsctl.remote.transport.Remote` has checked the host key.

Port forwarding and the container's network: ``pct exec`` is no network route, so
``forward`` uses ``ssh -L`` from the Proxmox host to the container's address. On a real
Proxmox host the container has its own address (its veth, ``net0``); it is read in the
container (``ip -4 -o addr show scope global``: DHCP and static alike, where ``pct config``
shows only ``ip=dhcp`` for the former) and the host, which bridges ``vmbr0``, routes to it.
When every address the container has is also one of the host's, the container shares the
host's network namespace (the sandbox; ``lxc.net.0.type: none``) and the port is the host's
own, so the forward goes to 127.0.0.1 on the host. A container with no IPv4 address at all
has no route from the host, and forward says so (exit 25) rather than guess.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import typing as t
from dataclasses import dataclass

from opsctl.errors import ConfigError, RemoteCommandFailed, TransportError
from opsctl.ops import watch
from opsctl.remote import sshclient
from remote_payload import procgroup

if t.TYPE_CHECKING:
    from opsctl.ops.jobs import Target

#: What ssh exits with for its own failures (connection, auth, host key), per ssh(1).
SSH_FAILED = 255
FORWARD_READY_S = 20.0


def terminal_type() -> str:
    """The local TERM for the remote tmux/shell (they need one; ``pct exec`` clears the env)."""
    return os.environ.get("TERM") or "xterm-256color"


@dataclass(frozen=True)
class AttachPlan:
    job_id: str
    state: str
    argv: list[str]  # in the container


def attach_plan(tgt: Target, job_id: str | None) -> AttachPlan:
    """The tmux attach command for the job's pane (default: the current job).

    Raises:
        UnknownJob: no such job.
        RemoteCommandFailed: the job has no tmux session (launched without one, or gone).
    """
    st = watch.fetch_status(tgt.agent, job_id, lines=0)
    ref, job = st["tmux"], st["job_id"]
    socket, session = ref["socket"], ref["session"]
    if not socket or not session:
        raise RemoteCommandFailed(f"{tgt.label}: job {job} has no tmux session to attach to")
    if ref["error"]:
        raise RemoteCommandFailed(f"{tgt.label}: job {job}: its tmux pane is gone ({ref['error']})",
                                  hint=f"`opsctl logs {job}` has all of its output")
    argv = ["env", f"TERM={terminal_type()}", "tmux", "-L", socket, "attach-session",
            "-t", f"={session}"]
    return AttachPlan(job, st["state"], argv)


#: A direct host's login shell: the SSH user's own (``su -l`` would ask a non-root user for
#: root's password); a constant script, the user's ``$SHELL`` read on the host.
_USER_LOGIN_SHELL = ("sh", "-c", 'exec "${SHELL:-/bin/sh}" -l')


def shell_argv(direct: bool = False) -> list[str]:
    """A login shell as root in the container (``su -l`` keeps TERM, sets HOME/SHELL/PATH);
    on a direct host, the SSH user's own login shell."""
    if direct:
        return ["env", f"TERM={terminal_type()}", *_USER_LOGIN_SHELL]
    return ["env", f"TERM={terminal_type()}", "su", "-l"]


def run_tty(tgt: Target, argv: t.Sequence[str]) -> int:
    """Run ``argv`` in the container on a PTY (``ssh -t``), attached to this terminal;
    returns its exit code.

    Raises:
        TransportError (or a subclass): the host key check failed or ssh could not connect.
    """
    with sshclient.VerifiedKey(tgt.remote) as key:
        tgt.remote.close()  # the check's connection is not needed while the session runs
        ssh = sshclient.ssh_argv(tgt.host, key.path, tty=True,
                                 command=sshclient.container_command(tgt.host, tgt.ctid, argv))
        rc = subprocess.call(ssh)
    if rc == SSH_FAILED:
        raise TransportError(f"{tgt.label}: ssh failed (exit 255; its message is above)")
    return rc


# --- forward ---------------------------------------------------------------------------


def _global_ipv4(text: str) -> list[str]:
    """Addresses of ``ip -4 -o addr show scope global`` output (``4: eth0 inet 10.0.0.5/24 …``)."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if "inet" in words and words.index("inet") + 1 < len(words):
            out.append(words[words.index("inet") + 1].split("/")[0])
    return out


def container_address(tgt: Target) -> tuple[str, str]:
    """Where the host reaches the container's ports: ``(address, why)``.

    Raises:
        RemoteCommandFailed: the container has no IPv4 address (or no ``ip``).
    """
    if tgt.host.direct:
        return "127.0.0.1", "a direct host: the target is the host itself"
    argv = ["ip", "-4", "-o", "addr", "show", "scope", "global"]
    inside = tgt.remote.pct_exec(tgt.ctid, argv, timeout=20, step="container address")
    if inside.rc != 0:
        raise RemoteCommandFailed(f"{tgt.label}: cannot read the container's address "
                                  f"(`ip` rc {inside.rc}: {inside.stderr_tail(1)})",
                                  argv=inside.argv, rc=inside.rc, hint="install iproute2 in it")
    mine = _global_ipv4(inside.stdout.decode("utf-8", "replace"))
    if not mine:
        raise RemoteCommandFailed(f"{tgt.label}: the container has no IPv4 address; the host "
                                  "has no route to its ports")
    host = tgt.remote.run(argv, timeout=20, step="host addresses")
    if host.rc == 0 and set(mine) <= set(_global_ipv4(host.stdout.decode("utf-8", "replace"))):
        return "127.0.0.1", "the container shares the host's network"
    return mine[0], "the container's own address"


def parse_ports(spec: str) -> tuple[int, int]:
    """``PORT`` or ``LOCAL:REMOTE`` → (local, remote).

    Raises:
        ConfigError: not one or two port numbers in 1-65535.
    """
    parts = spec.split(":")
    try:
        ports = [int(p) for p in parts]
    except ValueError:
        ports = []
    if len(ports) not in (1, 2) or not all(0 < p < 65536 for p in ports):
        raise ConfigError(f"{spec!r} is not PORT or LOCAL:REMOTE (ports 1-65535)",
                          hint="e.g. opsctl forward 6006, or 16006:6006")
    return ports[0], ports[-1]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True




def forward(tgt: Target, local: int, remote_port: int,
            on_ready: t.Callable[[str, str], None]) -> int:
    """Forward 127.0.0.1:``local`` to ``remote_port`` in the container until ssh ends or
    Ctrl-C (``KeyboardInterrupt`` propagates after ssh is stopped). ``on_ready(address,
    why)`` is called once the local port accepts connections. Returns ssh's exit code.

    Raises:
        ConfigError: the local port is in use.
        TransportError: ssh could not connect or set up the forward.
        RemoteCommandFailed: the container has no address the host can reach.
    """
    if not _port_free(local):
        raise ConfigError(f"127.0.0.1:{local} is already in use here",
                          hint="pick another local port: opsctl forward LOCAL:REMOTE")
    address, why = container_address(tgt)
    with sshclient.VerifiedKey(tgt.remote) as key:
        tgt.remote.close()
        argv = sshclient.ssh_argv(tgt.host, key.path, options=[
            "-N", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
            "-L", f"127.0.0.1:{local}:{address}:{remote_port}"])
        # a session of its own: Ctrl-C, SIGTERM and SIGHUP reach opsctl, which ends it
        # (`finally`, and procgroup's handlers for a signal that arrives anywhere); a SIGKILL
        # of opsctl ends it too (die_with_parent), so no port stays forwarded
        proc = procgroup.Group(argv, stdout=procgroup.INHERIT, stderr=procgroup.INHERIT,
                               die_with_parent=True)
        try:
            deadline = time.monotonic() + FORWARD_READY_S
            # listening = the port is taken (it was free before); connecting to test it would
            # open a channel to the remote port and make ssh complain if nothing listens yet
            while proc.poll() is None and _port_free(local):
                if time.monotonic() > deadline:
                    raise TransportError(f"{tgt.label}: the forward did not come up within "
                                         f"{FORWARD_READY_S:g} s")
                time.sleep(0.05)
            if proc.poll() is not None:
                raise TransportError(f"{tgt.label}: ssh could not set up the forward "
                                     f"(exit {proc.returncode}; its message is above)")
            on_ready(address, why)
            return proc.wait()
        finally:
            proc.end(grace=5.0)
