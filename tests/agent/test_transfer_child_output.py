"""A transfer's child (rsync, or the tar stream's ssh) relays the container's stderr: only
its tail is kept, however much the container writes."""

from __future__ import annotations

import sys

import pytest

from opsctl.remote import transfer


def test_a_flood_on_stderr_keeps_only_its_last_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_CHILD_OUTPUT_BYTES", str(1 << 20))
    flood = ("import sys\nfor _ in range(64): sys.stderr.write('x' * (1 << 20))\n"
             "sys.stderr.write('the last word\\n')\n")
    done = transfer.run_piped([sys.executable, "-c", flood])
    assert done.rc == 0
    assert len(done.stderr) <= (1 << 20) + (1 << 16)
    assert done.stderr.endswith(b"the last word\n")
