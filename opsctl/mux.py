"""Connection multiplexer, like OpenSSH's ControlPersist: one authenticated SSH
connection per host, kept by a small background process, reused by later commands.

Why: a command's own SSH connection costs the paramiko/fabric import and the
handshake (together more than the remote ``pct exec`` itself), which made
``opsctl status`` ~2.5x slower than a raw ``ssh … pct exec``. A command that finds
a live mux sends its command *string* (built by :meth:`opsctl.transport.Remote.run`,
unchanged) over a Unix socket and gets stdout/stderr/exit status streamed back;
it never imports paramiko and never handshakes.

Life cycle
- A command that had to connect directly leaves a mux behind when it closes
  (:func:`spawn`). The mux opens its *own* connection through
  :class:`~opsctl.transport.Remote` (same host-key policy, never accept-new), so no
  command can reach a host whose key was not verified.
- It exits after ``OPSCTL_MUX_IDLE_S`` seconds (default 600) without a call, when
  its SSH connection drops, when its socket file is removed or replaced, or on
  ``opsctl mux stop``. ``OPSCTL_MUX=0`` disables it.
- Sockets live in ``$OPSCTL_HOME/mux/`` (0700, checked before use). The name
  hashes user@host:port, identity file, ProxyJump, host-key pin, the known_hosts
  path *and* its content: editing known_hosts (a changed or revoked key) retires the
  old mux — it stops taking calls and exits when the calls in flight have finished;
  a ``touch`` changes nothing.
- sshd refuses channels beyond its ``MaxSessions`` (OpenSSH default 10). A refusal
  fails no command: the mux learns the limit, runs the call on another connection it
  opens (up to :data:`MAX_CONNECTIONS`) or queues it for a free channel for up to
  :data:`QUEUE_WAIT_S`, then answers ``U`` so the call connects on its own.
- A socket nobody answers is stale: it is removed when its lock is free.
- Deadlines: the remote ``timeout`` wrappers are part of the command string, so a
  fired deadline still kills the remote process group; the client's local
  deadline (and Ctrl-C) closes the socket, and the mux then closes the channel.

Wire (Unix socket): the client sends one JSON line ``{"op": "exec", "command",
"stdin": bool}`` (or ``{"op": "ping"|"stop"}``), then frames ``type(1) len(4)
data``: client ``i`` stdin bytes, ``I`` stdin EOF; server ``S`` started, ``U``
unavailable (nothing ran: the client connects directly), ``o``/``e`` output,
``x`` exit status, ``L`` connection lost after start, ``j`` a JSON answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import socket
import struct
import sys
import threading
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

from opsctl import paths
from opsctl.errors import DeadlineExceeded, TransportError

if t.TYPE_CHECKING:
    from opsctl.inventory import HostSpec

ENV_ENABLE = "OPSCTL_MUX"  # "0" disables
ENV_IDLE = "OPSCTL_MUX_IDLE_S"
DEFAULT_IDLE_S = 600.0  # like a typical ControlPersist 10m: `status` every few minutes stays warm
#: How long a client waits for the mux to start the command before going direct.
START_TIMEOUT_S = 10.0
#: How long a call waits for a free SSH session on the shared connection before the mux
#: tells it to connect on its own; well under START_TIMEOUT_S, so the mux answers first.
QUEUE_WAIT_S = 4.0
#: Connections one mux may hold to its host (the first, plus extras opened when every
#: session of the others is busy), and how long an extra one may sit without a channel.
MAX_CONNECTIONS = 4
EXTRA_IDLE_S = 5.0
_HDR = struct.Struct("!cI")
_MAX_SUN_PATH = 100  # AF_UNIX path limit is 108 bytes on Linux; keep a margin

Output = t.Callable[[bytes], None]


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "1").strip().lower() not in ("0", "no", "false", "off")


def idle_s() -> float:
    try:
        return max(1.0, float(os.environ.get(ENV_IDLE, DEFAULT_IDLE_S)))
    except ValueError:
        return DEFAULT_IDLE_S


def mux_dir(create: bool = True) -> Path | None:
    """``$OPSCTL_HOME/mux`` if it is private to us (0700, ours); else None (go direct)."""
    d = paths.home() / "mux"
    try:
        if create:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = d.stat()
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return d


def _known_hosts(spec: HostSpec) -> Path:
    return Path(spec.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()


def key(spec: HostSpec) -> str:
    """What a mux connection is bound to: identity and the trust state it verified."""
    kh = _known_hosts(spec)
    try:  # its content, not its stat: a `touch` must not start a second mux (issue 15 #12)
        kh_state: str | None = hashlib.sha256(kh.read_bytes()).hexdigest()
    except OSError:
        kh_state = None
    ident = [spec.user, spec.address, spec.port, spec.identity_file, spec.host_key_fingerprint,
             str(kh), kh_state, spec.proxy_jump]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]


def socket_path(spec: HostSpec, create: bool = True) -> Path | None:
    d = mux_dir(create)
    if d is None:
        return None
    p = d / f"{key(spec)}.sock"
    return p if len(os.fsencode(p)) <= _MAX_SUN_PATH else None


# --- framing -------------------------------------------------------------------------


def _send(sock: socket.socket, kind: bytes, data: bytes = b"") -> None:
    sock.sendall(_HDR.pack(kind, len(data)) + data)


class _Frames:
    """Incremental frame parser over a socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()
        self.eof = False

    def fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            self.eof = True
        self.buf += chunk

    def pop(self) -> tuple[bytes, bytes] | None:
        if len(self.buf) < _HDR.size:
            return None
        kind, n = _HDR.unpack_from(self.buf)
        if len(self.buf) < _HDR.size + n:
            return None
        data = bytes(self.buf[_HDR.size:_HDR.size + n])
        del self.buf[:_HDR.size + n]
        return kind, data

    def next(self, timeout: float | None) -> tuple[bytes, bytes] | None:
        """The next frame; None on EOF or timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (frame := self.pop()) is None:
            if self.eof:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            ready, _, _ = select.select([self.sock], [], [], left)
            if ready:
                self.fill()
        return frame


# --- client --------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    rc: int
    stdout: bytes
    stderr: bytes


def _lock_path(sock_path: Path) -> Path:
    return sock_path.with_suffix(".lock")


def _lock_free(sock_path: Path) -> bool:
    """True when no mux holds this socket's lock (so its socket file is stale)."""
    import fcntl

    try:
        fd = os.open(_lock_path(sock_path), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases the lock
    return True


def connect(sock_path: Path | None) -> socket.socket | None:
    """A connected socket to a live mux, or None; a stale socket file is removed."""
    if sock_path is None or not enabled():
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.fspath(sock_path))
        return s
    except FileNotFoundError:
        s.close()
        return None
    except OSError:  # refused: the mux died without cleaning up
        s.close()
        if _lock_free(sock_path):
            with contextlib.suppress(OSError):
                sock_path.unlink()
        return None


