"""``--json`` output without rich: the hot path of `opsctl status --json` stays light."""

from __future__ import annotations

import json
import sys
import typing as t


def print_json(doc: t.Any) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()
