"""Small helpers every agent verb uses: the failure type and atomic file writes."""

from __future__ import annotations

import json
import os
import typing as t

from remote_payload.wire import ErrorType


class AgentFailure(Exception):
    """A verb failed in a way the caller should see as a typed error document."""

    def __init__(self, type_: ErrorType, message: str, **fields: t.Any):
        super().__init__(message)
        self.type = type_
        self.message = message
        self.fields = fields


def write_json_atomic(path: str, obj: t.Any) -> None:
    """Write-then-rename so readers never see half a file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: str, default: t.Any = None) -> t.Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default