def call(spec: HostSpec, command: str, *, stdin: bytes | t.BinaryIO | None,
         on_stdout: Output | None, on_stderr: Output | None, local_deadline: float | None,
         argv: list[str], what: str) -> Reply | None:
    """Run ``command`` through a live mux; None when there is none (caller goes direct).

    Raises:
        TransportError: the mux's connection was lost after the command started.
        DeadlineExceeded: no answer within ``local_deadline`` (the channel is closed).
    """
    sock = connect(socket_path(spec, create=False))
    if sock is None:
        return None
    start = time.monotonic()
    frames = _Frames(sock)
    writer: threading.Thread | None = None
    stop_feeding = threading.Event()
    try:
        try:
            sock.sendall(json.dumps({"op": "exec", "command": command,
                                     "stdin": stdin is not None}).encode() + b"\n")
            first = frames.next(START_TIMEOUT_S)
        except OSError:
            return None
        if first is None or first[0] != b"S":  # nothing ran: go direct
            return None
        if stdin is not None:
            writer = threading.Thread(target=_feed, args=(sock, stdin, stop_feeding), daemon=True)
            writer.start()
        out: list[bytes] = []
        err: list[bytes] = []
        while True:
            left = None if local_deadline is None else local_deadline - (time.monotonic() - start)
            if left is not None and left <= 0:
                raise DeadlineExceeded(
                    f"{spec.label}: {what} did not answer within {local_deadline:g} s; "
                    "connection to it closed", argv=argv)
            try:
                frame = frames.next(None if left is None else min(left, 0.25))
            except OSError as exc:
                raise TransportError(f"{spec.label}: connection lost during {what}: {exc}") from None
            if frame is None:
                if frames.eof:
                    raise TransportError(f"{spec.label}: connection lost during {what}: "
                                         "the mux went away")
                continue
            kind, data = frame
            if kind == b"o":
                out.append(data)
                if on_stdout:
                    on_stdout(data)
            elif kind == b"e":
                err.append(data)
                if on_stderr:
                    on_stderr(data)
            elif kind == b"x":
                rc = int(data)
                return Reply(255 if rc == -1 else rc, b"".join(out), b"".join(err))
            elif kind == b"L":
                raise TransportError(f"{spec.label}: connection lost during {what}: "
                                     f"{data.decode(errors='replace')}")
    finally:
        stop_feeding.set()  # never leave a thread reading our stdin (issue 15 item 2)
        sock.close()  # on Ctrl-C or a deadline this makes the mux close the channel
        if writer is not None:
            writer.join(timeout=1)


