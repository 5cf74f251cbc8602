"""``--json`` output without rich: the hot path of `opsctl status --json` stays light.

The one place a ``--json`` document is written, so the envelope is decided once: every
document is a JSON object with ``ok`` first; a success document gets ``"ok": true`` here,
an error document already says ``"ok": false`` (``opsctl.cli.app``) and keeps it.
"""

from __future__ import annotations

import sys
import typing as t

from remote_payload.wire import dumps_strict


def print_json(doc: t.Mapping[str, t.Any]) -> None:
    """Exactly one JSON document (an object, ``ok`` first) on stdout.

    Raises:
        TypeError: ``doc`` is not a mapping (a bug: lists go under a key, e.g. ``hosts``).
    """
    if not isinstance(doc, t.Mapping):
        raise TypeError(f"a --json document is an object, not {type(doc).__name__}")
    out = {"ok": doc.get("ok", True), **{k: v for k, v in doc.items() if k != "ok"}}
    sys.stdout.write(dumps_strict(out, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def print_failure(report: t.Mapping[str, t.Any], error: t.Mapping[str, t.Any]) -> None:
    """A failed command's one document: what it got (``report``) with ``ok: false`` and its
    ``error``; the click context is told, so the error handler adds no second document."""
    import click

    print_json({**report, "ok": False, "error": dict(error)})
    click.get_current_context().meta["opsctl_json_done"] = True
