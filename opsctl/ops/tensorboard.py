"""``opsctl tensorboard [JOB]``: a job's TensorBoard curves, served on 127.0.0.1 here.

Why the event files are pulled and served here, rather than a TensorBoard server started in
the container and forwarded:

- nothing runs in the container, so nothing can be left there: a server started by
  ``pct exec`` outlives a closed SSH channel (Proxmox's ``pct`` kills nothing inside when
  the client goes), and a client killed with SIGKILL could never stop it;
- it needs neither TensorBoard in the job's torch environment nor a network route from the
  host to the container (``forward`` needs one, and a container sharing the host's network,
  as the sandbox's do, would put the server on the host's own ports);
- the pull is the existing verified path (:func:`opsctl.ops.files.pull`: rsync, else the
  sha256-checked tar stream), and only what changed travels on each refresh.

Where the files are: the trainer says it once, in its ``trackers`` event (the logdir of
``--report-to tensorboard``); the last such event of the job counts (a restarted attempt
says it again). The copy lives under ``<opsctl home>/tensorboard/<host>-ct<ct>/<job>/`` and
is refreshed every ``refresh_s`` while the job lives.

The server: ``python -m tensorboard.main`` of this interpreter, bound to 127.0.0.1 only,
started and ended the one way opsctl ends a process tree (:mod:`remote_payload.procgroup`:
its own session, SIGTERM, then SIGKILL) on Ctrl-C, SIGTERM, SIGHUP or any error, and with
``die_with_parent``, so it ends with this process even after a SIGKILL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import posixpath
import re
import signal
import socket
import sys
import tempfile
import time
import typing as t
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from opsctl.config import paths
from opsctl.errors import ConfigError, OpsctlError, RemoteCommandFailed, ReplyShapeError
from opsctl.ops import files, watch
from opsctl.remote import shapes
from remote_payload import limits, procgroup, wire
from remote_payload.wire_shapes import LogdirLookDoc

if t.TYPE_CHECKING:
    from opsctl.ops.jobs import Target

#: How long the local server may take to answer its first request.
READY_S = 60.0
#: How long it gets to end on SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0
#: The text of the event line the trainer prints, as the wrapper writes it to events.jsonl.
TRACKERS_LINE = f'{{"event":"{wire.EVENT_TRACKERS}",'
#: Runs in the container: the last line of FILE holding TEXT, at most BYTES of it (a job that
#: printed 300,000 ``trackers`` lines sends one). Exit 1: no such line; 2: FILE unreadable
#: (grep's own codes). Constant text; the text, the file and the cap are its arguments.
TRACKERS_SCRIPT = r"""grep -q -F -e "$1" -- "$2"; rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
grep -F -e "$1" -- "$2" | tail -n 1 | head -c "$3"
"""


@dataclass(frozen=True)
class Source:
    """Where a job's TensorBoard event files are, in the container and here."""

    job_id: str
    state: str
    terminal: bool
    remote_dir: str
    local_dir: Path


def no_event_files(label: str, job_id: str, why: str) -> ConfigError:
    return ConfigError(f"{label}: job {job_id} has no TensorBoard event files ({why})",
                       hint="run the trainer with `--report-to tensorboard` (in the playbook's "
                            "command) and install tensorboard in the container (the playbook's "
                            "requirements)")


def locate(tgt: Target, job_id: str | None) -> Source:
    """The job (default: the current one) and the logdir its trainer announced.

    Raises:
        UnknownJob: no such job.
        ConfigError: the job announced no TensorBoard logdir (the message says what to pass).
        RemoteCommandFailed: its events could not be read.
    """
    st = watch.fetch_status(tgt.agent, job_id, lines=0)
    job = checked_job_id(tgt.label, st["job_id"])
    local = local_copy_dir(tgt.host.label, tgt.ctid, job)
    path = f"{tgt.host.root}/jobs/{job}/events.jsonl"
    cap = limits.cap("TRACKERS_LINE_BYTES")
    res = tgt.remote.pct_exec(tgt.ctid, ["sh", "-c", TRACKERS_SCRIPT, "sh", TRACKERS_LINE, path,
                                         str(cap)], timeout=60,
                              step="tensorboard: find the logdir")
    if res.rc == 1:
        raise no_event_files(tgt.label, job, "it said nothing about trackers")
    if res.rc != 0:
        raise RemoteCommandFailed(f"{tgt.label}: cannot read job {job}'s events "
                                  f"(grep rc {res.rc}: {res.stderr_tail(1)})", argv=res.argv, rc=res.rc)
    try:
        logdir = announced_logdir(res.stdout[:cap].decode("utf-8", "replace"))
    except ValueError as exc:
        raise ConfigError(f"{tgt.label}: job {job}: {exc}; not pulled",
                          hint="the trainer's --report-to tensorboard writes <out-dir>/tensorboard") from None
    if logdir is None:
        raise no_event_files(tgt.label, job, "its trackers do not include tensorboard")
    return Source(job, st["state"], wire.JobState(st["state"]) in wire.TERMINAL_STATES, logdir,
                  local)


