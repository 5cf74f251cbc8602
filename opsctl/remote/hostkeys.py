"""The host keys opsctl's own connection would accept, as a known_hosts file for OpenSSH.

Why: the first ``status`` of a session runs over the OpenSSH client (:mod:`.sshcall`)
instead of paramiko, whose import and key exchange cost more than the whole raw
``ssh … pct exec`` (docs/benchmarks.md). The trust decision must stay the one
:meth:`opsctl.remote.transport.Remote._open` makes (``known_hosts``, ``@revoked``, the
inventory's ``host_key_fingerprint`` pin), so OpenSSH gets a private known_hosts holding
only keys that path accepts when the server presents them, with ``StrictHostKeyChecking
yes``: OpenSSH can then only *refuse more*, never accept more, and every refusal goes
back to the paramiko path, which says why (a changed key: exit 12, its own message).

What is kept, read as :func:`opsctl.remote.transport.load_known_hosts` and paramiko's
``HostKeys.lookup`` read the file: lines whose first field names the host exactly
(``host`` or ``[host]:port``) or by its ``|1|`` hash, with a key type paramiko knows;
every ``@revoked`` key is dropped, ``@cert-authority`` lines are ignored, and with a pin
only the key with that fingerprint stays. Nothing is kept (the caller takes the paramiko
path) when the file is unreadable or names two keys of one type for the host (paramiko
would then compare against one of them only).

This is our own code because reading the file with paramiko is the cost being avoided;
it is ~40 lines of the known_hosts format, not a second policy.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import re
from pathlib import Path

from opsctl.config import paths

#: The key types paramiko (>= 3.4) verifies; a line with another type is unknown to it.
KEY_TYPES = frozenset({"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                       "ecdsa-sha2-nistp521"})
_FIELDS = re.compile(" |\t")  # paramiko's HostKeyEntry.from_line splits on one space or tab


def fingerprint(blob: bytes) -> str:
    """OpenSSH's ``SHA256:…`` fingerprint of a key blob (as ``transport.fingerprint``)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _names_match(field: str, name: str) -> bool:
    for entry in field.split(","):
        if entry == name:
            return True
        if entry.startswith("|1|"):
            import hmac  # only for hashed names (HashKnownHosts): ~1 ms of the first `status`

            parts = entry.split("|")
            try:
                salt, want = base64.b64decode(parts[2]), base64.b64decode(parts[3])
            except (IndexError, binascii.Error, ValueError):
                continue
            if hmac.compare_digest(hmac.new(salt, name.encode(), "sha1").digest(), want):
                return True
    return False


def _key(fields: list[str]) -> tuple[str, str, bytes] | None:
    """(type, base64, blob) of a well-formed key of a known type; else None."""
    if len(fields) < 3 or fields[1] not in KEY_TYPES:
        return None
    try:
        blob = base64.b64decode(fields[2], validate=True)
    except (binascii.Error, ValueError):
        return None
    n = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
    if blob[4:4 + n] != fields[1].encode():  # the blob names its own type
        return None
    return fields[1], fields[2], blob


def accepted(known_hosts: Path, name: str, pinned: str | None) -> list[tuple[str, str]] | None:
    """``[(type, base64)]`` of the keys for ``name`` the paramiko path accepts; None: none,
    or the file cannot be read the same way (take the paramiko path)."""
    try:
        raw = known_hosts.read_bytes()
    except OSError:
        return None
    keys: dict[str, tuple[str, bytes]] = {}
    revoked: set[bytes] = set()
    for bline in raw.splitlines():
        line = bline.decode("utf-8", "replace").strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            marker, _, rest = line.partition(" ") if " " in line else line.partition("\t")
            if marker == "@revoked" and (k := _key(_FIELDS.split(rest.strip())[:3])) is not None:
                revoked.add(k[2])
            continue
        fields = _FIELDS.split(line)[:3]
        if len(fields) < 3 or not _names_match(fields[0], name) or (k := _key(fields)) is None:
            continue
        if k[0] in keys:
            return None
        keys[k[0]] = (k[1], k[2])
    found = [(kt, b64) for kt, (b64, blob) in keys.items()
             if blob not in revoked and (pinned is None or fingerprint(blob) == pinned)]
    return found or None


def private_file(known_hosts: Path, name: str, pinned: str | None) -> Path | None:
    """A known_hosts file with exactly :func:`accepted`'s keys (content-addressed under
    ``$OPSCTL_HOME/cache/``, written once); None when there are none."""
    keys = accepted(known_hosts, name, pinned)
    if keys is None:
        return None
    text = "".join(f"{name} {kt} {b64}\n" for kt, b64 in keys)
    d = paths.home() / "cache" / "known-hosts"
    path = d / hashlib.sha256(text.encode()).hexdigest()[:32]
    with contextlib.suppress(OSError):
        if path.read_text(encoding="ascii") == text:  # what it holds is checked, not trusted
            return path
    tmp = d / f".{path.name}.{os.getpid()}.tmp"
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_text(text, encoding="ascii")
        tmp.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return path
