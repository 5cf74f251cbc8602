"""Start ``ssh`` (any program) with stdin from /dev/null and stdout/stderr on pipes, with
nothing imported but ``os``.

Why our own few lines and not ``subprocess``: importing subprocess (threading, locale,
signal, selectors) before the spawn cost ~10-15 ms of the first `opsctl status` of a session
(docs/benchmarks.md), which needs none of its features (no shell, no text mode, no input). Both
spawners of that ``ssh`` use it: the launch record, before anything else is imported
(:mod:`.launchrecord`), and :func:`opsctl.remote.sshcall.start`; :class:`.sshcall.SshCall`
reads the pipes.
"""

from __future__ import annotations

import os


def spawn(argv: list[str]) -> tuple[int, int, int] | None:
    """``(pid, stdout read end, stderr read end)`` of ``argv`` started now (looked up on PATH,
    this process's environment); None when it cannot be started (nothing is left open)."""
    out_r, out_w = os.pipe()  # both ends close-on-exec; dup2 onto 1 and 2 clears it there
    err_r, err_w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=[
            (os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2)])
    except OSError:  # not on PATH (or not runnable)
        os.close(out_r)
        os.close(err_r)
        return None
    finally:
        for fd in (out_w, err_w, null):
            os.close(fd)
    return pid, out_r, err_r
