"""Library logging (paramiko, fabric, …) routed through one opsctl handler: never a traceback.

Why: paramiko's transport thread logs ``Exception (client): Error reading SSH protocol
banner`` and then the whole traceback, line by line, at ERROR; with no handler configured
Python's last-resort handler printed all of it on stderr for a host that accepts TCP and
never speaks SSH (`hosts --check`, `status --all`, `deploy --nodes`). The same failure is
raised to opsctl's caller, which reports it as its one line naming host and container (the
row of a fleet command, the error of a single one). So paramiko's own records are dropped
here, and any other library's warning becomes one line: ``warning: <logger>: <first line>``.
``OPSCTL_DEBUG_LIBRARIES=1`` shows paramiko's records too, still one line each.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

_lock = threading.Lock()
_installed = False
#: Loggers whose problems reach opsctl as exceptions (reported there, with host and ct).
RAISED_TO_OPSCTL = ("paramiko", "fabric", "invoke")


class OneLineHandler(logging.Handler):
    """One line per record on stderr, no traceback; the libraries in :data:`RAISED_TO_OPSCTL`
    are quiet unless ``OPSCTL_DEBUG_LIBRARIES`` is set."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            root = record.name.split(".", 1)[0]
            if root in RAISED_TO_OPSCTL and not os.environ.get("OPSCTL_DEBUG_LIBRARIES"):
                return
            text = record.getMessage().strip().splitlines()
            if not text or text[0].startswith(("Traceback", "  File ", "During handling")):
                return  # a traceback's lines, logged one record each by paramiko
            level = record.levelname.lower()
            sys.stderr.write(f"{level}: {record.name}: {text[0][:300]}\n")
            sys.stderr.flush()
        except Exception:  # never let logging raise into the thread that logged
            pass


def install() -> None:
    """Put :class:`OneLineHandler` on the root logger (once per process; cheap after that)."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        root = logging.getLogger()
        root.addHandler(OneLineHandler(logging.WARNING))
        if root.level == logging.NOTSET or root.level > logging.WARNING:
            root.setLevel(logging.WARNING)
        _installed = True
