"""Where a host's connection multiplexer listens: the ``OPSCTL_MUX`` switch, the private
directory, and the socket's name, bound to the host's identity and trust state.

Shared by both ends: :mod:`.mux_client` (the calls) and :mod:`.mux_server` (the keeper of the
connection) must agree on where a host's socket is.
"""

from __future__ import annotations

import hashlib
import json
import os
import typing as t
from pathlib import Path

from opsctl.config import paths
from opsctl.errors import HostKeyError
from opsctl.remote import knownhosts

if t.TYPE_CHECKING:
    from opsctl.config.inventory import HostSpec


ENV_ENABLE = "OPSCTL_MUX"  # "0" disables
ENV_IDLE = "OPSCTL_MUX_IDLE_S"
DEFAULT_IDLE_S = 600.0  # like a typical ControlPersist 10m: `status` every few minutes stays warm
_MAX_SUN_PATH = 100  # AF_UNIX path limit is 108 bytes on Linux; keep a margin


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


def key(spec: HostSpec) -> str:
    """What a mux connection is bound to: identity and the trust state it verified."""
    kh = spec.known_hosts_path()
    try:  # its content, not its stat: a `touch` must not start a second mux
        raw = knownhosts.read(kh)
    except HostKeyError:  # the connect names it
        raw = None
    kh_state = None if raw is None else hashlib.sha256(raw).hexdigest()
    ident = [spec.user, spec.address, spec.port, spec.identity_file, spec.host_key_fingerprint,
             str(kh), kh_state, spec.proxy_jump]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]


def socket_path(spec: HostSpec, create: bool = True) -> Path | None:
    d = mux_dir(create)
    if d is None:
        return None
    p = d / f"{key(spec)}.sock"
    return p if len(os.fsencode(p)) <= _MAX_SUN_PATH else None


def lock_path(sock_path: Path) -> Path:
    return sock_path.with_suffix(".lock")
