"""SSH to the Proxmox host and ``pct exec`` into its containers.

This is the one choke point for remote commands: :meth:`Remote.run` is the only
code in opsctl that calls ``shlex.join``. Every command is an argv list; untrusted
text never reaches a shell unquoted.

Design notes
- A fabric ``Connection`` per ``Remote``, opened lazily on first use (like fabric),
  closed idempotently. Host keys are checked against ``known_hosts``; fabric's
  default of accepting any key is replaced by :class:`_HostKeyPolicy`.
- A deadline is enforced *remotely* with coreutils ``timeout`` (which signals its
  whole process group) both on the host and inside the container, and locally on
  the channel, so a fired deadline leaves no remote process behind.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import select
import shlex
import socket
import threading
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from opsctl import paths
from opsctl.errors import (
    AuthError,
    ContainerMissing,
    ContainerNotRunning,
    DeadlineExceeded,
    HostKeyError,
    RemoteCommandFailed,
    TransportError,
)

if t.TYPE_CHECKING:
    import fabric
    import paramiko

    from opsctl.inventory import HostSpec

#: rc of coreutils ``timeout`` when the deadline fired (124) or SIGKILL followed (137).
TIMEOUT_RCS = frozenset({124, 137})
#: Grace between the inner (container) and outer (host) deadline, and the local one.
_OUTER_GRACE_S = 3
_LOCAL_GRACE_S = 6

Output = t.Callable[[bytes], None]


@dataclass(frozen=True)
class CommandResult:
    """What one remote command did."""

    argv: tuple[str, ...]
    command: str  # the exact string sent to the SSH server
    rc: int
    stdout: bytes
    stderr: bytes
    elapsed_s: float
    via: str = "ssh"  # "mux" when a connection multiplexer ran it (opsctl/mux.py)

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def stderr_tail(self, lines: int = 5) -> str:
        text = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return "\n".join(text[-lines:])


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint of a host key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def _make_policy(known_hosts: Path, pinned: str | None, accept_new: bool) -> t.Any:
    import paramiko

    class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc,unused-ignore]
        """Unknown host key: accept only a pinned match or, with accept-new, record it.

        A *changed* key never reaches this policy: paramiko raises BadHostKeyException.
        """

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> None:
            fp = fingerprint(key)
            if pinned is not None:
                if fp != pinned:
                    raise HostKeyError(
                        f"host key of {hostname} is {fp}, but the inventory pins {pinned}",
                        hint="if the host was reinstalled, update host_key_fingerprint")
                return
            if not accept_new:
                raise HostKeyError(
                    f"host key of {hostname} is not in {known_hosts} ({key.get_name()} {fp})",
                    hint=f"check the fingerprint, then `opsctl host trust --host {hostname}` "
                         "or pass --accept-new-host-key")
            known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with known_hosts.open("a", encoding="utf-8") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")

    return _HostKeyPolicy()


@dataclass
class Remote:
    """A lazily opened SSH connection to one Proxmox host."""

    host: HostSpec
    accept_new_host_key: bool = False
    keepalive_s: int = 15
    #: Reuse a live connection multiplexer for this host and leave one behind after a
    #: direct connection (opsctl/mux.py; ``OPSCTL_MUX=0`` turns it off).
    use_mux: bool = True
    _conn: fabric.Connection | None = field(default=None, init=False, repr=False)

    # --- lifecycle ------------------------------------------------------------

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            transport = self._conn.client.get_transport()
            healthy = transport is not None and transport.is_active()
            try:
                self._conn.close()
            finally:
                self._conn = None
            if healthy and self.use_mux:  # after a working connection: keep one for next time
                from opsctl import mux

                mux.spawn(self.host)

    @property
    def known_hosts(self) -> Path:
        return Path(self.host.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()

    def _open(self) -> fabric.Connection:
        if self._conn is not None and self._conn.is_connected:
            return self._conn
        import fabric
        import paramiko

        connect_kwargs: dict[str, t.Any] = {
            "banner_timeout": self.host.connect_timeout_s,
            "auth_timeout": self.host.connect_timeout_s,
        }
        if self.host.identity_file:
            connect_kwargs.update(key_filename=[os.path.expanduser(self.host.identity_file)],
                                  look_for_keys=False, allow_agent=False)
        conn = fabric.Connection(self.host.address, user=self.host.user, port=self.host.port,
                                 connect_timeout=max(1, int(self.host.connect_timeout_s)),
                                 connect_kwargs=connect_kwargs)
        client = conn.client
        kh = self.known_hosts
        if kh.exists():
            try:
                client.load_host_keys(str(kh))
            except (OSError, paramiko.SSHException) as exc:
                raise HostKeyError(f"cannot read known_hosts {kh}: {exc}") from None
        client.set_missing_host_key_policy(
            _make_policy(kh, self.host.host_key_fingerprint, self.accept_new_host_key))
        where = f"{self.host.ssh_label()}"
        try:
            conn.open()
        except HostKeyError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"host key of {where} CHANGED: known_hosts has {fingerprint(exc.expected_key)}, "
                f"server sent {fingerprint(exc.key)} — refusing to connect",
                hint=f"if the host was reinstalled: ssh-keygen -f {kh} -R "
                     f"'{known_hosts_name(self.host.address, self.host.port)}', then "
                     f"`opsctl host trust --host {self.host.label}`") from None
        except paramiko.AuthenticationException as exc:
            raise AuthError(f"SSH authentication to {where} failed: {exc}",
                            hint="check user and identity_file in the inventory") from None
        except TimeoutError:
            raise TransportError(f"cannot connect to {where}: timed out after "
                                 f"{self.host.connect_timeout_s:g} s") from None
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            reason = "; ".join(sorted({getattr(e, "strerror", None) or str(e)
                                       for e in exc.errors.values()}))
            raise TransportError(f"cannot connect to {where}: {reason}") from None
        except socket.gaierror as exc:
            raise TransportError(f"cannot resolve {self.host.address}: {exc.strerror}") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise TransportError(f"cannot connect to {where}: {exc or type(exc).__name__}") from None
        transport = conn.client.get_transport()
        if transport is None:  # pragma: no cover - paramiko guarantees one after connect
            raise TransportError(f"cannot connect to {where}: no transport")
        server_fp = fingerprint(transport.get_remote_server_key())
        pinned = self.host.host_key_fingerprint
        if pinned is not None and server_fp != pinned:
            conn.close()
            raise HostKeyError(f"host key of {where} is {server_fp}, but the inventory pins {pinned}",
                               hint="if the host was reinstalled, update host_key_fingerprint")
        transport.set_keepalive(self.keepalive_s)
        self._conn = conn
        return conn

    def server_fingerprint(self) -> str:
        """Connect (trusting per policy) and return the server's host-key fingerprint."""
        transport = self._open().client.get_transport()
        if transport is None:  # pragma: no cover
            raise TransportError("no transport")
        return fingerprint(transport.get_remote_server_key())

    # --- commands ------------------------------------------------------------------

    def run(self, argv: t.Sequence[str], *, timeout: float | None = None,
            stdin: bytes | t.BinaryIO | None = None, on_stdout: Output | None = None,
            on_stderr: Output | None = None, step: str = "") -> CommandResult:
        """Run ``argv`` on the host; the only place a command string is built.

        With ``timeout`` the command runs under coreutils ``timeout`` on the host,
        which kills its whole process group when the deadline fires.

        Raises:
            TransportError: the connection failed or dropped.
            DeadlineExceeded: the deadline fired (the remote group was killed).
        """
        argv = [str(a) for a in argv]
        command = host_command(argv, timeout=timeout, sudo=self.host.sudo)
        local_deadline = None if timeout is None else timeout + _OUTER_GRACE_S + _LOCAL_GRACE_S
        result = self._exec(command, argv, stdin, on_stdout, on_stderr, local_deadline, step)
        if timeout is not None and result.rc in TIMEOUT_RCS and result.elapsed_s >= timeout:
            path = save_log(step or "remote-command", result)
            raise DeadlineExceeded(
                f"{self.host.label}: {step or argv[0]} ran past its {timeout:g} s deadline; "
                "its remote process group was killed",
                argv=argv, rc=result.rc, stderr_tail=result.stderr_tail(), log_path=str(path))
        return result

    def pct_exec(self, ctid: int, argv: t.Sequence[str], *, timeout: float | None = None,
                 keep_env: bool = False, stdin: bytes | t.BinaryIO | None = None,
                 on_stdout: Output | None = None, on_stderr: Output | None = None,
                 step: str = "", check_container: bool = True) -> CommandResult:
        """Run ``argv`` inside container ``ctid`` via ``pct exec``.

        Raises:
            ContainerMissing / ContainerNotRunning: pct said so (nothing ran).
            TransportError, DeadlineExceeded: as :meth:`run`.
        """
        pct = pct_argv(ctid, argv, timeout=timeout, keep_env=keep_env)
        result = self.run(pct, timeout=timeout, stdin=stdin, on_stdout=on_stdout,
                          on_stderr=on_stderr, step=step)
        if check_container and result.rc != 0:
            classify_pct_failure(self.host.label, ctid, result, step)
        return result

    def _exec(self, command: str, argv: list[str], stdin: bytes | t.BinaryIO | None,
              on_stdout: Output | None, on_stderr: Output | None,
              local_deadline: float | None, step: str) -> CommandResult:
        if self._conn is None and self.use_mux:
            from opsctl import mux

            start = time.monotonic()
            reply = mux.call(self.host, command, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr,
                             local_deadline=local_deadline, argv=argv, what=step or argv[0])
            if reply is not None:
                return CommandResult(tuple(argv), command, reply.rc, reply.stdout, reply.stderr,
                                     time.monotonic() - start, via="mux")
        import paramiko

        conn = self._open()
        start = time.monotonic()
        transport = conn.client.get_transport()
        try:
            if transport is None or not transport.is_active():
                raise paramiko.SSHException("connection closed")
            chan = transport.open_session(timeout=self.host.connect_timeout_s)
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise TransportError(f"{self.host.label}: cannot start {step or argv[0]}: {exc}") from None
        writer: threading.Thread | None = None
        if stdin is not None:
            writer = threading.Thread(target=_feed, args=(chan, stdin), daemon=True)
            writer.start()
        else:
            chan.shutdown_write()
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            while True:
                if local_deadline is not None and time.monotonic() - start > local_deadline:
                    raise DeadlineExceeded(
                        f"{self.host.label}: {step or argv[0]} did not answer within "
                        f"{local_deadline:g} s; connection to it closed", argv=argv)
                select.select([chan], [], [], 0.25)
                while chan.recv_ready():
                    chunk = chan.recv(65536)
                    out.append(chunk)
                    if on_stdout:
                        on_stdout(chunk)
                while chan.recv_stderr_ready():
                    chunk = chan.recv_stderr(65536)
                    err.append(chunk)
                    if on_stderr:
                        on_stderr(chunk)
                if chan.exit_status_ready() and chan.eof_received and not (
                        chan.recv_ready() or chan.recv_stderr_ready()):
                    break
                if not transport.is_active():
                    raise TransportError(f"{self.host.label}: connection lost during "
                                         f"{step or argv[0]}")
            rc = chan.recv_exit_status()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise TransportError(f"{self.host.label}: connection lost during {step or argv[0]}: "
                                 f"{exc}") from None
        finally:
            chan.close()
        if writer is not None:
            writer.join(timeout=5)
        if rc == -1:  # the server sent no exit status: the session died
            rc = 255
        return CommandResult(tuple(argv), command, rc, b"".join(out), b"".join(err),
                             time.monotonic() - start)


