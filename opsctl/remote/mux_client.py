"""Connection multiplexer, client side: find a host's live mux and run a command through it.

Like OpenSSH's ControlPersist: one authenticated SSH connection per host, kept by a small
background process (:mod:`opsctl.remote.mux_server`), reused by later commands.

Why: a command's own SSH connection costs the paramiko/fabric import and the
handshake (together more than the remote ``pct exec`` itself), which makes
``opsctl status`` ~2.5x slower than a raw ``ssh … pct exec``. A command that finds
a live mux sends its command *string* (built by :meth:`opsctl.remote.transport.Remote.run`,
unchanged) over a Unix socket and gets stdout/stderr/exit status streamed back;
it never imports paramiko and never handshakes.

Life cycle
- A command that had to connect directly leaves a mux behind when it closes
  (:func:`spawn`). The mux opens its *own* connection through
  :class:`~opsctl.remote.transport.Remote` (same host-key policy, never accept-new), so no
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
import json
import os
import select
import socket
import struct
import sys
import threading
import time
import typing as t
from pathlib import Path

from opsctl.config import paths
from opsctl.errors import DeadlineExceeded, TransportError
from opsctl.remote.mux_socket import enabled, lock_path, mux_dir, socket_path

if t.TYPE_CHECKING:
    from opsctl.config.inventory import HostSpec


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

Output = t.Callable[[bytes], None]


# --- framing -------------------------------------------------------------------------


def send_frame(sock: socket.socket, kind: bytes, data: bytes = b"") -> None:
    sock.sendall(_HDR.pack(kind, len(data)) + data)


class Frames:
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


class Reply(t.NamedTuple):  # not a dataclass (imports `inspect`): `status` waits on this
    rc: int
    stdout: bytes
    stderr: bytes


def _lock_free(sock_path: Path) -> bool:
    """True when no mux holds this socket's lock (so its socket file is stale)."""
    import fcntl

    try:
        fd = os.open(lock_path(sock_path), os.O_RDWR | os.O_CREAT, 0o600)
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
         argv: list[str], what: str, keep_bytes: int | None = None) -> Reply | None:
    """Run ``command`` through a live mux; None when there is none (caller goes direct).

    ``keep_bytes``: the reply keeps only the last that many bytes of each stream
    (:class:`~opsctl.remote.command.Kept`); the callbacks get every byte as it arrives.

    Raises:
        TransportError: the mux's connection was lost after the command started.
        DeadlineExceeded: no answer within ``local_deadline`` (the channel is closed).
    """
    sock = connect(socket_path(spec, create=False))
    if sock is None:
        return None
    start = time.monotonic()
    frames = Frames(sock)
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
        from opsctl.remote.command import Kept

        out, err = Kept(keep_bytes), Kept(keep_bytes)
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
                out.add(data)
                if on_stdout:
                    on_stdout(data)
            elif kind == b"e":
                err.add(data)
                if on_stderr:
                    on_stderr(data)
            elif kind == b"x":
                rc = int(data)
                return Reply(255 if rc == -1 else rc, out.value(), err.value())
            elif kind == b"L":
                raise TransportError(f"{spec.label}: connection lost during {what}: "
                                     f"{data.decode(errors='replace')}")
    finally:
        stop_feeding.set()  # never leave a thread reading our stdin
        sock.close()  # on Ctrl-C or a deadline this makes the mux close the channel
        if writer is not None:
            writer.join(timeout=1)


def _feed(sock: socket.socket, stdin: bytes | t.BinaryIO, stop: threading.Event) -> None:
    from opsctl.remote import stdinfeed

    try:
        for chunk in stdinfeed.chunks(stdin, stop):
            send_frame(sock, b"i", chunk)
        if not stop.is_set():
            send_frame(sock, b"I")
    except (OSError, ValueError):  # the call ended first; its rc tells the story
        pass


def query(sock_path: Path, op: str, timeout: float = 5.0) -> dict[str, t.Any] | None:
    """``ping`` or ``stop`` a mux; None when it does not answer."""
    sock = connect(sock_path)
    if sock is None:
        return None
    try:
        sock.sendall(json.dumps({"op": op}).encode() + b"\n")
        frame = Frames(sock).next(timeout)
        return json.loads(frame[1]) if frame is not None and frame[0] == b"j" else None
    except (OSError, ValueError):
        return None
    finally:
        sock.close()


class MuxInfo(t.TypedDict):
    """A mux's answer to ``ping`` and ``stop`` (``opsctl/remote/mux_server.py``)."""

    pid: int
    target: str  # user@address:port
    host: str  # the inventory's name
    calls: int
    active: int  # calls running now, besides this one
    connections: int
    last_error: str | None
    started_at: float
    idle_s: float  # it exits after this long without a call


class MuxRow(MuxInfo):
    """One row of ``opsctl mux status``: a live mux and its socket."""

    socket: str


def list_muxes() -> list[MuxRow]:
    """Every live mux of this ``OPSCTL_HOME`` (stale sockets are removed on the way)."""
    d = mux_dir(create=False)
    if d is None or not d.is_dir():
        return []
    from opsctl.remote import shapes  # pydantic: only `opsctl mux status` lists them

    rows = []
    for p in sorted(d.glob("*.sock")):
        info = query(p, "ping")
        if info is not None:
            rows.append(shapes.validate(MuxRow, {**info, "socket": str(p)}, where=f"mux {p}"))
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


def _spec_json(spec: HostSpec) -> str:
    """``spec`` as the mux server validates it again: only the fields the inventory set (a
    field written out at its default counts as set, and ``target: null`` on a pct host is
    refused as an inventory mistake, so the server never started)."""
    return spec.model_dump_json(exclude_unset=True)


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
        subprocess.run(["/bin/sh", "-c", '"$@" &', "opsctl-mux", sys.executable, "-m",
                        "opsctl.remote.mux_server", "serve", _spec_json(spec)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env, start_new_session=True, timeout=5)
