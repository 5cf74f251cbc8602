"""SSH to the Proxmox host and ``pct exec`` into its containers: the one transport.

Every non-interactive remote command goes through :class:`Remote` (:meth:`Remote.run`,
:meth:`Remote.pct_exec`): over its own fabric connection, or through the host's live
multiplexer (:mod:`opsctl.remote.mux_client`), which keeps connections made by this same class.
How a command is spelled (argv joined once, its deadlines inside it) is
:mod:`opsctl.remote.command`. The OpenSSH client runs only for a terminal or a port
(:mod:`opsctl.remote.sshclient`) and for bulk file data (rsync's remote shell, the end of this
module). Every command is an argv list; untrusted text never reaches a shell unquoted.

Design notes
- A fabric ``Connection`` per ``Remote``, opened lazily on first use (like fabric),
  closed idempotently. Host keys are checked against ``known_hosts``; fabric's
  default of accepting any key is replaced by :class:`_HostKeyPolicy`. The TCP peer must
  send an SSH banner within the connect timeout first (:mod:`opsctl.remote.sshbanner`).
- A deadline is enforced *remotely* with coreutils ``timeout`` (which signals its
  whole process group) both on the host and inside the container, and locally on
  the channel, so a fired deadline leaves no remote process behind.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
import socket
import threading
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.config.sudoers import sudoers_rule
from opsctl.errors import (
    AuthError,
    ConfigError,
    ContainerMissing,
    ContainerNotRunning,
    DeadlineExceeded,
    HostKeyError,
    HostSetupError,
    PctTooOld,
    TransportError,
)
from opsctl.remote import channel, identity, sshbanner
from opsctl.remote.command import (
    CommandResult,
    Kept,
    check_argv,
    check_command,
    guarded,
    host_command,
    known_hosts_name,
    local_deadline,
    prepare,
    shell_line,
)

if t.TYPE_CHECKING:
    import fabric
    import paramiko

    from opsctl.config.inventory import HostSpec

#: paramiko's words for a peer whose first line was not an SSH banner.
_NOT_SSH = re.compile(r"protocol banner|Indecipherable protocol version|Invalid SSH banner")

#: rc of coreutils ``timeout`` when the deadline fired (124) or SIGKILL followed (137).
TIMEOUT_RCS = frozenset({124, 137})

Output = t.Callable[[bytes], None]


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint of a host key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


_warned_lines: set[tuple[str, int]] = set()


#: Unreadable known_hosts lines named one by one, per file; the rest are counted.
_WARN_LINES = 5


def _for_names(hosts: str, names: frozenset[str] | None) -> bool:
    """Whether a known_hosts line's host field (plain or ``|1|`` hashed names) names one of
    ``names`` (None: any).

    Raises:
        ValueError: a hashed name is damaged (paramiko's lookup would fail on it, on every
            connect, with a traceback).
    """
    import paramiko

    hit = names is None
    for host in hosts.split(","):
        if host.startswith("|1|"):
            parts = host.split("|")
            try:
                if len(parts) != 4 or not parts[2] or not parts[3]:
                    raise ValueError
                hashes = {paramiko.HostKeys.hash_host(n, host) for n in names or ("",)}
            except Exception:  # bad base64, an assertion in paramiko
                raise ValueError(f"damaged hashed host name {host[:40]!r}") from None
            hit = hit or host in hashes
        elif names is not None and host in names:
            hit = True
    return hit


def load_known_hosts(host_keys: paramiko.HostKeys, path: Path,
                     revoked: list[paramiko.PKey] | None = None, *,
                     names: t.Collection[str] | None = None) -> int:
    """Add ``path``'s entries to ``host_keys``; returns how many lines were skipped.

    ``names`` (``known_hosts_name`` spellings): only lines for these hosts have their key
    parsed, as OpenSSH does, so a known_hosts of a hundred thousand other hosts costs
    milliseconds, not minutes (paramiko parses every key it loads).

    ``@revoked`` keys go to ``revoked`` (the caller refuses a server presenting one);
    ``@cert-authority`` lines are skipped (opsctl does not use host certificates).

    Unlike paramiko's loader, one malformed line (bad base64, broken key blob, not UTF-8)
    — usually for some other host — is skipped with a one-line warning naming file:line
    instead of failing every command with a traceback. OpenSSH also
    ignores such lines. A host whose own line is unreadable is then simply unknown, and the
    unknown-key refusal says so.

    Raises:
        HostKeyError: the file exists but cannot be read at all (:func:`.knownhosts.read`).
    """
    import sys

    import paramiko

    from opsctl.remote import knownhosts

    raw = knownhosts.read(path)
    if raw is None:
        return 0
    wanted = None if names is None else frozenset(names)
    skipped = 0
    for lineno, bline in enumerate(raw.splitlines(), 1):
        line = bline.decode("utf-8", "replace").strip()
        if not line or line.startswith("#"):
            continue
        marker = line.split(None, 1)[0] if line.startswith("@") else None
        if marker is not None:
            if marker != "@revoked":
                continue
            line = line.split(None, 1)[1] if " " in line or "\t" in line else ""
        try:
            if marker is None and not _for_names(line.split(None, 1)[0], wanted):
                continue  # another host's line (a revoked key counts for every host)
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except Exception as exc:  # any broken line is skipped, never fatal
            skipped += 1
            if skipped <= _WARN_LINES and (str(path), lineno) not in _warned_lines:
                _warned_lines.add((str(path), lineno))
                sys.stderr.write(f"warning: {path}:{lineno}: unreadable known_hosts line "
                                 f"ignored ({type(exc).__name__})\n")
            continue
        if entry is None:  # too few fields or a key type paramiko does not know
            continue
        if marker == "@revoked":
            if revoked is not None:
                revoked.append(entry.key)
            continue
        for name in entry.hostnames:
            host_keys.add(name, entry.key.get_name(), entry.key)
    if skipped > _WARN_LINES and (str(path), 0) not in _warned_lines:
        _warned_lines.add((str(path), 0))
        sys.stderr.write(f"warning: {path}: {skipped - _WARN_LINES} more unreadable known_hosts "
                         "lines ignored\n")
    return skipped


def _make_policy(known_hosts: Path, pinned: str | None, accept_new: bool, label: str) -> t.Any:
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
                    hint=f"check the fingerprint, then `opsctl host trust --host {label}` "
                         "or pass --accept-new-host-key")
            from opsctl.remote import knownhosts

            # a HostKeyError, not an OSError: paramiko's caller would read that as a
            # connect failure
            knownhosts.append(known_hosts, f"{hostname} {key.get_name()} {key.get_base64()}",
                              what=f"the host key of {hostname} ({key.get_name()} {fp})",
                              then="nothing was run")

    return _HostKeyPolicy()


def words(exc: BaseException) -> str:
    """An exception's own words, or its type's name when it has none (``EOFError()``)."""
    return str(exc) or type(exc).__name__


def handshake_failure(spec: HostSpec, where: str, started: paramiko.Transport | None,
                       exc: BaseException) -> TransportError:
    """The error for a connection paramiko could not take through the SSH handshake.

    A peer that sent no banner never spoke SSH (direct peers are caught earlier, by
    :mod:`.sshbanner`; behind a ProxyJump paramiko says so, or gives up at the connect
    timeout with "No existing session"). A peer that sent its banner and then closed the
    connection, or never finished the key exchange, is named with the banner it sent:
    paramiko's own words for these ("", "No existing session") say nothing.
    """
    said = str(exc)
    version = started.remote_version if started is not None else ""
    timeout = f"{spec.connect_timeout_s:g} s"
    if _NOT_SSH.search(said) or (started is not None and not version):
        hops = f" or a ProxyJump hop ({spec.proxy_jump})" if spec.proxy_jump else ""
        # paramiko's bare words when its banner wait ran out are the connect timeout's
        why = said if _NOT_SSH.search(said) and said != "Error reading SSH protocol banner" \
            else f"no SSH banner within {timeout}"
        return TransportError(f"host {where}{hops} accepted the connection but never "
                              f"spoke SSH ({why})",
                              hint="check the addresses and ports of the host and its hops")
    if version and started is not None and not started.initial_kex_done:
        # EOFError: the peer hung up; "No existing session": paramiko gave up waiting
        if isinstance(exc, EOFError):
            then = "then closed the connection"
        elif said in ("", "No existing session"):
            then = f"did not complete the key exchange within {timeout}"
        else:  # it sent something that is not a key exchange
            then = f"the key exchange failed ({said[:120]})"
        return TransportError(f"host {where} sent the SSH banner {version[:80]!r} but {then}",
                              hint="the host's sshd may be overloaded (MaxStartups), shutting "
                                   "down or not an sshd; try again, then check it on the host")
    return TransportError(f"cannot connect to {where}: {words(exc)}")



def _open_connection(conn: fabric.Connection, sock: socket.socket | None, spec: HostSpec,
                     where: str, *, changed_hint: str, auth_hint: str) -> None:
    """Open ``conn`` (the target or a ProxyJump hop; ``sock``: the TCP connection it was
    given, closed if the open fails, as paramiko leaves it open), wording every failure
    for ``where`` once, the same for a target and a hop.

    Raises:
        HostKeyError: the host key changed (``changed_hint``: how to trust the new one) or
            the policy refused an unknown one.
        AuthError: authentication failed (``auth_hint``).
        TransportError: no TCP connection, a timeout, or a failed SSH handshake.
    """
    import paramiko

    try:
        try:
            conn.open()
        except BaseException:
            if sock is not None:
                sock.close()
            raise
    except HostKeyError:
        raise
    except paramiko.BadHostKeyException as exc:
        raise HostKeyError(
            f"host key of {where} CHANGED: known_hosts has {fingerprint(exc.expected_key)}, "
            f"server sent {fingerprint(exc.key)} — refusing to connect",
            hint=changed_hint) from None
    except paramiko.AuthenticationException as exc:
        raise AuthError(f"SSH authentication to {where} failed: {exc}", hint=auth_hint) from None
    except TimeoutError:
        raise TransportError(f"cannot connect to {where}: timed out after "
                             f"{spec.connect_timeout_s:g} s") from None
    except paramiko.ssh_exception.NoValidConnectionsError as exc:
        reason = "; ".join(sorted({getattr(e, "strerror", None) or str(e)
                                   for e in exc.errors.values()}))
        raise TransportError(f"cannot connect to {where}: {reason}") from None
    except socket.gaierror as exc:
        raise TransportError(f"cannot resolve {spec.address}: {exc.strerror}") from None
    except (paramiko.SSHException, EOFError) as exc:
        failure = handshake_failure(spec, where, conn.client.get_transport(), exc)
        conn.close()
        raise failure from None
    except OSError as exc:
        raise TransportError(f"cannot connect to {where}: {words(exc)}") from None

@dataclass
class Remote:
    """A lazily opened SSH connection to one Proxmox host."""

    host: HostSpec
    accept_new_host_key: bool = False
    keepalive_s: int = 15
    #: Reuse a live connection multiplexer for this host and leave one behind after a
    #: direct connection (opsctl/remote/mux_client.py; ``OPSCTL_MUX=0`` turns it off).
    use_mux: bool = True
    _conn: fabric.Connection | None = field(default=None, init=False, repr=False)
    #: the ProxyJump hops :meth:`_gateway` made, first hop first: (as written, spec, connection)
    _hops: list[tuple[str, HostSpec, fabric.Connection]] = field(default_factory=list, init=False,
                                                                  repr=False)

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
                from opsctl.remote import mux_client as mux

                mux.spawn(self.host)

    @property
    def known_hosts(self) -> Path:
        return self.host.known_hosts_path()

    def _open(self) -> fabric.Connection:
        if self._conn is not None and self._conn.is_connected:
            return self._conn

        connect_kwargs: dict[str, t.Any] = {
            "banner_timeout": self.host.connect_timeout_s,
            "auth_timeout": self.host.connect_timeout_s,
        }
        if self.host.identity_file:
            key_file = identity.check(self.host.identity_file, self.host.label)
            connect_kwargs.update(key_filename=[key_file],
                                  look_for_keys=False, allow_agent=False)
        gateway = self._gateway()
        conn = self._connection(self.host, connect_kwargs, gateway=gateway)
        client = conn.client
        kh = self.known_hosts
        revoked: list[paramiko.PKey] = []
        load_known_hosts(client.get_host_keys(), kh, revoked,
                         names=[known_hosts_name(self.host.address, self.host.port)])
        client.set_missing_host_key_policy(
            _make_policy(kh, self.host.host_key_fingerprint, self.accept_new_host_key,
                         self.host.label))
        where = f"{self.host.ssh_label()}"
        # behind a ProxyJump the last hop's channel is the socket (paramiko's banner checks)
        sock = self._dial() if gateway is None else None
        if sock is not None:
            conn.connect_kwargs["sock"] = sock
        self.open_hops()
        _open_connection(
            conn, sock, self.host, where,
            changed_hint=f"if the host was reinstalled: ssh-keygen -f {kh} -R "
                         f"'{known_hosts_name(self.host.address, self.host.port)}', then "
                         f"`opsctl host trust --host {self.host.label}`",
            auth_hint="check user and identity_file in the inventory")
        transport = conn.client.get_transport()
        if transport is None:  # pragma: no cover - paramiko guarantees one after connect
            raise TransportError(f"cannot connect to {where}: no transport")
        server_fp = fingerprint(transport.get_remote_server_key())
        if transport.get_remote_server_key() in revoked:
            conn.close()
            raise HostKeyError(f"host key of {where} ({server_fp}) is marked @revoked in {kh}")
        pinned = self.host.host_key_fingerprint
        if pinned is not None and server_fp != pinned:
            conn.close()
            raise HostKeyError(f"host key of {where} is {server_fp}, but the inventory pins {pinned}",
                               hint="if the host was reinstalled, update host_key_fingerprint")
        transport.set_keepalive(self.keepalive_s)
        self._conn = conn
        return conn

    def open_hops(self) -> None:
        """Open the ProxyJump hops :meth:`_gateway` made, first hop first (fabric would open
        them inside the target's connect, where a hop's failure reads as the target's).

        Raises:
            HostKeyError, AuthError, TransportError: naming the hop.
        """
        for hop in self._hops:
            self._open_hop(*hop)

    def _open_hop(self, written: str, spec: HostSpec, hop: fabric.Connection) -> None:
        """Open one ProxyJump hop (the earlier ones are open), naming the hop in any failure:
        opened inside the target's connect, its failure would read as the target's.

        Raises:
            HostKeyError, AuthError, TransportError: as :meth:`_open` words them, for the hop.
        """

        of = f"ProxyJump hop {written} of {self.host.label}"
        where = f"{spec.ssh_label()} ({of})"
        sock = None
        if hop.gateway is None or hop.gateway is False:  # the first hop: a direct TCP peer
            try:
                sock = Remote(spec, use_mux=False)._dial()
            except TransportError as exc:
                raise TransportError(f"{of}: {exc.message}", hint=exc.hint) from None
            hop.connect_kwargs["sock"] = sock
        _open_connection(
            hop, sock, spec, where,
            changed_hint=f"if the hop was reinstalled: ssh-keygen -f {self.known_hosts} -R "
                         f"'{known_hosts_name(spec.address, spec.port)}'",
            auth_hint="check the hop's user and identity file")

    def _dial(self) -> socket.socket:
        """The TCP connection to the host, once its sshd has sent its banner
        (:mod:`.sshbanner`: a peer that never speaks SSH is named as one, within the
        connect timeout).

        Raises:
            TransportError: as :meth:`_open` words a connection failure.
        """
        spec = self.host
        where = spec.ssh_label()
        try:
            return sshbanner.connect(spec.address, spec.port, spec.connect_timeout_s)
        except socket.gaierror as exc:
            raise TransportError(f"cannot resolve {spec.address}: {exc.strerror}") from None
        except TimeoutError:
            raise TransportError(f"cannot connect to {where}: timed out after "
                                 f"{spec.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise TransportError(f"cannot connect to {where}: {exc.strerror or exc}") from None

    @staticmethod
    def _connection(spec: HostSpec, connect_kwargs: dict[str, t.Any],
                    gateway: fabric.Connection | None) -> fabric.Connection:
        import fabric
        import paramiko

        from opsctl.remote import liblog

        liblog.install()  # paramiko's thread logs tracebacks; the caller reports the failure
        # ~/.ssh/config was applied once, by opsctl/config/sshconfig.py, into ``spec``; fabric must
        # not apply it again (its gateways would trust any host key).
        config = fabric.Config(ssh_config=paramiko.SSHConfig())
        return fabric.Connection(spec.address, user=spec.user, port=spec.port, config=config,
                                 connect_timeout=max(1, int(spec.connect_timeout_s)),
                                 connect_kwargs=connect_kwargs,
                                 gateway=gateway if gateway is not None else False)

    def _gateway(self) -> fabric.Connection | None:
        """The ProxyJump hops as nested fabric gateways, each checked against known_hosts.

        Raises:
            ConfigError: a hop is not ``[user@]host[:port]``.
        """
        if not self.host.proxy_jump:
            return None
        from opsctl.config import inventory

        gateway: fabric.Connection | None = None
        self._hops = []
        kh = self.known_hosts
        for hop in self.host.proxy_jump.split(","):
            # a hop is written in the user's inventory or ~/.ssh/config: a configured name
            spec = inventory.Inventory(hosts={}, sources=(), torch_builds={}).resolve(
                hop.strip(), configured=True)
            if spec.proxy_jump:
                raise ConfigError(f"{self.host.label}: ProxyJump hop {hop!r} has its own "
                                  "ProxyJump; list every hop in one ProxyJump instead")
            # no hop waits longer than the target's connect timeout, the bound the user set
            if spec.connect_timeout_s > self.host.connect_timeout_s:
                spec = spec.model_copy(update={"connect_timeout_s": self.host.connect_timeout_s})
            kwargs: dict[str, t.Any] = {"banner_timeout": spec.connect_timeout_s,
                                        "auth_timeout": spec.connect_timeout_s}
            if spec.identity_file:
                kwargs.update(key_filename=[identity.check(spec.identity_file, hop.strip())])
            gateway = self._connection(spec, kwargs, gateway)
            load_known_hosts(gateway.client.get_host_keys(), kh,
                             names=[known_hosts_name(spec.address, spec.port)])
            gateway.client.set_missing_host_key_policy(
                _make_policy(kh, None, self.accept_new_host_key, hop.strip()))
            self._hops.append((hop.strip(), spec, gateway))
        return gateway

    def server_key(self) -> paramiko.PKey:
        """Connect directly (trusting per policy: known_hosts, pin, accept-new) and return the
        host key this connection verified."""
        transport = self._open().client.get_transport()
        if transport is None:  # pragma: no cover
            raise TransportError("no transport")
        key: paramiko.PKey = transport.get_remote_server_key()
        return key

    # --- commands ------------------------------------------------------------------

    def run(self, argv: t.Sequence[str], *, timeout: float | None = None,
            stdin: bytes | t.BinaryIO | None = None, on_stdout: Output | None = None,
            on_stderr: Output | None = None, step: str = "",
            keep_bytes: int | None = None) -> CommandResult:
        """Run ``argv`` on the host; the only place a command string is built.

        With ``timeout`` the command runs under coreutils ``timeout`` on the host,
        which kills its whole process group when the deadline fires. ``keep_bytes``: the
        result keeps only the last that many bytes of each stream (:class:`Kept`; the
        callbacks still get every byte), so output streams through in constant memory.

        Raises:
            TransportError: the connection failed or dropped.
            DeadlineExceeded: the deadline fired (the remote group was killed).
        """
        argv, command = prepare(self.host, argv, timeout=timeout, step=step)
        result = self._exec(command, argv, stdin, on_stdout, on_stderr, local_deadline(timeout), step,
                            keep_bytes)
        return self.check_deadline(result, timeout=timeout, step=step)

    def check_deadline(self, result: CommandResult, *, timeout: float | None,
                       step: str = "") -> CommandResult:
        """``result`` unless the remote deadline fired (the second half of :meth:`run`).

        Raises:
            DeadlineExceeded: ``timeout`` fired (the remote group was killed).
        """
        if timeout is not None and result.rc in TIMEOUT_RCS and result.elapsed_s >= timeout:
            path = save_log(step or "remote-command", result)
            raise DeadlineExceeded(
                f"{self.host.label}: {step or result.argv[0]} ran past its {timeout:g} s deadline; "
                "its remote process group was killed",
                argv=list(result.argv), rc=result.rc, stderr_tail=result.stderr_tail(),
                log_path=str(path))
        return result

    def pct_exec(self, ctid: int, argv: t.Sequence[str], *, timeout: float | None = None,
                 keep_env: bool = False, stdin: bytes | t.BinaryIO | None = None,
                 on_stdout: Output | None = None, on_stderr: Output | None = None,
                 step: str = "", check_container: bool = True, guard: bool = False,
                 keep_bytes: int | None = None) -> CommandResult:
        """Run ``argv`` in the target: inside container ``ctid`` via ``pct exec``, or on a
        direct host (``enter: direct``, ``ctid`` :data:`~opsctl.config.inventory.DIRECT_CTID`)
        on the host itself (:mod:`opsctl.remote.entry`: the one place the two differ).

        ``guard``: under the container-side guard rather than ``timeout`` (``opsctl exec``;
        :func:`opsctl.remote.command.guard_argv`). ``keep_bytes``: as :meth:`run`.

        Raises:
            ConfigError: an empty argv, program name or a NUL byte (nothing was sent).
            ContainerMissing / ContainerNotRunning: pct said so (nothing ran).
            TransportError, DeadlineExceeded: as :meth:`run`.
        """
        from opsctl.remote import entry

        argv = check_argv(self.host.label, step or "pct exec", argv)
        way = entry.of(self.host)
        entered = way.argv(entry.check_ct(self.host, ctid), argv, timeout=timeout,
                           keep_env=keep_env, guard=guard)
        result = self.run(entered, timeout=timeout, stdin=stdin, on_stdout=on_stdout,
                          on_stderr=on_stderr, step=step, keep_bytes=keep_bytes)
        return self.check_pct_result(ctid, result, step=step, check_container=check_container)

    def check_pct_result(self, ctid: int, result: CommandResult, *, step: str = "",
                         check_container: bool = True) -> CommandResult:
        """``result`` unless pct itself failed (the second half of :meth:`pct_exec`).

        Raises:
            ContainerMissing / ContainerNotRunning, HostSetupError, PctTooOld: pct said so.
        """
        if check_container and result.rc != 0 and self.host.direct:
            classify_direct_failure(self.host, result, step)
        elif check_container and result.rc != 0:
            try:
                classify_pct_failure(self.host, ctid, result, step)
            except (ContainerMissing, ContainerNotRunning):
                # The command itself may print pct's words and exit with pct's code; only
                # believe them when the container really is not there.
                if self._container_running(ctid):
                    return result
                raise
        return result

    def _container_running(self, ctid: int) -> bool:
        """``pct status <ctid>`` says running (one extra round trip, on the failure path only)."""
        res = self.run(["pct", "status", str(ctid)], timeout=30, step="pct status")
        return res.rc == 0 and res.stdout.decode("utf-8", "replace").split() == ["status:", "running"]

    def _exec(self, command: str, argv: list[str], stdin: bytes | t.BinaryIO | None,
              on_stdout: Output | None, on_stderr: Output | None,
              local_deadline: float | None, step: str,
              keep_bytes: int | None = None) -> CommandResult:
        if self._conn is None and self.use_mux:
            from opsctl.remote import mux_client as mux

            start = time.monotonic()
            reply = mux.call(self.host, command, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr,
                             local_deadline=local_deadline, argv=argv, what=step or argv[0],
                             keep_bytes=keep_bytes)
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
        stop_feeding = threading.Event()
        if stdin is not None:
            writer = threading.Thread(target=channel.feed, args=(chan, stdin, stop_feeding), daemon=True)
            writer.start()
        else:
            chan.shutdown_write()
        out, err = Kept(keep_bytes), Kept(keep_bytes)

        def collect(into: Kept, forward: Output | None) -> Output:
            def take(chunk: bytes) -> None:
                into.add(chunk)
                if forward:
                    forward(chunk)  # may raise OutputClosed: passed through, the channel closed
            return take

        def deadline() -> None:
            if local_deadline is not None and time.monotonic() - start > local_deadline:
                raise DeadlineExceeded(
                    f"{self.host.label}: {step or argv[0]} did not answer within "
                    f"{local_deadline:g} s; connection to it closed", argv=argv)

        try:
            rc = channel.pump(chan, collect(out, on_stdout), collect(err, on_stderr), before_poll=deadline)
        except channel.ConnectionDropped:
            raise TransportError(f"{self.host.label}: connection lost during "
                                 f"{step or argv[0]}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise TransportError(f"{self.host.label}: connection lost during {step or argv[0]}: "
                                 f"{exc}") from None
        finally:
            stop_feeding.set()  # the command ended: stop reading our stdin
            chan.close()
        if writer is not None:
            writer.join(timeout=5)
        if rc is None or rc == -1:  # the server sent no exit status: the session died
            rc = 255
        return CommandResult(tuple(argv), command, rc, out.value(), err.value(),
                             time.monotonic() - start)


# --- classification of pct's own failures ---------------------------------------------
# By pct's exact message (stdout empty), never by its exit code: pct's errors are Perl `die`s
# whose exit code is whatever errno was left (2 for a missing container, ENOENT from the
# cluster filesystem), and the command's own exit code passes through `pct exec` unchanged.

_MISSING = re.compile(r"Configuration file 'nodes/[^/']+/lxc/(\d+)\.conf' does not exist\n")
_NOT_RUNNING = re.compile(r"container '(\d+)' not running!\n")
_NO_KEEP_ENV = "Unknown option: keep-env\n"  # pve-container < 5.0.9, Getopt::Long's warning
_SUDO_REFUSED = ("sudo: a password is required", "sudo: a terminal is required",
                 "is not allowed to execute", "is not in the sudoers file")
#: coreutils timeout(1) when it cannot exec its command (rc 126/127)
_TIMEOUT_FAILED = re.compile(r"^timeout: failed to run command [‘'](.+?)[’']", re.M)
#: lxc src/lxc/attach.c lxc_attach_run_command: execvp failed in the container (rc 126/127)
_ATTACH_EXEC_FAILED = re.compile(r'Failed to exec "(.+?)"')
#: env(1) when it cannot exec its command: `env: 'timeout': No such file or directory`
_ENV_FAILED = re.compile(r"^env: [‘'](.+?)[’']: No such file", re.M)
_SUDO_NOT_FOUND = re.compile(r"^sudo: (.+?): command not found", re.M)
_SHELL_NOT_FOUND = re.compile(r"(?:^|: )(sudo|env|timeout): (?:command )?not found", re.M)


def classify_pct_failure(host: HostSpec, ctid: int, result: CommandResult, step: str) -> None:
    """Raise the error pct (or what runs it) reported, or return if the command itself failed.

    Raises:
        ContainerMissing, ContainerNotRunning: pct refused before running anything.
        PctTooOld: the host's pve-container has no ``exec --keep-env``.
        HostSetupError: pct, ``timeout`` or the sudoers rule is missing on the host, or
            ``timeout`` in the container when opsctl put a deadline there.
    """
    text = result.stderr.decode("utf-8", "replace")
    label = f"{host.label}: container {ctid}"
    where = f"(step: {step or 'pct exec'})"
    quiet = result.stdout == b""
    if quiet and (m := _MISSING.fullmatch(text)) and m[1] == str(ctid):
        raise ContainerMissing(f"{label} does not exist {where}",
                               hint="`opsctl hosts --check` lists the containers each host has")
    if quiet and (m := _NOT_RUNNING.fullmatch(text)) and m[1] == str(ctid):
        raise ContainerNotRunning(f"{label} is not running {where}",
                                  hint=f"start it on the host: pct start {ctid}")
    if quiet and text.startswith(_NO_KEEP_ENV) and "400 unable to parse option" in text:
        raise PctTooOld(
            f"{host.label}: pct has no `exec --keep-env`: the host's pve-container is older "
            f"than 5.0.9 {where}", missing="pve-container >= 5.0.9",
            hint="on the host: apt update && apt install pve-container (PVE 8; a PVE 7 host "
                 "needs the upgrade to PVE 8); `pveversion -v | grep pve-container` shows it")
    problem = _host_side_missing(host, result, text)
    if problem is not None:
        message, missing, hint = problem
        raise HostSetupError(f"{host.label}: {message} {where}", missing=missing, hint=hint)
    if _container_deadline(result.argv) and missing_in_container(result) == "timeout":
        raise HostSetupError(
            f"{label} has no `timeout` (coreutils), which opsctl runs there to enforce the "
            f"deadline {where}", missing="timeout",
            hint=f"install coreutils in container {ctid}")
    if guarded(result.argv) and missing_in_container(result) == "python3":
        raise HostSetupError(
            f"{label} has no `python3`, which `opsctl exec` runs the command under (its "
            f"deadline and clean-up) {where}", missing="python3",
            hint=f"install python3 in container {ctid} (opsctl's agent needs it too)")


def classify_direct_failure(host: HostSpec, result: CommandResult, step: str) -> None:
    """Raise what kept a direct host's command from starting, or return if the command itself
    failed (a direct host has no pct, so only the host's own tools can be missing).

    Raises:
        HostSetupError: ``timeout`` or the guard's ``python3`` is missing on the host.
    """
    where = f"(step: {step or 'command'})"
    if result.rc not in (126, 127):
        return
    text = result.stderr.decode("utf-8", "replace")
    failed = [m[1] for rx in (_TIMEOUT_FAILED, _ENV_FAILED, _SHELL_NOT_FOUND)
              for m in rx.finditer(text)]
    if result.argv[:1] != ("timeout",) and "timeout" in failed:
        raise HostSetupError(f"{host.label}: `timeout` (coreutils) not found on the host {where}",
                             missing="timeout", hint="install coreutils on the host")
    if guarded_direct(result.argv) and "python3" in failed:
        raise HostSetupError(
            f"{host.label} has no `python3`, which `opsctl exec` runs the command under (its "
            f"deadline and clean-up) {where}", missing="python3",
            hint="install python3 on the host (opsctl's agent needs it too)")


def guarded_direct(argv: t.Sequence[str]) -> bool:
    """Did the direct entry put the exec guard first?"""
    from opsctl.remote.command import GUARD_PREFIX

    return tuple(argv[:3]) == GUARD_PREFIX


def _host_side_missing(host: HostSpec, result: CommandResult,
                       text: str) -> tuple[str, str, str] | None:
    """(message, the missing piece, hint) when pct could not even be started on the host."""
    pct = host.pct_path if host.sudo else "pct"
    if host.sudo and not result.stdout and text.startswith("sudo: ") \
            and any(s in text for s in _SUDO_REFUSED):
        line = sudoers_rule(host.user, host.pct_path)
        return (f"sudo refused to run pct for {host.user}: the host's sudoers lacks the line "
                f"`{line}`", line, f"on the host: echo {shlex.quote(line)} > /etc/sudoers.d/opsctl "
                             "&& chmod 0440 /etc/sudoers.d/opsctl (check with visudo -c); if pct "
                             "is not there, set pct_path in the inventory")
    if result.rc not in (1, 126, 127):
        return None
    failed = [m[1] for rx in (_TIMEOUT_FAILED, _ENV_FAILED, _SUDO_NOT_FOUND, _SHELL_NOT_FOUND)
              for m in rx.finditer(text)]
    if pct in failed or "pct" in failed:
        return (f"`{pct}` not found on the host: is it a Proxmox VE node?", pct,
                "opsctl runs `pct` on the host it connects to (the node, not a container); "
                + (f"set pct_path in the inventory if pct is not {pct}" if host.sudo
                   else "check `command -v pct` there"))
    if "timeout" in failed and not _ATTACH_EXEC_FAILED.search(text):
        return ("`timeout` (coreutils) not found on the host", "timeout",
                "install coreutils on the host")
    if "sudo" in failed:
        return (f"`sudo` not found on the host (inventory: sudo: true for {host.user})", "sudo",
                "install sudo on the host, or connect as root")
    return None


def _container_deadline(argv: t.Sequence[str]) -> bool:
    """Did opsctl put ``timeout`` in front of the container command (see pct_argv)?"""
    try:
        rest = list(argv)[list(argv).index("--") + 1:]
    except ValueError:
        return False
    return rest[:1] == ["timeout"]


def missing_in_container(result: CommandResult) -> str | None:
    """The command the container could not exec (lxc-attach or timeout said so), else None."""
    if result.rc not in (126, 127):
        return None
    text = result.stderr.decode("utf-8", "replace")
    if m := _ATTACH_EXEC_FAILED.search(text):  # lxc-attach: the first command itself
        return m[1]
    if m := _TIMEOUT_FAILED.search(text):  # the container-side deadline's command
        return m[1]
    if m := _ENV_FAILED.search(text):  # `env VAR=... cmd` in the container (the agent's argv)
        return m[1]
    return None


def save_log(step: str, result: CommandResult) -> Path:
    """Save a command's output, capped, in the rotated logs folder; errors print this path
    (nothing silent). :mod:`opsctl.remote.savedlogs` says what is kept.

    Raises:
        safe_write.WriteFailed: the log could not be written (a full disk).
    """
    from opsctl.remote import savedlogs

    return savedlogs.save(step, result.command, result.rc, result.elapsed_s, result.stdout,
                          result.stderr)


# --- the OpenSSH client, for bulk data (opsctl push / pull) ---------------------------------
# File transfers stream gigabytes; paramiko moves bulk data at a fraction of OpenSSH's rate
# and rsync needs a real `ssh` program as its remote shell anyway. Both run the OpenSSH client
# with exactly the host's resolved settings and the same known_hosts, strictly (never
# accept-new); the container command string comes from host_command() like every other.


_BULK_CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
                 "aes128-ctr,aes256-ctr")


def openssh_argv(spec: HostSpec) -> list[str]:
    """``ssh`` and its options for ``spec``, without the host argument (rsync appends it).

    ``-F /dev/null``: ~/.ssh/config was already applied into ``spec`` (sshconfig.py); it must
    not be applied twice or differently. Host keys: ``StrictHostKeyChecking=yes`` against the
    host's known_hosts file, so an unknown or changed key is refused as everywhere else; that
    file and the ``identity_file`` are checked here first, as the SSH library's connections
    check them, since the client would wait on a FIFO there for a writer that never comes (no
    deadline covers it) and read a link to ``/dev/zero`` without end.

    Raises:
        HostKeyError: the known_hosts file is not a regular file, is over its size limit or
            cannot be read (:func:`.knownhosts.read`); nothing was run.
        ConfigError: the identity file is not a private key in a regular file
            (:func:`.identity.check`); nothing was run.
    """
    from opsctl.remote import identity, knownhosts

    knownhosts.read(spec.known_hosts_path())
    argv = ["ssh", "-F", "/dev/null", "-p", str(spec.port), "-l", spec.user,
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={spec.known_hosts_path()}",
            # only opsctl's file, as every other connection: a key in /etc/ssh's global file
            # is never trusted for transfers alone
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", f"ConnectTimeout={max(1, int(spec.connect_timeout_s))}",
            "-o", "ServerAliveInterval=15", "-o", "LogLevel=ERROR",
            # AES-GCM first: with AES-NI it moves bulk data ~25 % faster than OpenSSH's
            # default chacha20 on the same cores (sandbox, 256 MiB through ssh: 1.8 s vs 2.4 s)
            "-o", f"Ciphers={_BULK_CIPHERS}"]
    if spec.identity_file:
        argv += ["-i", identity.check(spec.identity_file, spec.label), "-o", "IdentitiesOnly=yes"]
    if spec.proxy_jump:
        argv += ["-J", spec.proxy_jump]
    return argv


def rsync_remote_shell(spec: HostSpec) -> str:
    """rsync's ``--rsh`` value: :func:`openssh_argv` joined once (rsync splits it again)."""
    return shell_line(openssh_argv(spec))


def container_command(spec: HostSpec, ctid: int, argv: t.Sequence[str], *, step: str) -> str:
    """The command string that runs ``argv`` in the target (as :meth:`Remote.pct_exec`
    sends it, without a deadline), for the OpenSSH client or rsync's ``--rsync-path``.

    Raises:
        ConfigError: as :func:`check_command` (NUL byte, over the length limit).
    """
    from opsctl.remote import entry

    entered = entry.of(spec).argv(entry.check_ct(spec, ctid), argv)
    command = host_command(entered, sudo=spec.sudo, pct_path=spec.pct_path)
    check_command(spec.label, step, entered, command)
    return command


#: What the OpenSSH client prints when it, not the remote command, failed (its rc is 255).
_SSH_HOST_KEY = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED",
                 "No ED25519 host key is known", "host key is known")
_SSH_AUTH = "Permission denied"


def classify_openssh_failure(spec: HostSpec, rc: int, stderr: str, step: str) -> None:
    """Raise the transport error the OpenSSH client reported (rc 255), else return.

    Raises:
        HostKeyError, AuthError, TransportError: as the client said.
    """
    if rc != 255:
        return
    tail = " ".join(stderr.strip().splitlines()[-2:]) or "ssh exited 255"
    where = f"{spec.ssh_label()} (step: {step})"
    if any(s in stderr for s in _SSH_HOST_KEY):
        raise HostKeyError(f"host key of {where} is not in {spec.known_hosts_path()} or changed: "
                           f"{tail}", hint=f"check it, then `opsctl host trust --host {spec.label}`")
    if _SSH_AUTH in stderr:
        raise AuthError(f"SSH authentication to {where} failed: {tail}",
                        hint="check user and identity_file in the inventory")
    raise TransportError(f"cannot connect to {where}: {tail}")
