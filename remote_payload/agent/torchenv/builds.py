"""The ``envs`` report: installed builds, which is current, recent swap history."""

from __future__ import annotations

import os
import typing as t

from remote_payload.agent.torchenv.layout import (
    Layout,
    current_build,
    list_builds,
    read_history,
    read_marker,
)

if t.TYPE_CHECKING:
    from remote_payload.wire_shapes import EnvsDoc, TorchBuildDoc


def envs_report(layout: Layout, history: int = 20) -> EnvsDoc:
    """Fast: sizes were measured at install time and stored in each build's marker."""
    current = current_build(layout)
    builds: list[TorchBuildDoc] = []
    for name in list_builds(layout):
        marker = read_marker(layout, name) or {}
        builds.append({
            "name": name, "version": marker.get("version"), "variant": marker.get("variant"),
            "pin": marker.get("pin"), "path": layout.build_dir(name),
            "python": os.path.join(layout.build_dir(name), "bin", "python"),
            "size_bytes": marker.get("size_bytes"), "installed_at": marker.get("installed_at"),
            "index_url": marker.get("index_url"), "wheelhouse": marker.get("wheelhouse"),
            "current": name == current,
        })
    try:
        leftovers = sorted(n for n in os.listdir(layout.envs) if n.startswith((".building-",
                                                                               ".trash-")))
    except FileNotFoundError:
        leftovers = []
    return {"root": layout.root, "current": current, "builds": builds,
            "history": read_history(layout, history), "in_progress_or_leftover": leftovers}
