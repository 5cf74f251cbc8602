"""A Proxmox container id (VMID): the one rule for every place that takes one.

Proxmox accepts ``^[1-9][0-9]{2,8}$`` (pve-common ``PVE/JSONSchema.pm`` ``pve_verify_vmid``),
i.e. 100 to 999 999 999. ``--ct``, ``--nodes HOST:CT``, inventory ``containers:`` keys and
the remembered target all go through :func:`check_ctid` (or :func:`parse_ctid`), so a value
such as ``--ct 99999999999999999999`` is a usage error here (exit 2) and nothing is sent: the
host never sees a container id pct would refuse.
"""

from __future__ import annotations

import typing as t

from opsctl.errors import ConfigError

MIN_CTID = 100
MAX_CTID = 999_999_999
RANGE_TEXT = f"{MIN_CTID}-{MAX_CTID}"


def check_ctid(value: t.Any, what: str = "--ct") -> int:
    """``value`` when it is an int in the Proxmox range.

    Raises:
        ConfigError: not an int (a bool is not one), or outside :data:`MIN_CTID`..:data:`MAX_CTID`.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what}: {value!r} is not a container id (an integer {RANGE_TEXT})")
    if not MIN_CTID <= value <= MAX_CTID:
        raise ConfigError(f"{what}: container id {value} is not valid: Proxmox ids are "
                          f"{RANGE_TEXT}; nothing was sent")
    return value


def parse_ctid(text: str, what: str = "--ct") -> int:
    """``text`` as a container id: ASCII decimal digits only (no sign, space or ``_``, which
    Python's ``int()`` would take), then :func:`check_ctid`.

    Raises:
        ConfigError: not digits, or outside the range.
    """
    shown = repr(text[:20]) + ("…" if len(text) > 20 else "")  # one line, whatever was given
    if not (text.isascii() and text.isdigit()):
        raise ConfigError(f"{what}: {shown} is not a container id (an integer {RANGE_TEXT})")
    if len(text.lstrip("0")) > len(str(MAX_CTID)):  # no int() of a 5000-digit string
        raise ConfigError(f"{what}: container id {shown} is not valid: Proxmox ids are "
                          f"{RANGE_TEXT}; nothing was sent")
    return check_ctid(int(text), what)