def checked_job_id(label: str, job: object) -> str:
    """The job id a reply named, when it is one the agent makes
    (:data:`wire.JOB_ID_PATTERN`): it becomes a local directory's name.

    Raises:
        ReplyShapeError: anything else (``../../.ssh``, a slash, a NUL byte, 10,000 chars).
    """
    if not isinstance(job, str) or not re.fullmatch(wire.JOB_ID_PATTERN, job):
        raise ReplyShapeError(f"{label}: status: the agent named job {str(job)[:80]!r}, which is "
                              "no job id; nothing written here",
                              hint="the container's agent answers something opsctl never "
                                   "writes: check that container")
    return job


def local_copy_dir(host_label: str, ctid: int, job: str) -> Path:
    """``<opsctl home>/tensorboard/<host>-ct<ct>/<job>``, checked to stay below
    ``<opsctl home>/tensorboard`` (with ``..`` and links resolved) whatever the names hold.

    Raises:
        ReplyShapeError: it would not.
    """
    base = paths.home() / "tensorboard"
    local = base / f"{_safe(host_label)}-ct{ctid}" / job
    resolved, root = os.path.realpath(local), os.path.realpath(base)
    if os.path.dirname(os.path.dirname(resolved)) != root:
        raise ReplyShapeError(f"the TensorBoard copy of job {job[:80]!r} would be {resolved!r}, "
                              f"outside {root}; nothing written", hint="check that container's "
                                                                       "agent, and the links under "
                                                                       f"{base}")
    return local


def announced_logdir(text: str) -> str | None:
    """The TensorBoard logdir of the last ``trackers`` event among ``text``'s lines (None: no
    event names one). The job's output is untrusted: only what the trainer writes is taken,
    an absolute, normalised path ending in ``/tensorboard`` (never ``/`` or ``/etc``).

    Raises:
        ValueError: the last event names another kind of path.
    """
    logdir: str | None = None
    for line in text.splitlines():
        ev = wire.parse_event(line)
        if ev is not None and ev.get("event") == wire.EVENT_TRACKERS:
            value = ev.get("tensorboard")
            logdir = value if isinstance(value, str) else None
    if logdir is None:
        return None
    if (not logdir.startswith("/") or posixpath.normpath(logdir) != logdir
            or posixpath.basename(logdir) != "tensorboard" or any(c in logdir for c in "\0\n\r")):
        raise ValueError(f"its trackers event names {logdir[:200]!r} as the TensorBoard logdir, "
                         "not an absolute <dir>/tensorboard")
    return logdir


