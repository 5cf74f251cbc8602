"""Where opsctl keeps local state: ``$OPSCTL_HOME`` (default ``~/.opsctl``)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def home() -> Path:
    return Path(os.environ.get("OPSCTL_HOME") or Path.home() / ".opsctl")


def logs_dir() -> Path:
    """Full outputs of failed steps are saved here; errors print the path."""
    d = home() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def payload_source() -> Path:
    return REPO_ROOT / "remote_payload"


def inventory_dirs() -> list[Path]:
    dirs = [REPO_ROOT / "inventory", home() / "inventory"]
    extra = os.environ.get("OPSCTL_INVENTORY")
    if extra:
        dirs.append(Path(extra))
    return dirs
