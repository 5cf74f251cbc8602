"""``~/.ssh/config`` for opsctl hosts: ``HostName``, ``User``, ``Port``, ``IdentityFile`` and
``ProxyJump`` of a ``--host`` alias (or an inventory ``address`` that is one) are honoured,
unless the inventory or the ``--host`` text sets them.

Precedence, like fabric's ``Connection`` (explicit kwarg, then ssh_config, then defaults):
``user@host:port`` in ``--host`` > inventory field > ``~/.ssh/config`` > opsctl defaults
(root, 22). The file is parsed by paramiko's :class:`~paramiko.config.SSHConfig` (tokens,
``Include``, ``Match``), but only when a cheap scan says it may say something about this
host: importing paramiko costs ~150 ms, which a command through a live mux never pays.

Other keywords (``ProxyCommand``, ``UserKnownHostsFile``, …) are not applied: opsctl's host
key policy and known_hosts come from the inventory.
"""

from __future__ import annotations

import fnmatch
import os
import re
import typing as t
from pathlib import Path

from opsctl.config.addresses import check_address, check_port
from opsctl.errors import ConfigError

#: The keywords opsctl applies (lower case, as paramiko reports them).
APPLIED = ("hostname", "user", "port", "identityfile", "proxyjump")
_SCAN = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)(.*?)\s*$")


def config_path() -> Path:
    return Path.home() / ".ssh" / "config"


def _may_apply(text: str, alias: str) -> bool:
    """Whether the file may set an applied keyword for ``alias`` (no false negatives)."""
    matching = True  # lines before the first Host apply to every host
    for line in text.splitlines():
        m = _SCAN.match(line)
        if m is None or line.lstrip().startswith("#"):
            continue
        word, value = m[1].lower(), m[2]
        if word in ("match", "include"):
            return True  # conditions or other files: let paramiko decide
        if word == "host":
            if '"' in value:
                return True  # quoted patterns: let paramiko decide
            patterns = value.split()
            negated = any(p.startswith("!") and fnmatch.fnmatchcase(alias, p[1:]) for p in patterns)
            matching = not negated and any(
                not p.startswith("!") and fnmatch.fnmatchcase(alias, p) for p in patterns)
        elif matching and word in APPLIED:
            return True
    return False


def configures(alias: str) -> bool:
    """Whether ``~/.ssh/config`` names ``alias``: a ``Host`` line with a pattern other than a
    bare ``*`` matches it (and no ``!pattern`` excludes it). A config with ``Include`` or
    ``Match`` names it when paramiko's lookup applies anything to it. A catch-all ``Host *``
    names nothing: it would make every typo a configured host.

    Raises:
        ConfigError: the file cannot be read or parsed.
    """
    path = config_path()
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    for line in text.splitlines():
        m = _SCAN.match(line)
        if m is None or line.lstrip().startswith("#"):
            continue
        word, patterns = m[1].lower(), m[2].split()
        if word in ("match", "include") or (word == "host" and '"' in m[2]):
            return bool(lookup(alias))
        if word != "host" or any(p.startswith("!") and fnmatch.fnmatchcase(alias, p[1:])
                                 for p in patterns):
            continue
        if any(p != "*" and not p.startswith("!") and fnmatch.fnmatchcase(alias, p)
               for p in patterns):
            return True
    return False


def lookup(alias: str) -> dict[str, t.Any]:
    """The applied keywords ``~/.ssh/config`` gives ``alias`` (empty when none or no file).

    Raises:
        ConfigError: the file cannot be read or parsed.
    """
    path = config_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    text = raw.decode("utf-8", "replace")
    if not _may_apply(text, alias):
        return {}
    import io

    import paramiko

    try:
        cfg = paramiko.SSHConfig()
        cfg.parse(io.StringIO(text))
        found = cfg.lookup(alias)
    except Exception as exc:  # paramiko raises several types for a bad file; all are the file's
        raise ConfigError(f"{path}: cannot use it for {alias!r}: {exc}") from None
    out = {k: found[k] for k in APPLIED if k in found}
    if out.get("hostname") == alias:
        del out["hostname"]  # paramiko fills HostName with the alias itself
    if str(out.get("proxyjump", "")).lower() == "none":
        del out["proxyjump"]
    return out


def overrides(address: str, explicit: t.Collection[str]) -> dict[str, t.Any]:
    """The host fields ``~/.ssh/config`` sets for ``address``, except the ``explicit`` ones.

    ``explicit``: the fields the user set (inventory keys, ``user@``/``:port`` of ``--host``).

    Raises:
        ConfigError: the config file is unreadable, or gives a bad HostName or Port.
    """
    found = lookup(address)
    if not found:
        return {}
    what = f"{config_path()}: Host {address}"
    updates: dict[str, t.Any] = {}
    if "hostname" in found:
        updates["address"] = check_address(str(found["hostname"]), what=what)
    if "user" in found and "user" not in explicit:
        updates["user"] = str(found["user"])
    if "port" in found and "port" not in explicit:
        updates["port"] = check_port(str(found["port"]), what=what) if \
            str(found["port"]).isdigit() else _bad_port(what, found["port"])
    if "identityfile" in found and "identity_file" not in explicit:
        updates["identity_file"] = os.path.expanduser(str(found["identityfile"][0]))
    if "proxyjump" in found and "proxy_jump" not in explicit:
        updates["proxy_jump"] = str(found["proxyjump"])
    return updates


def _bad_port(what: str, value: t.Any) -> int:
    raise ConfigError(f"{what}: Port {value!r} is not a number")