def _safe(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return safe if safe.strip(".") else "host"


#: Says what the announced logdir is in the container without following it: a symlink named
#: ``tensorboard`` could point the pull at ``/`` or a home; a link inside it would be copied
#: as a link and followed by the local TensorBoard (one to ``/`` walks this whole machine).
LOOK = r"""
import json, os, stat, sys
path = sys.argv[1]
try:
    mode = os.lstat(path).st_mode
except FileNotFoundError:
    kind = "missing"
else:
    kind = "link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else "other"
inner = None
if kind == "dir":
    for top, dirs, files in os.walk(path):
        inner = next((os.path.join(top, n) for n in dirs + files
                      if os.path.islink(os.path.join(top, n))), None)
        if inner:
            break
print(json.dumps({"kind": kind, "real": os.path.realpath(path), "inner_link": inner}))
"""


def check_remote_logdir(tgt: Target, src: Source) -> None:
    """The logdir is a directory in the container, not a link, holding no link, and its real
    path is a ``<dir>/tensorboard`` too (a parent may be a link: a mounted volume).

    Raises:
        ConfigError: it is a link or not a directory (nothing is pulled).
        RemoteCommandFailed: it could not be looked at.
    """
    res = tgt.remote.pct_exec(tgt.ctid, ["python3", "-c", LOOK, src.remote_dir], timeout=60,
                              step="tensorboard: look at the logdir")
    if res.rc != 0:
        raise RemoteCommandFailed(f"{tgt.label}: cannot look at {src.remote_dir} in the container "
                                  f"(rc {res.rc}: {res.stderr_tail(1)})", argv=res.argv, rc=res.rc)
    look: LogdirLookDoc = shapes.parse_doc(LogdirLookDoc, res.stdout,
                                           where=f"{tgt.label}: tensorboard: look at the logdir")
    kind, real = look["kind"], look["real"]
    if kind == "missing":
        return  # the pull names it
    if kind != "dir" or posixpath.basename(real) != "tensorboard":
        what = "a link to " + repr(real[:200]) if kind == "link" else f"not a directory ({kind})"
        raise ConfigError(f"{tgt.label}: job {src.job_id}'s TensorBoard logdir {src.remote_dir} is "
                          f"{what}; not pulled",
                          hint="the trainer's --report-to tensorboard writes event files in a "
                               "directory <out-dir>/tensorboard; pull other paths with opsctl pull")
    inner = look["inner_link"]
    if inner:
        raise ConfigError(f"{tgt.label}: job {src.job_id}'s TensorBoard logdir {src.remote_dir} holds "
                          f"a symbolic link ({str(inner)[:200]!r}); not pulled",
                          hint="the trainer's event files are plain files; remove the link in the "
                               "container, or pull the files with opsctl pull")


def check_local_dir(local: Path) -> None:
    """No part of the copy's path below the opsctl home is a link (a pull through one would
    write elsewhere).

    Raises:
        ConfigError: one is.
    """
    base = paths.home() / "tensorboard"
    parts = [base, *(base / p for p in itertools.accumulate(
        local.relative_to(base).parts, lambda a, b: str(Path(a) / b)))]
    for part in parts:
        if part.is_symlink():
            raise ConfigError(f"{part} is a symbolic link; the TensorBoard copy is not written "
                              "through it", hint=f"remove the link (or move it) and run again; "
                                                 f"the copy belongs under {base}")


def make_local_dir(local: Path) -> None:
    """Raises ConfigError when the copy's directory cannot be made (a file in its place, a
    read-only or full disk)."""
    try:
        local.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make {local} for the TensorBoard copy: {exc.strerror or exc}",
                          hint="free that path (or the disk), or set OPSCTL_HOME elsewhere") from None


def refresh(tgt: Target, src: Source) -> files.TransferReport:
    """Bring the copy up to date (only what changed travels; nothing here is deleted).

    Raises:
        ConfigError: the logdir the job announced does not exist (its tracker failed), is a
            link or not a directory in the container; a part of the copy's path is a link here.
        RemoteCommandFailed, TransportError and kin: as :func:`files.pull`.
    """
    check_local_dir(src.local_dir)
    check_remote_logdir(tgt, src)
    make_local_dir(src.local_dir)
    try:
        return files.pull(tgt, src.remote_dir, src.local_dir,
                          max_bytes=limits.cap("PULLED_EVENT_BYTES"))
    except RemoteCommandFailed as exc:
        if "does not exist" in exc.message:
            raise no_event_files(tgt.label, src.job_id, f"{src.remote_dir} does not exist in the "
                                 "container: see the job's warning events") from None
        raise


def has_event_files(local: Path) -> bool:
    return any(p.name.startswith("events.out.tfevents.") for p in local.rglob("*") if p.is_file())


