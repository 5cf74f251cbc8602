"""What a host address and a port may be (inventory, ``--host`` and ``~/.ssh/config`` alike)."""

from __future__ import annotations

import re
from pathlib import Path

from opsctl.errors import ConfigError

# '_' too: ~/.ssh/config aliases (``Host my_box``) and some real names have it
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def check_port(text: str | int, *, what: str) -> int:
    """A TCP port 1-65535.

    Raises:
        ConfigError: anything else (nothing is sent anywhere).
    """
    port = int(text)
    if not 1 <= port <= 65535:
        raise ConfigError(f"{what}: port {port} is out of range 1-65535")
    return port


def check_address(address: str, *, what: str) -> str:
    """A host name (RFC 1123 labels) or an IP address, as given (IPv6 without brackets).

    Raises:
        ConfigError: empty labels (``a..b``), bad characters, or a malformed IP address.
    """
    import ipaddress

    bare = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    if ":" in bare or re.fullmatch(r"[0-9.]+", bare):
        try:
            return str(ipaddress.ip_address(bare))
        except ValueError:
            raise ConfigError(f"{what}: {address!r} is not a valid IP address") from None
    if len(bare) > 253 or not all(_LABEL.fullmatch(x) for x in bare.split(".")):
        raise ConfigError(f"{what}: {address!r} is not a valid host name "
                          "(dot-separated labels of letters, digits, '_' and '-')")
    return bare


def known_hosts_path(known_hosts: str | None) -> Path:
    """The known_hosts file a host's key is checked against: its own, else ``~/.ssh/known_hosts``."""
    return Path(known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()


def ssh_label(user: str, address: str, port: int) -> str:
    """``user@address[:port]`` as messages show it (IPv6 in brackets, port 22 left out)."""
    shown = f"[{address}]" if ":" in address else address
    return f"{user}@{shown}{'' if port == 22 else f':{port}'}"
