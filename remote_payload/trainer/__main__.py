"""``python -m remote_payload.trainer ...``: see ``remote_payload.trainer`` for launch commands."""

from __future__ import annotations

import sys

from .train import main

if __name__ == "__main__":
    sys.exit(main())