def pct_argv(ctid: int, argv: t.Sequence[str], *, timeout: float | None = None,
             keep_env: bool = False) -> list[str]:
    """``pct exec <ct> --keep-env 0|1 -- [timeout …] argv`` (the container-side deadline)."""
    inner = [str(a) for a in argv]
    if timeout is not None:
        inner = ["timeout", "-k", "2", f"{timeout:g}", *inner]
    return ["pct", "exec", str(ctid), "--keep-env", "1" if keep_env else "0", "--", *inner]


def host_command(argv: t.Sequence[str], *, timeout: float | None = None, sudo: bool = False) -> str:
    """The one string sent to sshd: ``[sudo -n] [timeout …] argv``, joined once by shlex."""
    wrapped = [str(a) for a in argv]
    if timeout is not None:
        wrapped = ["timeout", "-k", "2", f"{timeout + _OUTER_GRACE_S:g}", *wrapped]
    if sudo:
        wrapped = ["sudo", "-n", *wrapped]
    return shlex.join(wrapped)


def _feed(chan: paramiko.Channel, stdin: bytes | t.BinaryIO) -> None:
    try:
        if isinstance(stdin, bytes):
            chan.sendall(stdin)
        else:
            while chunk := stdin.read(1 << 16):
                chan.sendall(chunk)
    except (OSError, EOFError):  # remote closed early; its exit status tells the story
        pass
    finally:
        try:
            chan.shutdown_write()
        except (OSError, EOFError):
            pass


