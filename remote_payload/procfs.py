"""The one reader of ``/proc``: a process's stat fields, command line and environment.

Both sides use it (the agent's reconcile and ``stop``, procgroup's tree killer, ``opsctl
exec``'s guard, the payload unpacker, the trainer's start-up clock), so the rules are
written once:

- **``comm`` is the process's to choose.** ``/proc/<pid>/stat`` is ``pid (comm) state ppid
  pgrp ...``, and ``comm`` (up to 16 bytes, set by ``prctl(PR_SET_NAME)`` or the program's
  name) may hold spaces, parentheses and newlines: the fields are split after the *last*
  ``)``, which no later field contains. A line that does not parse is no process
  (:func:`parse_stat` raises ``ValueError``; :func:`stat` answers None), never a traceback.
- **Every read is bounded** (:mod:`remote_payload.boundedread`, cut at
  :data:`STAT_BYTES` or the ``PROC_FILE_BYTES`` cap of :mod:`remote_payload.limits`): an
  environment of many megabytes costs that cap, at most.
- **A process that is gone, or not ours to read, is None / empty**: it can exit between the
  listing and the read.

Stdlib only; the self-contained programs (``opsctl exec``'s guard, the unpacker) carry this
file's text with them (``opsctl/remote/command.py`` ``standalone``).
"""

from __future__ import annotations

import os
import typing as t

from remote_payload import boundedread, limits

#: bytes of ``/proc/<pid>/stat`` read: its 52 numbers and a 16-byte ``comm`` fit in 1 KiB
STAT_BYTES = 4096
#: the states of a process that has ended (zombie, dead): not alive
ENDED_STATES = frozenset({"Z", "X"})


class Stat(t.NamedTuple):
    """The fields of ``/proc/<pid>/stat`` opsctl uses."""

    state: str  # one letter: R, S, D, Z, T, t, X, I, ...
    ppid: int
    pgrp: int
    start_ticks: int  # field 22, starttime: clock ticks after boot (PID reuse check)


def _number(field: bytes) -> int:
    if not field.isdigit():
        raise ValueError(f"not a number in a /proc stat line: {field[:20]!r}")
    return int(field)


def parse_stat(data: bytes) -> Stat:
    """The fields of one ``/proc/<pid>/stat`` text.

    Raises:
        ValueError: no ``(comm)``, too few fields, a state that is not one letter, a field
            that is not a whole number.
    """
    head, sep, rest = data.rpartition(b")")
    if not sep or b"(" not in head:
        raise ValueError("no (comm) in a /proc stat line")
    fields = rest.split()
    if len(fields) < 20:
        raise ValueError(f"a /proc stat line with {len(fields)} fields after (comm)")
    state = fields[0]
    if len(state) != 1 or not state.isalpha():
        raise ValueError(f"a /proc stat state that is not one letter: {state[:20]!r}")
    return Stat(state.decode("ascii"), _number(fields[1]), _number(fields[2]),
                _number(fields[19]))


def _read(path: str, limit: int) -> bytes | None:
    try:
        return boundedread.read_regular(path, limit, cut=True)
    except OSError:  # gone, not ours (EACCES), or never a regular file
        return None


def stat(pid: int | str) -> Stat | None:
    """``pid``'s stat fields, or None: gone, unreadable, or a line that does not parse."""
    data = _read(f"/proc/{pid}/stat", STAT_BYTES)
    if data is None:
        return None
    try:
        return parse_stat(data)
    except ValueError:
        return None


def alive(pid: int | None, ticks: int | None = None) -> bool:
    """True when ``pid`` runs, has not ended (zombie) and, when ``ticks`` is given, started
    at those ticks (so a reused pid is not the process recorded)."""
    if not pid or pid < 0:
        return False
    st = stat(pid)
    if st is None or st.state in ENDED_STATES:
        return False
    return ticks is None or st.start_ticks == ticks


def cmdline(pid: int | str) -> list[str]:
    """``pid``'s arguments (empty: gone, unreadable, or a kernel thread)."""
    data = _read(f"/proc/{pid}/cmdline", limits.cap("PROC_FILE_BYTES"))
    return [a.decode("utf-8", "replace") for a in (data or b"").split(b"\0") if a]


def environ_entries(pid: int | str) -> list[bytes]:
    """``pid``'s environment as ``NAME=value`` byte strings (empty: gone or not ours)."""
    data = _read(f"/proc/{pid}/environ", limits.cap("PROC_FILE_BYTES"))
    return [e for e in (data or b"").split(b"\0") if e]


def environ(pid: int | str) -> dict[str, str]:
    """``pid``'s environment, decoded (an entry without ``=`` is left out)."""
    out: dict[str, str] = {}
    for item in environ_entries(pid):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def carries(pid: int | str, entry: str | bytes) -> bool:
    """Whether ``pid``'s environment holds exactly ``entry`` (``NAME=value``): the marker
    that finds a tree's processes wherever they moved (``setsid``, a double fork)."""
    want = entry.encode("utf-8") if isinstance(entry, str) else entry
    return want in environ_entries(pid)


def pids() -> list[int]:
    """The pids ``/proc`` lists now (empty when it cannot be listed)."""
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def uptime() -> float | None:
    """Seconds since boot (``/proc/uptime``'s first number), or None."""
    data = _read("/proc/uptime", STAT_BYTES)
    try:
        return float((data or b"").split()[0])
    except (IndexError, ValueError):
        return None


def read(pid: int | str, name: str, limit: int | None = None) -> bytes | None:
    """``/proc/<pid>/<name>`` (``pid`` may be ``self``), cut at ``limit`` (None: the
    ``PROC_FILE_BYTES`` cap), or None when it cannot be read."""
    return _read(f"/proc/{pid}/{name}", limits.cap("PROC_FILE_BYTES") if limit is None
                 else limit)


def status(pid: int | str) -> dict[str, str]:
    """``/proc/<pid>/status`` as ``{field: value}`` (``SigCgt``, ``State``, ...); empty when
    it cannot be read."""
    out: dict[str, str] = {}
    for line in (read(pid, "status", 1 << 16) or b"").decode("ascii", "replace").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def link(pid: int | str, name: str) -> str | None:
    """Where ``/proc/<pid>/<name>`` points (``exe``, ``cwd``, ``ns/net``), or None."""
    try:
        return os.readlink(f"/proc/{pid}/{name}")
    except OSError:
        return None


def open_files(pid: int | str) -> set[tuple[int, int]]:
    """``(st_dev, st_ino)`` of every file ``pid`` holds open (empty: gone or not ours)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    held = set()
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        held.add((st.st_dev, st.st_ino))
    return held


def exists(pid: int | str) -> bool:
    """Whether ``/proc`` lists ``pid`` now (a zombie included)."""
    return os.path.exists(f"/proc/{pid}")
