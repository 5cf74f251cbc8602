"""``python -m remote_payload.trainer [COMMAND] ...``: see ``remote_payload.trainer`` and
``commands`` for launch commands."""

from __future__ import annotations

import sys

from .bytecode import cache_bytecode

cache_bytecode()  # before torch is imported: see the module for why

from .commands import COMMANDS, main  # noqa: E402

if __name__ == "__main__":
    rc = main()
    if not sys.argv[1:] or sys.argv[1] not in COMMANDS:
        # training: `done` was said after the checkpoint was durable; the interpreter's
        # teardown (CUDA, inductor's workers, a 16 GB target) took seconds
        from .train import _leave

        _leave(rc)
    from .trackers import leave_if_abandoned

    leave_if_abandoned(rc)  # a tracker left unfinished must not hold the exit (eval)
    sys.exit(rc)