def _feed(sock: socket.socket, stdin: bytes | t.BinaryIO, stop: threading.Event) -> None:
    from opsctl import stdinfeed

    try:
        for chunk in stdinfeed.chunks(stdin, stop):
            _send(sock, b"i", chunk)
        if not stop.is_set():
            _send(sock, b"I")
    except (OSError, ValueError):  # the call ended first; its rc tells the story
        pass


def query(sock_path: Path, op: str, timeout: float = 5.0) -> dict[str, t.Any] | None:
    """``ping`` or ``stop`` a mux; None when it does not answer."""
    sock = connect(sock_path)
    if sock is None:
        return None
    try:
        sock.sendall(json.dumps({"op": op}).encode() + b"\n")
        frame = _Frames(sock).next(timeout)
        return json.loads(frame[1]) if frame is not None and frame[0] == b"j" else None
    except (OSError, ValueError):
        return None
    finally:
        sock.close()


def list_muxes() -> list[dict[str, t.Any]]:
    """Every live mux of this ``OPSCTL_HOME`` (stale sockets are removed on the way)."""
    d = mux_dir(create=False)
    if d is None or not d.is_dir():
        return []
    rows = []
    for p in sorted(d.glob("*.sock")):
        info = query(p, "ping")
        if info is not None:
            rows.append({**info, "socket": str(p)})
    return rows


def stop_all() -> list[dict[str, t.Any]]:
    """Ask every live mux to exit; returns the ones that acknowledged."""
    d = mux_dir(create=False)
    if d is None or not d.is_dir():
        return []
    return [{**info, "socket": str(p)} for p in sorted(d.glob("*.sock"))
            if (info := query(p, "stop")) is not None]


def wait_ready(spec: HostSpec, timeout: float = 15.0) -> bool:
    """Poll until a mux for ``spec`` answers (tests, benchmarks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = socket_path(spec, create=False)
        if p is not None and query(p, "ping", timeout=1.0) is not None:
            return True
        time.sleep(0.05)
    return False


STALE_FILES_AFTER_S = 24 * 3600.0


def prune_stale(d: Path, *, keep: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove the lock and log files of muxes gone for a day (each key leaves a pair behind:
    a known_hosts edit or an inventory change makes a new key). A lock someone holds, a socket
    that still exists and anything younger than :data:`STALE_FILES_AFTER_S` are kept; the
    lock is taken while its file is removed, so a mux starting at that moment is not split."""
    import fcntl

    now = time.time() if now is None else now
    removed: list[Path] = []
    for lock in sorted(d.glob("*.lock")):
        sock = lock.with_suffix(".sock")
        if sock == keep or sock.exists():
            continue
        try:
            if now - lock.stat().st_mtime < STALE_FILES_AFTER_S:
                continue
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            for stale in (lock, lock.with_suffix(".log")):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
            removed.append(lock)
        except OSError:
            continue  # held: a live mux
        finally:
            os.close(fd)
    return removed


def spawn(spec: HostSpec) -> None:
    """Start a detached mux for ``spec`` unless one is live (never raises, never waits)."""
    if not enabled():
        return
    p = socket_path(spec)
    if p is None or (p.exists() and query(p, "ping", timeout=1.0) is not None):
        return
    prune_stale(p.parent, keep=p)  # only here: starting a mux is off every hot path
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        x for x in (str(paths.REPO_ROOT), os.environ.get("PYTHONPATH", "")) if x)}
    # sh backgrounds the server and exits at once: the mux is nobody's child (no zombie,
    # no wait) and lives in its own session, so the caller's Ctrl-C never reaches it.
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["/bin/sh", "-c", '"$@" &', "opsctl-mux", sys.executable, "-m", "opsctl.mux",
                        "serve", spec.model_dump_json()],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env, start_new_session=True, timeout=5)


