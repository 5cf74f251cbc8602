"""``python -m remote_payload.trainer [COMMAND] ...``: see ``remote_payload.trainer`` and
``commands`` for launch commands."""

from __future__ import annotations

import sys

from .commands import main

if __name__ == "__main__":
    sys.exit(main())
