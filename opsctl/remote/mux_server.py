"""Connection multiplexer, server side: the detached process that keeps a host's SSH connections.

Started by :func:`opsctl.remote.mux_client.spawn` as ``python -m opsctl.remote.mux_server
serve SPEC_JSON``; the life cycle, the socket wire and the session limits are described in
:mod:`opsctl.remote.mux_client`. Connections are opened through
:class:`~opsctl.remote.transport.Remote` (same host-key policy, never accept-new).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import threading
import time
import typing as t
from pathlib import Path

from opsctl.config.inventory import HostSpec
from opsctl.errors import OpsctlError, TransportError
from opsctl.remote import channel
from opsctl.remote.mux_client import EXTRA_IDLE_S, MAX_CONNECTIONS, QUEUE_WAIT_S, Frames, send_frame
from opsctl.remote.mux_socket import idle_s, lock_path, socket_path
from opsctl.remote.transport import Remote


class _Conn:
    """One verified SSH connection of the mux and the session channels open on it."""

    def __init__(self, remote: t.Any):
        self.remote = remote  # opsctl.remote.transport.Remote, opened
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
        # with a free session, to a new connection, or wait.
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
        self._stop_listening()
        with self.lock:
            while self.active > 0 and any(c.connected() for c in self.conns):
                self.slot_freed.wait(0.5)

    def _stop_listening(self) -> None:
        """Remove our socket file (not a newer mux's) and close the listener: no new calls."""
        try:
            if self.inode is not None and self.path.stat().st_ino == self.inode:
                self.path.unlink()
        except OSError:
            pass
        if self.listener is not None:
            self.listener.close()

    def _prune_extra_connections(self) -> None:
        now = time.monotonic()
        with self.lock:
            idle = [c for c in self.conns[1:] if c.channels == 0 and
                    (now - c.idle_since > EXTRA_IDLE_S or not c.connected())]
            self.conns = [c for c in self.conns if c not in idle]
        for c in idle:
            c.remote.close()

    def close(self) -> None:
        self._stop_listening()
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
                    send_frame(conn, b"j", json.dumps({
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
                send_frame(conn, b"U", b"all SSH sessions to the host are busy")
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
                    send_frame(conn, b"U", str(exc).encode())
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
                    send_frame(conn, b"U", str(refused).encode())
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
                send_frame(conn, b"U", str(exc).encode())
                return
            self._run(conn, chan, has_stdin)
        finally:
            self._release_channel(picked)

    def _run(self, conn: socket.socket, chan: t.Any, has_stdin: bool) -> None:
        import paramiko

        send_frame(conn, b"S")
        done = threading.Event()
        reader = threading.Thread(target=_pump_stdin, args=(conn, chan, has_stdin, done), daemon=True)
        reader.start()
        if not has_stdin:
            chan.shutdown_write()
        try:
            # a channel closed under us: the client went away (Ctrl-C, deadline): stop here
            rc = channel.pump(chan, lambda b: send_frame(conn, b"o", b),
                              lambda b: send_frame(conn, b"e", b), stop_on_close=True)
            if rc is not None:
                send_frame(conn, b"x", str(rc).encode())
        except (OSError, EOFError, paramiko.SSHException, channel.ConnectionDropped) as exc:
            with contextlib.suppress(OSError):
                send_frame(conn, b"L", str(exc).encode())
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
    frames = Frames(conn)
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

    spec = HostSpec.model_validate_json(spec_json)
    path = socket_path(spec)
    if path is None:
        return 2
    lock_fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
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
    sys.stderr.write("usage: python -m opsctl.remote.mux_server serve SPEC_JSON\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