# --- server --------------------------------------------------------------------------


class _Conn:
    """One verified SSH connection of the mux and the session channels open on it."""

    def __init__(self, remote: t.Any):
        self.remote = remote  # opsctl.transport.Remote, opened
        self.channels = 0
        self.idle_since = time.monotonic()

    def transport(self) -> t.Any:
        return self.remote._conn.client.get_transport() if self.remote._conn else None

    def connected(self) -> bool:
        transport = self.transport()
        return transport is not None and bool(transport.is_active())


class Server:
    """Holds verified SSH connections to one host and runs commands for local clients.

    The first connection lives as long as the mux. When the server's session limit is
    reached on every connection, the mux opens another one (at most
    :data:`MAX_CONNECTIONS`, one handshake at a time, so sshd's ``MaxStartups`` never sees
    a burst) and closes it again after :data:`EXTRA_IDLE_S` without a channel.
    """

    def __init__(self, spec: HostSpec, sock_path: Path, idle: float):
        from opsctl.transport import Remote

        self.spec = spec
        self.path = sock_path
        self.idle = idle
        self.remote = Remote(spec, use_mux=False)
        self.lock = threading.Lock()
        self.active = 0
        self.calls = 0
        self.last = time.monotonic()
        self.started_at = time.time()
        self.stopping = False
        self.listener: socket.socket | None = None
        self.inode: int | None = None
        # sshd refuses a channel beyond its MaxSessions (OpenSSH default 10) per connection:
        # the most it accepted is learned at the first refusal; then calls go to a connection
        # with a free session, to a new connection, or wait (issue 15 #3).
        self.conns: list[_Conn] = []
        self.opening = False  # a handshake for an extra connection is under way
        self.last_error: str | None = None  # shown by `opsctl mux status --json`
        self.max_channels: int | None = None
        self.slot_freed = threading.Condition(self.lock)

    def open(self) -> None:
        """Connect (host-key policy enforced by Remote) and listen.

        Raises:
            OpsctlError: from the connection (the mux then exits; clients go direct).
        """
        self.remote._open()
        self.conns = [_Conn(self.remote)]
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # stale: we hold the lock, so nobody else serves it
        old = os.umask(0o177)
        try:
            listener.bind(os.fspath(self.path))
        finally:
            os.umask(old)
        listener.listen(16)
        self.inode = self.path.stat().st_ino
        self.listener = listener

    def _connected(self) -> bool:
        transport = self.remote._conn.client.get_transport() if self.remote._conn else None
        return transport is not None and transport.is_active()

    def _alive(self) -> bool:
        if not self._connected():
            return False
        if socket_path(self.spec, create=False) != self.path:
            return False  # known_hosts (or its path) changed: a new mux serves the new state
        try:  # our socket file removed or replaced: nobody can reach us any more
            return self.path.stat().st_ino == self.inode
        except OSError:
            return False

    def serve(self) -> None:
        if self.listener is None:
            raise TransportError("mux: serve() before open()")
        try:
            while not self.stopping and self._alive():
                with self.lock:
                    if self.active == 0 and time.monotonic() - self.last > self.idle:
                        break
                self._prune_extra_connections()
                ready, _, _ = select.select([self.listener], [], [], 0.5)
                if ready:
                    conn, _ = self.listener.accept()
                    with self.lock:
                        self.active += 1
                        self.last = time.monotonic()
                    threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
            self._retire()
        finally:
            self.close()

    def _retire(self) -> None:
        """Stop taking calls, then let the ones in flight finish on the live connection.

        Closing the connection at once would kill every command running through it (a
        ``touch`` of known_hosts or ``mux stop`` must not cost another shell its ``exec``).
        """
        try:
            if self.inode is not None and self.path.stat().st_ino == self.inode:
                self.path.unlink()
        except OSError:
            pass
        if self.listener is not None:
            self.listener.close()
        with self.lock:
            while self.active > 0 and any(c.connected() for c in self.conns):
                self.slot_freed.wait(0.5)

    def _prune_extra_connections(self) -> None:
        now = time.monotonic()
        with self.lock:
            idle = [c for c in self.conns[1:] if c.channels == 0 and
                    (now - c.idle_since > EXTRA_IDLE_S or not c.connected())]
            self.conns = [c for c in self.conns if c not in idle]
        for c in idle:
            c.remote.close()

    def close(self) -> None:
        try:
            if self.inode is not None and self.path.stat().st_ino == self.inode:
                self.path.unlink()
        except OSError:
            pass
        if self.listener is not None:
            self.listener.close()
        for c in self.conns[1:]:
            c.remote.close()
        self.remote.close()

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                header = _read_line(conn)
                op = header.get("op")
                if op == "exec":
                    with self.lock:
                        self.calls += 1
                    self._exec(conn, str(header["command"]), bool(header.get("stdin")))
                elif op in ("ping", "stop"):
                    _send(conn, b"j", json.dumps({
                        "pid": os.getpid(), "target": self.spec.ssh_label(), "host": self.spec.label,
                        "calls": self.calls, "active": self.active - 1,
                        "connections": len(self.conns), "last_error": self.last_error,
                        "started_at": self.started_at, "idle_s": self.idle}).encode())
                    if op == "stop":
                        self.stopping = True
        except (OSError, ValueError, KeyError):
            pass
        finally:
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()
                self.slot_freed.notify_all()

    def _open_channel(self, conn: socket.socket) -> tuple[_Conn, t.Any] | None:
        """A session channel, waiting (bounded) for a free one; None after answering ``U``.

        A refused channel (sshd's MaxSessions: "administratively prohibited") fails nothing:
        the limit is learned and the call takes a channel on another connection (opened
        here if needed), or waits for one to close; after :data:`QUEUE_WAIT_S` it is told to
        connect on its own (``U``: nothing ran). Only a dead first connection ends the mux —
        and then no command could run on it anyway.
        """
        import paramiko

        from opsctl.errors import OpsctlError
        from opsctl.transport import Remote

        deadline = time.monotonic() + QUEUE_WAIT_S
        while True:
            with self.lock:
                picked, open_new = self._pick(deadline)
            if open_new:
                try:
                    extra = Remote(self.spec, use_mux=False)
                    extra._open()
                except OpsctlError as exc:
                    extra = None
                    self.last_error = f"extra connection: {exc.message}"
                with self.lock:
                    self.opening = False
                    if extra is not None:
                        picked = _Conn(extra)
                        picked.channels = 1
                        self.conns.append(picked)
                    self.slot_freed.notify_all()
            if picked is None:
                _send(conn, b"U", b"all SSH sessions to the host are busy")
                return None
            transport = picked.transport()
            try:
                if transport is None or not transport.is_active():
                    raise paramiko.SSHException("connection closed")
                return picked, transport.open_session(timeout=self.spec.connect_timeout_s)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if picked.connected():
                    # Refused on a live connection: the server's session limit. (paramiko
                    # reports concurrent refusals as ChannelException to one opener and as
                    # "Unable to open channel." to the others: both mean the same here.)
                    refused: BaseException = exc
                else:
                    self._release_channel(picked)
                    if not self._connected():
                        self.stopping = True  # our first connection is broken: clients go direct
                    _send(conn, b"U", str(exc).encode())
                    return None
                with self.lock:
                    picked.channels -= 1
                    # never shrink below what once worked: a refusal can also come from a
                    # channel whose close the server has not processed yet
                    self.max_channels = max(1, picked.channels, self.max_channels or 0)
                    give_up = time.monotonic() >= deadline or (
                        picked.channels == 0 and len(self.conns) == 1)
                    if not give_up:
                        self.slot_freed.wait(0.05)
                if give_up:
                    _send(conn, b"U", str(refused).encode())
                    return None

    def _pick(self, deadline: float) -> tuple[_Conn | None, bool]:
        """Under the lock: (a connection with a free session, taken) or (None, open one)."""
        while True:
            for c in self.conns:
                if (self.max_channels is None or c.channels < self.max_channels) and c.connected():
                    c.channels += 1
                    return c, False
            if not self.opening and len(self.conns) < MAX_CONNECTIONS:
                self.opening = True
                return None, True
            left = deadline - time.monotonic()
            if left <= 0:
                return None, False
            self.slot_freed.wait(min(left, 0.5))

    def _release_channel(self, c: _Conn) -> None:
        with self.lock:
            c.channels -= 1
            if c.channels == 0:
                c.idle_since = time.monotonic()
            self.slot_freed.notify_all()

    def _exec(self, conn: socket.socket, command: str, has_stdin: bool) -> None:
        import paramiko

        opened = self._open_channel(conn)
        if opened is None:
            return
        picked, chan = opened
        try:
            if _hung_up(conn):  # the client gave up waiting and went direct: never run twice
                chan.close()
                return
            try:
                chan.exec_command(command)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                chan.close()
                if not self._connected():
                    self.stopping = True
                _send(conn, b"U", str(exc).encode())
                return
            self._run(conn, chan, has_stdin)
        finally:
            self._release_channel(picked)

    def _run(self, conn: socket.socket, chan: t.Any, has_stdin: bool) -> None:
        import paramiko

        transport = chan.get_transport()
        _send(conn, b"S")
        done = threading.Event()
        reader = threading.Thread(target=_pump_stdin, args=(conn, chan, has_stdin, done), daemon=True)
        reader.start()
        if not has_stdin:
            chan.shutdown_write()
        try:
            while True:
                select.select([chan], [], [], 0.25)
                while chan.recv_ready():
                    _send(conn, b"o", chan.recv(65536))
                while chan.recv_stderr_ready():
                    _send(conn, b"e", chan.recv_stderr(65536))
                if chan.exit_status_ready() and chan.eof_received and not (
                        chan.recv_ready() or chan.recv_stderr_ready()):
                    break
                if chan.closed:  # the client went away (Ctrl-C, deadline): stop here
                    return
                if not transport.is_active():
                    _send(conn, b"L", b"SSH connection dropped")
                    return
            _send(conn, b"x", str(chan.recv_exit_status()).encode())
        except (OSError, EOFError, paramiko.SSHException) as exc:
            with contextlib.suppress(OSError):
                _send(conn, b"L", str(exc).encode())
        finally:
            done.set()
            chan.close()