# --- classification of pct's own failures ---------------------------------------------

_MISSING = re.compile(r"Configuration file '[^']*/(\d+)\.conf' does not exist")
_NOT_RUNNING = re.compile(r"CT (\d+) not running|container '?(\d+)'? (?:is )?not running", re.I)


def classify_pct_failure(host: str, ctid: int, result: CommandResult, step: str) -> None:
    """Raise the container error pct reported, or return if the command itself failed.

    Raises:
        ContainerMissing, ContainerNotRunning: pct refused before running anything.
        RemoteCommandFailed: pct (or sudo) itself is missing on the host.
    """
    text = result.stderr.decode("utf-8", "replace")
    label = f"{host}: container {ctid}"
    # pct dies with 255 (PVE CLIHandler); a user command printing the same text is not pct's refusal
    if result.rc == 255 and _MISSING.search(text):
        raise ContainerMissing(f"{label} does not exist (step: {step or 'pct exec'})",
                               hint="`opsctl hosts --check` lists the containers each host has")
    if result.rc == 255 and _NOT_RUNNING.search(text):
        raise ContainerNotRunning(f"{label} is not running (step: {step or 'pct exec'})",
                                  hint=f"start it on the host: pct start {ctid}")
    if result.rc == 127 and ("pct: command not found" in text or "pct: not found" in text):
        raise RemoteCommandFailed(f"{host}: `pct` not found — is this a Proxmox host?",
                                  argv=result.argv, rc=result.rc, stderr_tail=result.stderr_tail())
    if result.rc == 1 and "sudo:" in text and "password" in text:
        raise RemoteCommandFailed(f"{host}: sudo needs a password for pct (use NOPASSWD)",
                                  argv=result.argv, rc=result.rc, stderr_tail=result.stderr_tail())


def save_log(step: str, result: CommandResult) -> Path:
    """Save a command's full output; errors print this path (nothing silent)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", step)[:60] or "command"
    path = paths.new_log(f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{os.getpid()}.log")
    with path.open("wb") as f:
        f.write(f"$ {result.command}\n# rc={result.rc} elapsed={result.elapsed_s:.3f}s\n".encode())
        f.write(b"--- stdout ---\n" + result.stdout + b"\n--- stderr ---\n" + result.stderr)
    return path
