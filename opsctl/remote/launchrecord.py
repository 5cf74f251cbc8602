"""The launch record: the first `opsctl status` of a session starts its ``ssh`` before anything
else of opsctl is imported, from what the last such call computed.

Why: with no mux, `status --json` is a raw ``ssh … pct exec`` plus opsctl's own start; before
this, ~35 ms passed between the interpreter's start and ``ssh``'s (the console script's
imports, ``typing``, ``pathlib``, the target cache, the private known_hosts, spelling the
command; docs/benchmarks.md), all of it in series with the handshake.

After a status that went over ssh and printed its answer, :func:`store` keeps, under
``$OPSCTL_HOME/cache/launch.json`` (0600; argv and paths only, no secrets), the command line
words, the exact ``ssh`` argv (the private known_hosts, ``StrictHostKeyChecking yes``, the
command string with its deadlines), and what it was derived from: the environment variables
opsctl reads (:data:`ENV`), the current directory, and the stat (mtime, ctime, size, inode;
``None`` for a missing path) of every file and directory it depends on (inventory files and
their directories, ``~/.ssh/config``, the target cache, the last target, the user's and the
private known_hosts, opsctl's own modules). :func:`launch`, the first thing the console
script does, reads it with ``os`` and ``json`` alone: when the words, environment, directory
and every stat match, and no mux socket is there (a live mux takes the call), ``ssh`` starts
at once and everything else loads while it runs.

The record is only a cache, never trusted: a record that is not a regular file of ours
with mode 0600, or does not parse, or any mismatch, and nothing is started (the normal path
runs, exactly as without a record). The normal path then still computes everything it
would send (:func:`opsctl.remote.sshcall.start`) and *adopts* the running ``ssh`` only if
its argv is the one it would have started; otherwise it is killed (the read-only ``status``
may have run once more) and the normal path starts its own. So what is sent, the host-key
checks (``ssh`` itself, against the private known_hosts the normal path just verified) and
the deadlines (counted from the real start) are the normal path's, with or without a record.
"""

from __future__ import annotations

import json
import os
import stat  # loaded by os already
import time

from opsctl.config import homedir
from opsctl.remote import sshspawn

_VERSION = 1
_MAX_ENTRIES = 8
#: Environment variables the answer depends on (home, mux switch, inventory lookup order).
ENV = ("HOME", "OPSCTL_HOME", "OPSCTL_MUX", "OPSCTL_INVENTORY", "OPSCTL_INVENTORY_DIRS")


def path() -> str:
    return os.path.join(homedir.home(), "cache", "launch.json")


def stat_key(p: str) -> list[int] | None:
    """What must not change under a record: mtime, ctime, size and inode (None: no such path)."""
    try:
        st = os.stat(p)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino]


class Launched:
    """An ``ssh`` started from the record: adopted by the normal path, or discarded (killed)."""

    def __init__(self, pid: int, stdout: int, stderr: int, ssh_argv: list[str]):
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.ssh_argv = ssh_argv
        self.started = time.monotonic()
        self.settled = False

    def adopt(self) -> tuple[int, int, int, float]:
        """``(pid, stdout, stderr, started)``; the caller now owns the process and pipes."""
        self.settled = True
        return self.pid, self.stdout, self.stderr, self.started

    def discard(self) -> None:
        """Kill and reap the ``ssh`` unless it was adopted (idempotent)."""
        if self.settled:
            return
        self.settled = True
        import signal

        for fd in (self.stdout, self.stderr):
            os.close(fd)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _entries() -> list[object]:
    """The record's entries; [] when it is missing, not ours, not 0600 or not a record."""
    try:
        fd = os.open(path(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode) \
                or stat.S_IMODE(st.st_mode) != 0o600:
            return []
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
    except OSError:
        return []
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except ValueError:
        return []
    if not isinstance(doc, dict) or doc.get("version") != _VERSION:
        return []
    entries = doc.get("entries")
    return entries if isinstance(entries, list) else []


def _matches(entry: object, words: list[str]) -> list[str] | None:
    """The entry's ``ssh`` argv when it answers ``words`` here and now; else None."""
    if not isinstance(entry, dict) or entry.get("words") != words:
        return None
    ssh = entry.get("ssh")
    env = entry.get("env")
    files = entry.get("files")
    if not (isinstance(ssh, list) and ssh and all(isinstance(a, str) for a in ssh)
            and isinstance(env, dict) and isinstance(files, list)):
        return None
    if env != {k: os.environ.get(k) for k in ENV} or entry.get("cwd") != os.getcwd():
        return None
    for item in files:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and stat_key(item[0]) == item[1]):
            return None
    sock = entry.get("mux_socket")
    if sock is not None and (not isinstance(sock, str) or os.path.lexists(sock)):
        return None  # a mux may be up: the normal path calls it
    return ssh


def launch(words: list[str]) -> Launched | None:
    """Start the recorded ``ssh`` for command line ``words`` if its record still holds; None
    (nothing started) otherwise. Never raises for a bad record."""
    if words[:1] != ["status"]:
        return None
    try:
        ssh = next((s for e in _entries() if (s := _matches(e, words)) is not None), None)
        if ssh is None:
            return None
        got = sshspawn.spawn(ssh)
    except (OSError, ValueError, TypeError):
        return None
    return None if got is None else Launched(*got, ssh_argv=ssh)


def store(words: list[str], ssh_argv: list[str], files: list[str],
          mux_socket: str | None) -> None:
    """Record that ``words`` started ``ssh_argv``, derived from ``files`` and :data:`ENV`
    as they are now (0600, written whole then renamed; never raises: a record only saves time)."""
    entry = {"words": words, "ssh": ssh_argv, "env": {k: os.environ.get(k) for k in ENV},
             "cwd": os.getcwd(), "files": [[f, stat_key(f)] for f in dict.fromkeys(files)],
             "mux_socket": mux_socket}
    others = [e for e in _entries() if not (isinstance(e, dict) and e.get("words") == words)]
    text = json.dumps({"version": _VERSION, "entries": [entry, *others][:_MAX_ENTRIES]})
    target = path()
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode())
        os.replace(tmp, target)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
