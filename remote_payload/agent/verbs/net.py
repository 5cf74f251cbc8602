"""``net``: what a multi-node run needs from a container before torchrun starts.

One answer: the container's network namespace (two containers that report the same one
share a network stack, as the sandbox's do, and reach each other on 127.0.0.1), its IPv4
addresses by interface, the address other nodes should use (``--ifname``'s, else the first
non-loopback interface that is up), and a TCP port free on every address of it (bound on the
wildcard, then released: torchrun binds it a moment later; a race with another program is
possible and ends the rendezvous with a clear "address in use").

Interfaces are read with two ``ioctl`` calls per name (``SIOCGIFFLAGS``, ``SIOCGIFADDR``)
rather than ``ip -4 -o addr`` or ``hostname -I``: a minimal container image has neither
iproute2 nor a ``hostname`` that knows ``-I``, and the agent needs nothing but python.
"""

from __future__ import annotations

import argparse
import fcntl
import socket
import struct
import typing as t

from remote_payload import procfs

SIOCGIFFLAGS = 0x8913
SIOCGIFADDR = 0x8915
IFF_UP = 0x1
IFF_LOOPBACK = 0x8


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--ifname", default=None,
                   help="the interface whose address to announce (NCCL_SOCKET_IFNAME syntax: "
                        "a leading ^ excludes, = matches exactly; commas separate)")


def run(verb: str, args: argparse.Namespace) -> dict[str, t.Any]:
    ifaces = interfaces()
    return {
        "netns": _netns(),
        "hostname": socket.gethostname(),
        "interfaces": ifaces,
        "address": choose_address(ifaces, args.ifname),
        "free_port": free_port(),
    }


def interfaces() -> list[dict[str, t.Any]]:
    """Every interface with an IPv4 address: name, address, up, loopback (kernel order)."""
    out: list[dict[str, t.Any]] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req)[16:18])[0]
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            out.append({"name": name, "address": addr, "up": bool(flags & IFF_UP),
                        "loopback": bool(flags & IFF_LOOPBACK)})
    return out


def choose_address(ifaces: list[dict[str, t.Any]], ifname: str | None) -> str | None:
    """The address to announce: ``ifname``'s interface (NCCL's syntax), else the first up
    non-loopback one; None when there is none."""
    names = [n for n in (ifname or "").lstrip("^=").split(",") if n]
    exclude = bool(ifname and ifname.startswith("^"))
    exact = bool(ifname and ifname.startswith("="))

    def picked(row: dict[str, t.Any]) -> bool:
        if not names:
            return not row["loopback"]
        hit = any(row["name"] == n if exact else row["name"].startswith(n) for n in names)
        return (not hit and not row["loopback"]) if exclude else hit

    return next((r["address"] for r in ifaces if r["up"] and picked(r)), None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _netns() -> str | None:
    return procfs.link("self", "ns/net")
