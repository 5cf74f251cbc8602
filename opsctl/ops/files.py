"""``opsctl push`` / ``opsctl pull``: files between this machine and a container.

Paths: DEST (push) or SRC (pull) in the container is absolute, or relative to the container's
data directory ``<root>/data`` (``/opt/opsctl/data`` with the default ``root:``), next to the
agent's ``jobs/`` and ``payloads/``. A push without DEST lands at ``<root>/data/<name of
SRC>``; a pull without DEST lands at ``./<name of SRC>``. DEST is the path of the copy (a
directory's contents go *into* DEST, as ``rsync SRC/ DEST``), not a directory to put it in.

The rules that keep a transfer from destroying data (``--delete`` never in ``/``, a system
directory, a home or the current directory; a pull's implied DEST; a relative path that
leaves ``<root>/data``) are in :mod:`opsctl.ops.filepaths`. A ``--delete`` transfer first
plans (what it would send and remove), lets the caller approve that plan, and then deletes at
most that many (a tar pull: only the names approved). A file that changes while it is sent
is sent once more, then the transfer fails (:class:`~opsctl.errors.SourceChanged`); it is
never reported as a success.

Method: rsync when the container has it (``--partial``, delta transfer, checked by rsync),
else the tar stream of :mod:`opsctl.remote.tarcopy` (sha256 per file, file-level resume).
``--method`` or ``$OPSCTL_FILES_METHOD`` forces one (``auto`` | ``rsync`` | ``tar``).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import time
import typing as t
from dataclasses import asdict, dataclass
from pathlib import Path

from opsctl.config import paths
from opsctl.errors import (
    ConfigError,
    EntriesRefused,
    LocalWriteError,
    RemoteCommandFailed,
    SourceChanged,
)
from opsctl.ops import filepaths
from opsctl.ops.jobs import Target
from opsctl.remote import receiver, rsync, shapes, tarcopy
from opsctl.remote.transfer import PROBE, Progress, TransferStats
from opsctl.state import pulled
from remote_payload import safe_write, tarsync
from remote_payload.wire_shapes import TransferProbeDoc

if t.TYPE_CHECKING:  # not at run time: a push should not pay for the playbook models
    from opsctl.config.playbook import Playbook

METHODS = ("auto", "rsync", "tar")
METHOD_ENV = "OPSCTL_FILES_METHOD"


@dataclass(frozen=True)
class TransferReport:
    direction: str  # "push" | "pull"
    target: str
    src: str
    dest: str
    method: str
    files: int
    bytes: int
    total_bytes: int
    matched_bytes: int
    deleted: int
    seconds: float

    def to_dict(self) -> dict[str, t.Any]:
        return asdict(self)


@dataclass(frozen=True)
class TransferPlan:
    """What a transfer would do (``--dry-run``), and what a ``--delete`` is asked to approve.
    Names are relative to ``dest`` ("" is ``dest`` itself)."""

    direction: str  # "push" | "pull"
    target: str
    src: str
    dest: str
    send: list[str]
    delete: list[str]
    dry_run: bool = True  # in the --json document: a plan, nothing was sent

    def to_dict(self) -> dict[str, t.Any]:
        return asdict(self)


#: Called with the plan of a ``--delete`` transfer before anything is sent; raises to stop it.
Approve = t.Callable[[TransferPlan], None]


def container_path(tgt: Target, path: str) -> str:
    """An absolute container path; a relative one is under ``<root>/data`` (and stays there).

    Raises:
        ConfigError: a relative path whose ``..`` leaves ``<root>/data``, or an empty one.
    """
    return filepaths.container_path(tgt.host.root, path)


def resolve_method(method: str | None) -> str:
    chosen = method or os.environ.get(METHOD_ENV) or "auto"
    if chosen not in METHODS:
        raise ConfigError(f"transfer method {chosen!r} (from {METHOD_ENV if not method else '--method'})"
                          f" is not one of {', '.join(METHODS)}")
    return chosen


def _probe(tgt: Target, path: str, direction: str, mode: str | None = None) -> TransferProbeDoc:
    """What :data:`PROBE` says of ``path`` in the container, checked.

    Raises:
        RemoteCommandFailed: the probe failed.
        ReplyShapeError: it answered something that is not a :class:`TransferProbeDoc`.
    """
    res = tgt.remote.pct_exec(tgt.ctid, ["python3", "-c", PROBE, path, mode or direction], timeout=60,
                              step=f"{direction}: probe")
    if res.rc != 0:
        raise RemoteCommandFailed(f"{tgt.label}: {direction}: cannot inspect {path!r} in the "
                                  f"container (rc={res.rc}): {res.stderr_tail(2)}",
                                  argv=["python3", "-c", "<probe>", path], rc=res.rc)
    return t.cast(TransferProbeDoc, shapes.parse_doc(TransferProbeDoc, res.stdout,
                                                     where=f"{tgt.label}: {direction}: probe"))


def _pick(tgt: Target, method: str, remote_rsync: str | None) -> str:
    if method == "auto":
        return "rsync" if remote_rsync and shutil.which("rsync") else "tar"
    if method == "rsync" and not remote_rsync:
        raise ConfigError(f"{tgt.label}: --method rsync, but the container has no rsync",
                          hint=f"install it there (opsctl exec {' '.join(tgt.flags)} -- "
                               "apt-get install -y rsync) or use --method tar")
    if method == "rsync" and not shutil.which("rsync"):
        raise ConfigError("--method rsync, but this machine has no rsync (apt-get install rsync)")
    return method


def _local_source(src: str | Path) -> Path:
    local = Path(src).expanduser()
    if not (local.is_file() or local.is_dir()):
        raise ConfigError(f"push: {str(src)!r} is not a file or directory here")
    return local.resolve()


def local_listing(tgt: Target, local: Path) -> dict[str, t.Any]:
    """:func:`tarsync.listing` of a push's source, or one line naming why it cannot be sent
    (a tree deeper than ``limits.TREE_DEPTH``, an unsafe name).

    Raises:
        ConfigError: the source cannot be listed as a copy.
    """
    try:
        return tarsync.listing(str(local), sums=True)
    except tarsync.Refused as exc:
        raise ConfigError(f"{tgt.label}: push: {str(local)!r} cannot be sent: {exc}; nothing "
                          "sent", hint="send a shallower tree (or its parts one by one)") from None
    except OSError as exc:
        raise ConfigError(f"{tgt.label}: push: cannot read {str(local)!r}: "
                          f"{exc.strerror or exc}; nothing sent") from None


def local_stats(tgt: Target, local: Path) -> dict[str, t.Any]:
    """:func:`tarsync.stats` of a push's source, or one line naming why it cannot be sent.

    Raises:
        ConfigError: as :func:`local_listing`.
    """
    try:
        return tarsync.stats(str(local))
    except tarsync.Refused as exc:
        raise ConfigError(f"{tgt.label}: push: {str(local)!r} cannot be sent: {exc}; nothing "
                          "sent", hint="send a shallower tree (or its parts one by one)") from None


def plan_push(tgt: Target, src: str | Path, dest: str | None = None, *,
              delete: bool = False) -> TransferPlan:
    """What :func:`push` would send and (with ``delete``) remove; changes nothing anywhere.

    Raises:
        DeleteRefused: ``delete`` aimed at a protected container path.
        ConfigError, RemoteCommandFailed and kin: as :func:`push`.
    """
    local = _local_source(src)
    remote_dest = container_path(tgt, dest if dest else local.name)
    look = _probe(tgt, remote_dest, "push", mode="look")
    if delete:
        protected = filepaths.remote_protected(tgt.host.root, look["homes"])
        own = [(tgt.host.root, posixpath.join(tgt.host.root, filepaths.DATA_DIR))]
        for path in sorted({remote_dest, posixpath.normpath(str(look["real"]))}):
            filepaths.check_delete(f"{tgt.label}: container path", path, protected, own)
    planned = tarcopy.remote_plan(tgt.remote, tgt.ctid, local_listing(tgt, local), remote_dest)
    return TransferPlan("push", tgt.label, str(local), remote_dest, planned["send"],
                        planned["delete"] if delete else [])


def push(tgt: Target, src: str | Path, dest: str | None = None, *, delete: bool = False,
         method: str | None = None, on_progress: Progress | None = None,
         bwlimit_kib: int | None = None, approve: Approve | None = None) -> TransferReport:
    """Copy local ``src`` to the container so that it *is* ``dest`` afterwards.

    With ``delete``: the destination is checked (:mod:`filepaths`), the transfer planned,
    ``approve(plan)`` called, and at most the planned number of entries removed.

    Raises:
        ConfigError: ``src`` missing or not a file/directory, unknown method, a relative
            ``dest`` that leaves ``<root>/data``.
        DeleteRefused: ``delete`` aimed at a protected container path (nothing sent).
        SourceChanged: a file changed while it was sent, twice.
        RemoteCommandFailed: the transfer failed (run it again to resume).
        TransportError, ContainerError and kin: as the connection or container did.
    """
    start = time.monotonic()
    local = _local_source(src)
    remote_dest = container_path(tgt, dest if dest else local.name)
    chosen = resolve_method(method)
    max_delete = None
    if delete:
        plan = plan_push(tgt, local, remote_dest, delete=True)
        if approve is not None:
            approve(plan)
        max_delete = len(plan.delete)
    stats: TransferStats | None = None
    if chosen == "rsync" and not shutil.which("rsync"):
        raise ConfigError("--method rsync, but this machine has no rsync (apt-get install rsync)")
    if chosen != "tar" and shutil.which("rsync"):
        # rsync first, no probe: an unchanged re-push is one SSH connection. Only when it
        # fails, the probe says why (typed container errors) or that rsync is missing there.
        source = f"{local}/" if local.is_dir() else str(local)

        def send() -> TransferStats:
            return rsync.run(tgt.host, tgt.ctid, source, rsync.remote_spec(tgt.host, remote_dest),
                             delete=delete, step="push", on_progress=on_progress,
                             bwlimit_kib=bwlimit_kib, max_delete=max_delete,
                             make_dir=posixpath.dirname(remote_dest.rstrip("/")) or "/")
        try:
            stats = _until_stable(tgt, "push", remote_dest, send,
                                  lambda: local_stats(tgt, local))
        except SourceChanged:
            raise
        except RemoteCommandFailed:
            if _pick(tgt, chosen, _probe(tgt, remote_dest, "push")["rsync"]) == "rsync":
                raise
    if stats is None:
        stats = tarcopy.push(tgt.remote, tgt.ctid, local, remote_dest, delete=delete,
                             on_progress=on_progress, bwlimit_kib=bwlimit_kib,
                             max_delete=max_delete)
    return _report("push", tgt, str(local), remote_dest, stats, start)


def _until_stable(tgt: Target, step: str, dest: str, send: t.Callable[[], TransferStats],
                  snapshot: t.Callable[[], dict[str, t.Any]]) -> TransferStats:
    """rsync with the source's files stat'ed before and after: rsync checks what it *read*,
    so a file written meanwhile arrives torn with rsync's blessing. A change re-sends (rsync
    then sends the changed files again); a change during the re-send fails.

    Raises:
        SourceChanged: files changed during both runs.
    """
    before = snapshot()
    stats = send()
    after = snapshot()
    if not tarsync.changed(before, after):
        return stats
    again = send()
    moved = tarsync.changed(after, snapshot())
    if moved:
        raise tarcopy.torn_error(tgt.label, step, dest, moved, "rsync")
    return TransferStats(stats.method, stats.files + again.files, stats.bytes + again.bytes,
                         again.total_bytes, stats.matched_bytes + again.matched_bytes,
                         stats.deleted + again.deleted, again.refused)


def _pull_dest(remote_src: str, dest: str | Path | None) -> Path:
    """DEST as given, else ``./<basename of SRC>`` (never the current directory itself).

    Raises:
        LocalWriteError: DEST given but empty (an unset variable in a script; the current
            directory is never meant).
    """
    if dest is not None and not str(dest).strip():
        raise LocalWriteError("pull: DEST is empty (it would be the current directory); "
                              "nothing fetched", path="", hint="name a directory for the copy, "
                                                                "or leave DEST out for ./<name>")
    return (Path(dest).expanduser() if dest else
            Path(filepaths.implied_pull_dest(remote_src))).absolute()


def plan_pull(tgt: Target, src: str, dest: str | Path | None = None, *,
              delete: bool = False) -> TransferPlan:
    """What :func:`pull` would fetch and (with ``delete``) remove here; changes nothing.

    Raises:
        DeleteRefused: ``delete`` aimed at a protected local path.
        ConfigError, RemoteCommandFailed and kin: as :func:`pull`.
    """
    remote_src = container_path(tgt, src)
    local = _pull_dest(remote_src, dest)
    if delete:
        _check_local_delete(local)
    doc = tarcopy.remote_listing(tgt.remote, tgt.ctid, remote_src)
    if doc["root"] not in ("file", "dir"):
        raise _not_there(tgt, remote_src, doc["root"])
    try:
        planned = tarsync.plan(str(local), doc)
    except tarsync.Refused as exc:
        raise EntriesRefused(f"{tgt.label}: pull: {str(local)!r}: {exc}; nothing fetched",
                             hint="name another DEST, or remove the deep tree there") from None
    return TransferPlan("pull", tgt.label, remote_src, str(local), planned["send"],
                        planned["delete"] if delete else [])


def check_pull_dest(local: Path, *, force: bool = False) -> None:
    """Refuse a local DEST a pull may not write: the current directory, a home, ``/`` or a
    top-level directory (even with ``force``), a link, or an existing non-empty path that no
    earlier pull wrote (:mod:`opsctl.state.pulled`) unless ``force``.

    Raises:
        LocalWriteError: the rule and the path; nothing was fetched.
    """
    why = safe_write.protected_refusal(str(local))
    if why is not None:
        raise LocalWriteError(f"pull: DEST {str(local)!r} refused: {why}; nothing fetched",
                              path=str(local), hint="name a new directory for the copy as DEST")
    try:
        st = os.lstat(local)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LocalWriteError.of(safe_write.failure(local, exc)) from None
    if os.path.islink(local):
        raise LocalWriteError(f"pull: DEST {str(local)!r} is a symbolic link; not followed, "
                              "nothing fetched", path=str(local),
                              hint="name the real path as DEST, or remove the link")
    try:
        empty = os.path.isdir(local) and not os.listdir(local)
    except OSError:
        empty = False
    if not (force or empty or (st.st_size == 0 and os.path.isfile(local))
            or pulled.was_pulled(local)):
        raise LocalWriteError(f"pull: DEST {str(local)!r} exists and no pull wrote it; "
                              "nothing fetched (its files would be overwritten)",
                              path=str(local), hint="pass --force to pull over it, or name "
                                                    "another DEST")


def _check_local_delete(local: Path) -> None:
    protected = filepaths.local_protected()
    home = paths.home()
    protected.setdefault(posixpath.normpath(str(home.absolute())), "opsctl's home")
    own = [(p, None) for p in {posixpath.normpath(str(home.absolute())), str(home.resolve())}]
    for path in filepaths.local_delete_target(local):
        filepaths.check_delete("local path", path, protected, own)


def _not_there(tgt: Target, remote_src: str, kind: str) -> RemoteCommandFailed:
    what = "does not exist" if kind == "missing" else "is not a file or directory"
    return RemoteCommandFailed(f"{tgt.label}: pull: {remote_src!r} {what} in the container",
                               argv=[remote_src])


def pull(tgt: Target, src: str, dest: str | Path | None = None, *, delete: bool = False,
         method: str | None = None, on_progress: Progress | None = None,
         bwlimit_kib: int | None = None, approve: Approve | None = None,
         force: bool = False, max_bytes: int | None = None) -> TransferReport:
    """Copy container ``src`` here so that it *is* ``dest`` afterwards (default ./<name>).
    Files of the same size and mtime are compared by content (rsync ``--checksum``, the tar
    stream's sha256), never kept on size and mtime alone.

    What arrives obeys :mod:`opsctl.remote.receiver` on both methods: nothing outside DEST,
    no link leaving it, no device or FIFO, no setuid/setgid/sticky bit, the umask applied;
    ``max_bytes`` caps the file data of the copy.

    Raises:
        ConfigError: SRC is ``/`` without DEST, a relative SRC leaves ``<root>/data``.
        LocalWriteError: DEST refused (:func:`check_pull_dest`; ``force`` for one no pull
            wrote) or this machine's disk said no.
        DeleteRefused: ``delete`` aimed at a protected local path (nothing fetched).
        SourceChanged: a file changed in the container while it was sent, twice.
        EntriesRefused: the source held entries not created here (named; the rest arrived),
            or more than ``max_bytes``.
        RemoteCommandFailed: ``src`` does not exist in the container, or the transfer failed.
        TransportError, ContainerError and kin: as :func:`push`.
    """
    start = time.monotonic()
    start_ns = time.time_ns()
    remote_src = container_path(tgt, src)
    local = _pull_dest(remote_src, dest)
    chosen = resolve_method(method)
    max_delete = None
    confirmed: list[str] | None = None
    if delete:
        _check_local_delete(local)
    check_pull_dest(local, force=force)
    if delete:
        plan = plan_pull(tgt, remote_src, local, delete=True)
        if approve is not None:
            approve(plan)
        max_delete, confirmed = len(plan.delete), plan.delete
    probe = _probe(tgt, remote_src, "pull")
    if probe["kind"] not in ("file", "dir"):
        raise _not_there(tgt, remote_src, probe["kind"])
    chosen = _pick(tgt, chosen, probe["rsync"])
    try:
        local.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LocalWriteError.of(safe_write.failure(local, exc)) from None
    if chosen == "rsync":
        source = remote_src + ("/" if probe["kind"] == "dir" else "")

        def send() -> TransferStats:
            return rsync.run(tgt.host, tgt.ctid, rsync.remote_spec(tgt.host, source), str(local),
                             delete=delete, step="pull", on_progress=on_progress,
                             bwlimit_kib=bwlimit_kib, max_delete=max_delete,
                             receiving_here=True, max_size=max_bytes)
        try:
            stats = _until_stable(tgt, "pull", str(local), send,
                                  lambda: tarcopy.remote_stats(tgt.remote, tgt.ctid, remote_src))
        finally:  # a failed pull's partial copy too: checked, and this pull's to continue
            found = _confine(tgt, local, start_ns)
            if os.path.lexists(local):
                pulled.remember(local)
        _check_received(tgt, stats.refused, found, max_bytes)
    else:
        try:
            stats = tarcopy.pull(tgt.remote, tgt.ctid, remote_src, local, delete=delete,
                                 on_progress=on_progress, bwlimit_kib=bwlimit_kib,
                                 max_delete=max_delete, max_bytes=max_bytes,
                                 confirmed=confirmed)
        finally:
            if os.path.lexists(local):
                pulled.remember(local)
    return _report("pull", tgt, remote_src, str(local), stats, start)


def _confine(tgt: Target, local: Path, start_ns: int) -> receiver.Confined:
    """rsync's local result checked against the receiver's rules (module docstring of
    :mod:`opsctl.remote.receiver`).

    Raises:
        LocalWriteError: the copy could not be read back.
        EntriesRefused: the copy is deeper than ``limits.TREE_DEPTH`` levels.
    """
    try:
        return receiver.confine(local, since_ns=start_ns)
    except receiver.ReceiveRefused as exc:
        raise EntriesRefused(f"{tgt.label}: pull: the copy at {str(local)!r} was refused: {exc}",
                             hint="remove that copy, and the levels below the cap from the "
                                  "container's tree") from None
    except OSError as exc:
        raise LocalWriteError(f"{tgt.label}: pull: cannot check the copy at {str(local)!r}: "
                              f"{exc.strerror or exc}", path=str(local)) from None


def _check_received(tgt: Target, skipped: t.Sequence[receiver.Refusal],
                    found: receiver.Confined, max_bytes: int | None) -> None:
    """Raises EntriesRefused naming what rsync skipped and what the check removed, or when
    the copy holds more than ``max_bytes``."""
    if max_bytes is not None and found.bytes > max_bytes:
        raise EntriesRefused(f"{tgt.label}: pull: the copy holds {found.bytes} bytes of files, "
                             f"more than its cap of {max_bytes}",
                             hint="remove what is not needed from the container's tree")
    tarcopy.refused_error(tgt.label, [*skipped, *found.refused])


def _report(direction: str, tgt: Target, src: str, dest: str, stats: TransferStats,
            start: float) -> TransferReport:
    return TransferReport(direction, tgt.label, src, dest, stats.method, stats.files, stats.bytes,
                          stats.total_bytes, stats.matched_bytes, stats.deleted,
                          round(time.monotonic() - start, 3))


def push_playbook_files(tgt: Target, book: Playbook, *, method: str | None = None,
                        on_progress: Progress | None = None) -> list[TransferReport]:
    """The playbook's ``files:`` (deploy runs this before launch; only changes travel)."""
    return [push(tgt, f.src, f.dest, method=method, on_progress=on_progress) for f in book.files]


def output_dests(root: str, outputs: t.Sequence[str]) -> dict[str, str]:
    """Each output's container path -> its local ``./<name>``.

    Two outputs with one name are refused, naming both, before anything is fetched: renaming
    one (``out-2``) would put it where nobody looks for it, and fetching both into one
    ``./out`` made the second look "already there" and never arrive.

    Raises:
        ConfigError: two outputs share a name, or an output has no name (``/``).
    """
    seen: dict[str, str] = {}
    for out in outputs:
        src = filepaths.container_path(root, out)
        name = filepaths.implied_pull_dest(src)
        if name in seen and seen[name] != src:
            raise ConfigError(f"pull: outputs {seen[name]!r} and {src!r} would both land in "
                              f"./{name}; nothing fetched",
                              hint=f"pull each with its own DEST: opsctl pull {src} DIR")
        seen[name] = src
    return {src: name for name, src in seen.items()}


def pull_playbook_outputs(tgt: Target, book: Playbook, *, method: str | None = None,
                          on_progress: Progress | None = None,
                          force: bool = False) -> list[TransferReport]:
    """The playbook's ``outputs:``, each to ``./<its name>``.

    Raises:
        ConfigError: the playbook lists no outputs, or two of them share a name.
    """
    if not book.outputs:
        raise ConfigError(f"pull: no SRC given and playbook {book.name!r} lists no outputs:",
                          hint="pass SRC, or add `outputs: [path, ...]` to the playbook")
    dests = output_dests(tgt.host.root, book.outputs)
    return [pull(tgt, src, name, method=method, on_progress=on_progress, force=force)
            for src, name in dests.items()]
