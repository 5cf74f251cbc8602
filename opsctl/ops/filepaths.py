"""The path rules of ``opsctl push``/``pull``, in one pure place (no I/O but ``Path.resolve``).

What this module decides, and why (files can destroy data):

- **Where a container path points.** Absolute, or relative to ``<root>/data``; a relative path
  whose ``..`` leaves ``<root>/data`` is refused (:func:`container_path`): ``push x ../jobs``
  would otherwise land in the agent's job store. An absolute path says "another place" plainly.
- **Where a pull lands without DEST.** ``./<basename of SRC>``, never the current directory
  itself; ``/`` has no basename and is refused (:func:`implied_pull_dest`). ``pull /`` once
  wrote the container's root file system into the current directory.
- **Where ``--delete`` may delete.** Never in ``/``, a top-level system directory, a home, the
  current directory, opsctl's own root or data directory, nor in any directory that contains
  one of them (:func:`delete_refusal`). ``push EMPTYDIR /root --delete`` once removed the
  container's ``.ssh``.
- **``--delete`` never reaches opsctl's own state.** In the container, nothing inside
  ``<root>`` but below ``<root>/data`` (its ``envs``, ``jobs``, ``payloads``: the torch builds
  and job records the agent keeps); here, nothing inside opsctl's home (``$OPSCTL_HOME``)
  (:func:`own_state_refusal`). A dry run of ``pull --delete`` into ``/opt/opsctl/envs`` once
  listed the current torch build among 26,168 entries to remove.
- **When ``--delete`` asks first.** Above :data:`DELETE_ASK_ABOVE` files.
"""

from __future__ import annotations

import os
import posixpath
import typing as t
from pathlib import Path

from opsctl.errors import ConfigError, DeleteRefused

DATA_DIR = "data"  # under the host's `root:` in the container

#: Top-level directories of a Linux system; ``lib*`` (lib, lib32, lib64, libx32) is matched by
#: prefix. ``--delete`` never applies to one of them (nor to ``/``, which contains them all).
SYSTEM_DIRS = frozenset({"bin", "boot", "dev", "etc", "home", "lib", "media", "mnt", "opt",
                         "proc", "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var"})

#: ``--delete`` removing more files than this asks first (``-y`` answers yes; without a
#: terminal and without ``-y`` it is refused). Ten: a few stale files go through unasked.
DELETE_ASK_ABOVE = 10


def is_system_dir(path: str) -> bool:
    """``/`` or a top-level system directory (``/etc``, ``/lib64``, …), as a normalized path."""
    parts = [p for p in path.split("/") if p]
    return not parts or (len(parts) == 1 and (parts[0] in SYSTEM_DIRS
                                              or parts[0].startswith("lib")))


def contains(outer: str, inner: str) -> bool:
    """``outer`` is ``inner`` or one of its ancestors (both absolute and normalized)."""
    return outer == "/" or inner == outer or inner.startswith(outer.rstrip("/") + "/")


def delete_refusal(path: str, protected: t.Mapping[str, str]) -> str | None:
    """Why ``--delete`` may not apply to ``path`` (absolute, normalized), or None.

    ``protected`` maps a path to what it is ("your home", "the current directory", …); the
    path is refused when it is a system directory or contains any protected path.
    """
    if is_system_dir(path):
        return "it is / or a top-level system directory"
    for where, what in protected.items():
        if where and contains(path, where):
            return f"it is {what}" if path == where else f"it contains {what} ({where})"
    return None


def own_state_refusal(path: str, state: str, allowed: str | None = None) -> str | None:
    """Why ``--delete`` may not apply to ``path`` (absolute, normalized) because it lies
    inside opsctl's own state directory ``state`` (and not inside ``allowed``, the part of
    it that holds the user's files), or None."""
    state = posixpath.normpath(state)
    if path == state or not contains(state, path):
        return None  # ``state`` itself (and what contains it) is the protected-map's rule
    if allowed is not None and contains(posixpath.normpath(allowed), path) \
            and path != posixpath.normpath(allowed):
        return None
    return f"it is inside opsctl's own state ({state})"


def check_delete(side: str, path: str, protected: t.Mapping[str, str],
                 own_state: t.Sequence[tuple[str, str | None]] = ()) -> None:
    """Raise :class:`DeleteRefused` when ``--delete`` may not apply to ``path``.

    Raises:
        DeleteRefused: the rule and the path; nothing was sent or deleted.
    """
    why = delete_refusal(path, protected)
    for state, allowed in own_state:
        why = why or own_state_refusal(path, state, allowed)
    if why is not None:
        raise DeleteRefused(f"--delete refused for {side} {path!r}: {why}; nothing was sent "
                            "or deleted", path=path, rule=why,
                            hint="name a directory of its own below it as DEST, or leave "
                                 "out --delete")


def local_protected(cwd: str | None = None, home: str | None = None) -> dict[str, str]:
    """This machine's protected paths: home and the current directory, as typed and resolved."""
    out: dict[str, str] = {}
    for what, raw in (("your home", home or os.environ.get("HOME") or str(Path.home())),
                      ("the current directory", cwd or os.getcwd())):
        for p in {posixpath.normpath(raw), str(Path(raw).resolve())}:
            out.setdefault(p, what)
    return out


def remote_protected(root: str, homes: t.Iterable[str]) -> dict[str, str]:
    """The container's protected paths: its user's home and opsctl's root and data dir."""
    out = {posixpath.normpath(h): "the container user's home" for h in homes if h.startswith("/")}
    out[posixpath.normpath(root)] = "opsctl's root in the container (its jobs and payloads)"
    out[posixpath.join(posixpath.normpath(root), DATA_DIR)] = "opsctl's data directory itself"
    return out


def local_delete_target(dest: str | Path) -> list[str]:
    """The paths ``--delete`` on local ``dest`` would act on: as typed (absolute) and with
    ``..`` and symlinks resolved; the guard judges both."""
    typed = posixpath.normpath(os.path.abspath(os.path.expanduser(str(dest))))
    return sorted({typed, str(Path(typed).resolve())})


def container_path(root: str, path: str) -> str:
    """An absolute container path; a relative one is under ``<root>/data``.

    Raises:
        ConfigError: empty, a NUL byte, or a relative path whose ``..`` leaves ``<root>/data``.
    """
    if not path or "\0" in path:
        raise ConfigError(f"container path {path!r} is empty or holds a NUL byte")
    if path.startswith("/"):
        return posixpath.normpath(path).replace("//", "/")
    data = posixpath.join(posixpath.normpath(root), DATA_DIR)
    joined = posixpath.normpath(posixpath.join(data, path))
    if not contains(data, joined):
        raise ConfigError(f"container path {path!r} leaves {data} (it would be {joined})",
                          hint=f"write the absolute path ({joined}) if that place is meant")
    return joined


def implied_pull_dest(remote_src: str) -> str:
    """``./<basename of SRC>`` for a pull without DEST (never the current directory itself).

    Raises:
        ConfigError: SRC is ``/`` (no basename).
    """
    name = posixpath.basename(posixpath.normpath(remote_src).rstrip("/"))
    if name in ("", ".", ".."):
        raise ConfigError(f"pull {remote_src!r} without DEST: it has no name to use here",
                          hint="pass DEST, a new directory (pulling / writes a whole file system)")
    return name
