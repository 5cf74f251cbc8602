"""Where opsctl keeps local state: ``$OPSCTL_HOME`` (default ``~/.opsctl``)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def home() -> Path:
    return Path(os.environ.get("OPSCTL_HOME") or Path.home() / ".opsctl")


def logs_dir() -> Path:
    """Full outputs of failed steps are saved here; errors print the path.

    0700, whatever umask or an older opsctl left: the logs hold remote output and argv.
    """
    d = home() / "logs"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    if d.stat().st_mode & 0o777 != 0o700:
        d.chmod(0o700)
    return d


def new_log(name: str) -> Path:
    """A fresh file in :func:`logs_dir`, created 0600 (only its owner reads it)."""
    path = logs_dir() / name
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    path.chmod(0o600)  # an existing file of the same name keeps no wider mode
    return path


def payload_source() -> Path:
    return REPO_ROOT / "remote_payload"


def inventory_dirs() -> list[Path]:
    """Repo inventory, then $OPSCTL_HOME's, then $OPSCTL_INVENTORY.

    ``OPSCTL_INVENTORY_DIRS`` (os.pathsep-separated) replaces the whole list; tests use it so
    that the shipped example host (a real 10.x address) is never contacted.
    """
    override = os.environ.get("OPSCTL_INVENTORY_DIRS")
    if override is not None:
        return [Path(p) for p in override.split(os.pathsep) if p]
    dirs = [REPO_ROOT / "inventory", home() / "inventory"]
    extra = os.environ.get("OPSCTL_INVENTORY")
    if extra:
        dirs.append(Path(extra))
    return dirs
