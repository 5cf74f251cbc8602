"""``env``: what the container offers (python, tmux, GPUs, payload, disk) in one answer."""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import typing as t

from remote_payload.agent import gpus, tmux
from remote_payload.agent import jobstore as jobs
from remote_payload.agent.common import read_json


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    """``env`` takes no options."""


def run(verb: str, args: argparse.Namespace) -> dict[str, t.Any]:
    root = args.root
    manifest = read_json(os.path.join(root, "payload", "MANIFEST.json"), {}) or {}
    gpu_list, gpu_error = gpus.query()
    try:
        st = os.statvfs(root if os.path.isdir(root) else os.path.dirname(root) or "/")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "hostname": socket.gethostname(),
        "root": root,
        "gpus": gpu_list,
        "gpu_error": gpu_error,
        "tmux": tmux.version(),
        "tmux_socket": tmux.socket_name(getattr(args, "tmux_socket", None)),
        "libtmux": _libtmux_version(),
        "payload_digest": manifest.get("digest"),
        "current_job": _current_job(root),
        "disk_free_bytes": free,
    }


def _libtmux_version() -> str | None:
    from remote_payload.agent import vendor

    vendor.add_wheels()
    try:
        import libtmux
    except ImportError:
        return None
    return str(libtmux.__version__)


def _current_job(root: str) -> str | None:
    """The current job's id; None when ``jobs/current`` is missing or not the agent's (the
    environment report is still given; ``jobs`` lists the damaged file)."""
    from remote_payload.agent import jobrecord

    try:
        return jobs.current_job_id(root)
    except jobrecord.DamagedRecord:
        return None
