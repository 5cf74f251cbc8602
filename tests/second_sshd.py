"""A second loopback sshd next to the sandbox's, for tests that need a different server:
its own host key (a key swap) or OpenSSH's default ``MaxSessions 10``.

It reuses the sandbox's client key, ``pct`` and containers (same PATH and LXC path), so a
command through it reaches the same container 200. Loopback only; stopped on exit.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from opsctl.sandbox import host as sandbox_mod
from tests.waiting import wait_for


@dataclass(frozen=True)
class Sshd:
    port: int
    host_key_pub: str  # "ssh-ed25519 AAAA…"
    known_hosts_line: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def second_sshd(sandbox: sandbox_mod.SandboxInfo, workdir: Path,
                extra: tuple[str, ...] = ()) -> Iterator[Sshd]:
    """Start sshd on a free loopback port with a fresh host key and ``extra`` config lines."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = workdir / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    base = (sandbox.state_dir / "sshd_config").read_text()
    port = _free_port()
    pid_file = workdir / "sshd.pid"
    lines = []
    for line in base.splitlines():
        if re.match(r"(Port|HostKey|PidFile|MaxSessions) ", line):
            continue
        lines.append(line)
    lines += [f"Port {port}", f"HostKey {key}", f"PidFile {pid_file}", *extra]
    config = workdir / "sshd_config"
    config.write_text("\n".join(lines) + "\n")
    log = workdir / "sshd.log"
    subprocess.run(["/usr/sbin/sshd", "-f", str(config), "-E", str(log)], check=True)
    def listening() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    wait_for(listening, 10, interval=0.05)
    pub = key.with_suffix(".pub").read_text().split()
    try:
        yield Sshd(port, f"{pub[0]} {pub[1]}", f"[127.0.0.1]:{port} {pub[0]} {pub[1]}")
    finally:
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass


def sshd_serving(pid: int, timeout_s: float = 15.0) -> int:
    """The sshd process at the other end of process ``pid``'s SSH connection (via ss).

    Polled: on a loaded machine the connection (or sshd's per-connection child) can appear
    a moment after the process printed its first output."""
    found: dict[str, re.Match[str] | None] = {}

    def read() -> bool:
        table = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True, check=True).stdout
        found["mine"] = mine = re.search(rf'127\.0\.0\.1:(\d+)\s+\S+\s+users:\(\("[^"]+",pid={pid},', table)
        found["peer"] = mine and re.search(
            rf'\S+\s+127\.0\.0\.1:{mine[1]}\s+users:\(\("sshd",pid=(\d+),', table)
        return found["peer"] is not None

    if wait_for(read, timeout_s):
        peer = found["peer"]
        assert peer is not None
        return int(peer[1])
    mine = found["mine"]
    assert mine, f"no TCP connection of pid {pid} in ss output"
    raise AssertionError(f"no sshd peer for local port {mine[1]}")


class SwitchingProxy:
    """A loopback TCP forwarder: connection 1 goes to ``first``, later ones to ``then``.

    It counts connections, so a test can also say "connected exactly once".
    """

    def __init__(self, first: int, then: int):
        self.targets = (first, then)
        self.connections = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            port = self.targets[0] if self.connections == 1 else self.targets[1]
            upstream = socket.create_connection(("127.0.0.1", port))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
