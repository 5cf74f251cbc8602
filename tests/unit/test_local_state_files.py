"""Files opsctl keeps on this machine: local logs readable by their owner only, and a gone
connection multiplexer's lock and log files pruned once they are a day old."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from opsctl.config import paths


def test_local_logs_are_readable_by_their_owner_only(isolated_env: Path):
    (isolated_env / "logs").mkdir(mode=0o755)  # as an older opsctl left it
    old = os.umask(0)
    try:
        log = paths.new_log("x.log")
    finally:
        os.umask(old)
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_logs_folder_the_user_linked_elsewhere_keeps_its_own_mode(isolated_env: Path,
                                                                    tmp_path: Path):
    shared = tmp_path / "bigdisk"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    (isolated_env / "logs").symlink_to(shared)
    log = paths.new_log("x.log")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755, "the user's folder is left as it was"
    assert log.parent == isolated_env / "logs" and stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_gone_muxs_lock_and_log_files_are_pruned_a_day_later(tmp_path) -> None:
    import fcntl
    import os
    import time

    from opsctl.remote import mux_client as mux

    day = mux.STALE_FILES_AFTER_S
    old, young, held, live = (tmp_path / f"{n}.lock" for n in ("old", "young", "held", "live"))
    for lock in (old, young, held, live):
        lock.write_text("")
        lock.with_suffix(".log").write_text("x")
    (tmp_path / "live.sock").write_text("")
    past = time.time() - day - 60
    for lock in (old, held, live):
        os.utime(lock, (past, past))
    fd = os.open(held, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert mux.prune_stale(tmp_path) == [old]
    finally:
        os.close(fd)
    assert not old.exists() and not old.with_suffix(".log").exists()
    assert young.exists() and held.exists() and live.exists()