def check_installed() -> None:
    """Raises ConfigError when this machine has no TensorBoard to serve with."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("tensorboard is not installed on this machine",
                          hint="pip install 'opsctl[trackers]' (or pip install tensorboard)")


def check_port(port: int) -> int:
    """``port`` if 127.0.0.1 has it free (0: a free one).

    Raises:
        ConfigError: it is taken.
    """
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ConfigError(f"127.0.0.1:{port} is in use",
                              hint="pass another --port, or --port 0 for any free one") from None
        return int(s.getsockname()[1])


class Server:
    """The local TensorBoard process; a context manager that always ends it."""

    def __init__(self, logdir: Path, port: int):
        self.logdir, self.port = logdir, port
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - read back on failure, closed in stop
        argv = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "5"]
        try:
            self.group = procgroup.Group(argv, stdout=self.log.fileno(), stderr=self.log.fileno(),
                                         die_with_parent=True)
        except OSError as exc:  # no process or file left to start it with
            self.log.close()
            raise ConfigError(f"cannot start tensorboard here: {exc.strerror or exc}",
                              hint="free processes or open files on this machine, then retry") from None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def wait_ready(self, timeout: float = READY_S) -> None:
        """Raises ConfigError (with TensorBoard's own last words) if it never answers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.group.poll() is not None:
                raise ConfigError(f"tensorboard exited with {self.group.returncode} before serving: "
                                  f"{self.tail()}")
            try:
                with urllib.request.urlopen(self.url, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise ConfigError(f"tensorboard did not answer on {self.url} within {timeout:g} s: "
                          f"{self.tail()}")

    def tail(self) -> str:
        """Its last line of output (read from the last 64 KiB only), cut for one line."""
        size = self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, size - (64 << 10)))
        lines = self.log.read().decode("utf-8", "replace").strip().splitlines()
        return limits.cut_line(lines[-1]) if lines else "(no output)"

    def check_alive(self) -> None:
        """Raises ServerDied (its exit status and last line) once the server has ended."""
        if self.group.poll() is not None:
            raise ServerDied(f"tensorboard on {self.url} exited with {self.group.returncode} "
                             f"while serving: {self.tail()}",
                             hint="run opsctl tensorboard again (its copy of the event files "
                                  "is kept)")

    def stop(self) -> None:
        """End its whole tree: SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`."""
        try:
            self.group.end(grace=STOP_GRACE_S)
        finally:
            self.log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: How often the serving loop looks at the server between refreshes.
ALIVE_POLL_S = 1.0


class ServerDied(ConfigError):
    """The local TensorBoard server ended while it served; the session ends with it."""


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: handled wherever Ctrl-C is (a pull's children are stopped,
    the command ends with the interrupted exit code, or, while serving, with the server
    ended)."""


class _Signals:
    """SIGINT, SIGTERM and SIGHUP while a TensorBoard session runs (:func:`stop_on_signals`).

    The first one counts, the rest are ignored, so the cleanup runs to its end. Until
    :meth:`arm` it is only noted: a signal that lands while the server process is being
    started (the process exists, the object that ends it does not yet) would leave it
    running; :meth:`arm`, called once the server is owned, raises the noted one then."""

    def __init__(self, armed: bool) -> None:
        self.fired: list[int] = []
        self.armed = armed

    def handler(self, signum: int, _frame: t.Any) -> None:
        if self.fired:
            return
        self.fired.append(signum)
        if self.armed:
            self._raise(signum)

    def arm(self) -> None:
        self.armed = True
        if self.fired:
            self._raise(self.fired[0])

    @staticmethod
    def _raise(signum: int) -> t.NoReturn:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_on_signals(*, armed: bool = True) -> t.Iterator[_Signals]:
    """SIGTERM and SIGHUP end the session like Ctrl-C does (the server is ended on the way);
    ``armed=False``: only once :meth:`_Signals.arm` is called (see :class:`_Signals`)."""
    signals = _Signals(armed)
    old = {s: signal.signal(s, signals.handler)
           for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield signals
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def serve(tgt: Target, src: Source, port: int, refresh_s: float,
          on_ready: t.Callable[[str], None], on_notice: t.Callable[[str], None],
          sleep: t.Callable[[float], None] = time.sleep) -> None:
    """Pull, serve, keep the copy fresh while the job lives; returns on Ctrl-C/SIGTERM/SIGHUP
    with the server ended.

    Raises:
        ConfigError: the job has no event files, TensorBoard is missing here or never answers,
            the port is taken.
        RemoteCommandFailed, TransportError and kin: the first pull failed.
    """
    check_installed()
    port = check_port(port)
    refresh(tgt, src)
    if not has_event_files(src.local_dir):
        raise no_event_files(tgt.label, src.job_id, f"{src.remote_dir} holds none yet")
    terminal = src.terminal
    with stop_on_signals(armed=False) as signals:
        try:
            with Server(src.local_dir, port) as server:
                signals.arm()  # from here the server is ours to end
                server.wait_ready()
                on_ready(server.url)
                next_refresh = time.monotonic() + refresh_s
                while True:
                    sleep(ALIVE_POLL_S)
                    server.check_alive()
                    if terminal or refresh_s <= 0 or time.monotonic() < next_refresh:
                        continue
                    try:
                        refresh(tgt, src)
                        state = watch.fetch_status(tgt.agent, src.job_id, lines=0)["state"]
                        terminal = wire.JobState(state) in wire.TERMINAL_STATES
                    except (OpsctlError, OSError) as exc:  # a lost connection: try again next time
                        on_notice(f"refresh failed ({exc}); the curves shown stay as they were")
                    next_refresh = time.monotonic() + refresh_s
        except (KeyboardInterrupt, Stopped):
            return
