"""The dashboard served on a free loopback port, in a thread, for one test."""

from __future__ import annotations

import contextlib
import threading
import typing as t

from opsctl.cli import dashboard


@contextlib.contextmanager
def serving(**options: t.Any) -> t.Iterator[dashboard.Server]:
    """``dashboard.serve(port=0, **options)`` running until the block ends, then shut down
    and closed (its socket and its poller)."""
    server = dashboard.serve(port=0, **options)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        server.app.close()