def _hung_up(conn: socket.socket) -> bool:
    """True when the client closed its end (it timed out waiting and connected directly)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _read_line(conn: socket.socket, limit: int = 1 << 20) -> dict[str, t.Any]:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk or len(buf) > limit:
            raise ValueError("no header")
        buf += chunk
    doc = json.loads(buf)
    if not isinstance(doc, dict):
        raise ValueError("bad header")
    return doc


def _pump_stdin(conn: socket.socket, chan: t.Any, has_stdin: bool, done: threading.Event) -> None:
    """Client frames -> channel stdin; the client hanging up closes the channel."""
    frames = _Frames(conn)
    try:
        while True:
            frame = frames.next(None)
            if frame is None:
                break
            kind, data = frame
            if kind == b"i" and has_stdin:
                chan.sendall(data)
            elif kind == b"I" and has_stdin:
                chan.shutdown_write()
    except (OSError, EOFError):
        pass
    if not done.is_set():  # hung up before the exit status: Ctrl-C or a local deadline
        chan.close()


def serve_main(spec_json: str) -> int:
    """Entry of the detached mux process; exits quietly when another mux serves."""
    import fcntl

    from opsctl.errors import OpsctlError
    from opsctl.inventory import HostSpec

    spec = HostSpec.model_validate_json(spec_json)
    path = socket_path(spec)
    if path is None:
        return 2
    lock_fd = os.open(_lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another mux holds it
    log = path.with_suffix(".log")
    server = Server(spec, path, idle_s())
    try:
        server.open()
        if socket_path(spec, create=False) != path:  # known_hosts changed while we connected
            server.close()
            return 1
        server.serve()
    except OpsctlError as exc:
        log.write_text(f"{time.ctime()}: {exc.message}\n", encoding="utf-8")
        server.close()
        return 1
    except Exception:  # a bug: keep the traceback where `opsctl mux status` users can find it
        import traceback

        log.write_text(f"{time.ctime()}: {traceback.format_exc()}", encoding="utf-8")
        server.close()
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "serve":
        return serve_main(args[1])
    sys.stderr.write("usage: python -m opsctl.mux serve SPEC_JSON\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
