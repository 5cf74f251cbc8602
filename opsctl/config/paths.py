"""Where opsctl keeps local state (``$OPSCTL_HOME``, default ``~/.opsctl``) and where it looks
for playbooks and inventory.

Lookup order, first match wins (a name found earlier shadows the same name later):

1. the current directory's ``playbooks/`` / ``inventory/`` (a project checkout),
2. ``$OPSCTL_HOME/playbooks/`` / ``$OPSCTL_HOME/inventory/`` (``~/.opsctl/…``; ``opsctl sandbox
   up`` writes ``inventory/sandbox.yaml`` there),
3. playbooks only: the ones bundled inside the installed package (``opsctl/bundled/``).

Hosts come only from the user's directories: the package carries its inventory as an
example (:data:`EXAMPLE_INVENTORY`, ``opsctl hosts --example``), never as an entry, so a
fresh install dials no host nobody configured. Inventory also reads
``$OPSCTL_INVENTORY`` (a directory) before all of these, and ``OPSCTL_INVENTORY_DIRS``
(os.pathsep-separated) replaces the whole inventory list; tests use it so that they read only
their own inventory.
"""

from __future__ import annotations

import os
import typing as t
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # opsctl/
REPO_ROOT = PACKAGE.parent  # the checkout, or site-packages when installed
BUNDLED = PACKAGE / "bundled"
#: The example inventory shipped with the package: shown, copied, never read as hosts.
EXAMPLE_INVENTORY = BUNDLED / "examples" / "hosts.yaml"


class SearchDir(t.NamedTuple):
    """One directory of a lookup order, and what it is (shown as a name's origin)."""

    path: Path
    origin: str  # "cwd" | "home" | "env" | "bundled"


ENV_HOME = "OPSCTL_HOME"


def home() -> Path:
    """opsctl's local state: ``$OPSCTL_HOME``, else ``~/.opsctl``."""
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".opsctl")


def logs_dir() -> Path:
    """Full outputs of failed steps are saved here; errors print the path.

    0700, whatever umask or an older opsctl left: the logs hold remote output and argv. A
    ``logs`` the user made a link (to a bigger disk, say) keeps its target's mode: that folder
    is the user's, not opsctl's to change, and each log in it is 0600 anyway
    (:func:`new_log`).
    """
    d = home() / "logs"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not d.is_symlink() and d.stat().st_mode & 0o777 != 0o700:
        d.chmod(0o700)
    return d


def new_log(name: str) -> Path:
    """A fresh file in :func:`logs_dir`, created 0600 (only its owner reads it) and
    exclusively: a file or a link already at ``name`` is left alone, and the log takes
    ``<stem>-1<suffix>`` (``-2``, ...) instead, so nothing is written through a planted
    link.

    Raises:
        OSError: the folder is not writable, or 100 names are taken.
    """
    directory = logs_dir()
    stem, suffix = os.path.splitext(name)
    for n in range(100):
        path = directory / (name if n == 0 else f"{stem}-{n}{suffix}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        os.fchmod(fd, 0o600)  # a umask never widens it, and never narrows it past reading
        os.close(fd)
        return path
    raise FileExistsError(f"{directory}: 100 logs named {name} already")


def payload_source() -> Path:
    return REPO_ROOT / "remote_payload"


def _dedup(dirs: list[SearchDir]) -> list[SearchDir]:
    """Drop a directory seen earlier (a checkout's ``playbooks/`` links to the bundled one)."""
    seen: set[Path] = set()
    out = []
    for d in dirs:
        key = d.path.resolve() if d.path.exists() else d.path.absolute()
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def playbook_dirs() -> list[SearchDir]:
    """``./playbooks``, ``$OPSCTL_HOME/playbooks``, the bundled playbooks: first match wins."""
    return _dedup([SearchDir(Path.cwd() / "playbooks", "cwd"),
                   SearchDir(home() / "playbooks", "home"),
                   SearchDir(BUNDLED / "playbooks", "bundled")])


def inventory_search() -> list[SearchDir]:
    """``$OPSCTL_INVENTORY``, ``./inventory``, ``$OPSCTL_HOME/inventory`` (first wins).

    ``OPSCTL_INVENTORY_DIRS`` replaces the whole list (in its order).
    """
    override = os.environ.get("OPSCTL_INVENTORY_DIRS")
    if override is not None:
        return [SearchDir(Path(p), "env") for p in override.split(os.pathsep) if p]
    dirs = []
    extra = os.environ.get("OPSCTL_INVENTORY")
    if extra:
        dirs.append(SearchDir(Path(extra), "env"))
    dirs += [SearchDir(Path.cwd() / "inventory", "cwd"), SearchDir(home() / "inventory", "home")]
    return _dedup(dirs)


def inventory_dirs() -> list[Path]:
    """The inventory directories in lookup order (see :func:`inventory_search`)."""
    return [d.path for d in inventory_search()]
