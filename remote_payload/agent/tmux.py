"""The agent's tmux calls: one socket, one session per job, argv only.

Starting a session goes through libtmux (``Server.cmd`` is its single argv
builder). Reading a pane is a plain ``tmux capture-pane`` child because ``status`` must
stay fast and importing libtmux costs ~120 ms (and ``subprocess`` ~3 ms): it and every other
tmux child here are started with :mod:`remote_payload.procgroup`.
"""

from __future__ import annotations

import os
import typing as t

from remote_payload import wire
from remote_payload.agent.common import which
from remote_payload.procgroup import ChildTimeout, Finished, Group, run

DEFAULT_SOCKET = wire.DEFAULT_TMUX_SOCKET
SESSION_PREFIX = "opsctl-"
_TMUX_TIMEOUT_S = 3.0


class TmuxError(Exception):
    """A tmux command failed; carries argv and stderr."""

    def __init__(self, argv: t.Sequence[str], stderr: str):
        super().__init__(f"tmux {' '.join(argv)} failed: {stderr.strip()}")
        self.argv = list(argv)
        self.stderr = stderr


def socket_name(explicit: str | None = None) -> str:
    """Flag, then ``OPSCTL_TMUX_SOCKET``, then the default."""
    return explicit or os.environ.get(wire.ENV_TMUX_SOCKET) or DEFAULT_SOCKET


def session_name(job_id: str) -> str:
    """tmux turns ``.`` and ``:`` in session names into ``_``; do it ourselves."""
    return SESSION_PREFIX + job_id.replace(".", "_").replace(":", "_")


def _server(socket: str) -> t.Any:
    from remote_payload.agent import vendor

    vendor.add_wheels()
    import libtmux

    return libtmux.Server(socket_name=socket)


def _clean_env() -> dict[str, str]:
    """Never talk to the tmux server of whoever runs the agent."""
    env = dict(os.environ)
    env.pop("TMUX", None)
    env.pop("TMUX_PANE", None)
    return env


def start_session(socket: str, session: str, argv: t.Sequence[str], cwd: str) -> int:
    """Start ``argv`` detached in a new session with ``remain-on-exit`` on; return the pane pid.

    The option is set in the same tmux invocation (``;``-chained) so a command
    that exits at once still leaves its pane behind.

    Raises
    ------
    TmuxError
        tmux refused (e.g. a session of that name exists).
    """
    import shlex

    server = _server(socket)
    res = server.cmd(
        "new-session", "-d", "-s", session, "-c", cwd, "-x", "200", "-y", "50",
        "-P", "-F", "#{pane_pid}", shlex.join(argv),
        ";", "set-option", "-w", "-t", f"={session}:", "remain-on-exit", "on",
    )
    if res.stderr or not res.stdout:
        raise TmuxError(["new-session", session], "\n".join(res.stderr) or "no pane pid printed")
    return int(res.stdout[0])


def _run(argv: list[str]) -> Finished:
    """One tmux command under the tmux deadline.

    Raises
    ------
    TmuxError
        tmux did not answer in time (a wedged server, a broken tmux on the target).
    """
    try:
        return run(argv, _TMUX_TIMEOUT_S, env=_clean_env())
    except ChildTimeout:
        raise TmuxError(argv[1:], f"no answer within {_TMUX_TIMEOUT_S:g} s (a hung tmux "
                        "server or a broken tmux on the target)") from None


def kill_session(socket: str, session: str) -> bool:
    """Kill one session; False when it did not exist."""
    tmux = which("tmux")
    if tmux is None:
        return False
    done = _run([tmux, "-L", socket, "kill-session", "-t", f"={session}"])
    return done.rc == 0


def dead_sessions(socket: str) -> list[str]:
    """Names of opsctl sessions whose pane has exited (kept by ``remain-on-exit``)."""
    tmux = which("tmux")
    if tmux is None:
        return []
    done = _run([tmux, "-L", socket, "list-panes", "-a", "-F", "#{session_name} #{pane_dead}"])
    names = []
    for line in done.out.decode("utf-8", "replace").splitlines():
        name, _, dead = line.rpartition(" ")
        if dead == "1" and name.startswith(SESSION_PREFIX):
            names.append(name)
    return names


class PaneCapture:
    """A ``capture-pane`` started now and collected later, so it overlaps other work."""

    def __init__(self, socket: str, session: str, lines: int):
        self.lines = lines
        self.proc: Group | None = None
        self.error: str | None = None
        tmux = which("tmux")
        if tmux is None:
            self.error = "tmux not installed"
            return
        argv = [tmux, "-L", socket, "capture-pane", "-p", "-J", "-t", f"={session}:",
                "-S", f"-{max(lines, 1)}"]  # N history rows plus the visible ones
        self.proc = Group(argv, env=_clean_env())

    def result(self) -> list[str]:
        """Last ``lines`` non-blank-trailing lines; [] (with ``error`` set) when unavailable."""
        if self.proc is None:
            return []
        try:
            rc, out, err, _, _ = self.proc.result(_TMUX_TIMEOUT_S)
        except TimeoutError:
            self.error = "tmux capture-pane timed out"
            return []
        if rc != 0:
            self.error = err.decode("utf-8", "replace").strip() or "capture-pane failed"
            return []
        rows: list[str] = []
        for row in out.decode("utf-8", "replace").splitlines():
            row = row.rstrip()
            if row or (rows and rows[-1]):  # the pane pads with blank rows: keep one at most
                rows.append(row)
        while rows and not rows[-1]:
            rows.pop()
        return rows[-self.lines:] if self.lines > 0 else []


def version() -> str | None:
    """``tmux -V`` output (e.g. ``tmux 3.3a``) or None when tmux is missing."""
    tmux = which("tmux")
    if tmux is None:
        return None
    return run([tmux, "-V"], _TMUX_TIMEOUT_S).out.decode("utf-8", "replace").strip() or None
