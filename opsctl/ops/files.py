"""``opsctl push`` / ``opsctl pull``: files between this machine and a container.

Paths: DEST (push) or SRC (pull) in the container is absolute, or relative to the container's
data directory ``<root>/data`` (``/opt/opsctl/data`` with the default ``root:``), next to the
agent's ``jobs/`` and ``payloads/``. A push without DEST lands at ``<root>/data/<name of
SRC>``; a pull without DEST lands at ``./<name of SRC>``. DEST is the path of the copy (a
directory's contents go *into* DEST, as ``rsync SRC/ DEST``), not a directory to put it in.

Method: rsync when the container has it (``--partial``, delta transfer, checked by rsync),
else the tar stream of :mod:`opsctl.remote.tarcopy` (sha256 per file, file-level resume).
``--method`` or ``$OPSCTL_FILES_METHOD`` forces one (``auto`` | ``rsync`` | ``tar``).
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import time
import typing as t
from dataclasses import asdict, dataclass
from pathlib import Path

from opsctl.errors import ConfigError, RemoteCommandFailed
from opsctl.ops.jobs import Target
from opsctl.remote import rsync, tarcopy
from opsctl.remote.transfer import PROBE, Progress, TransferStats

if t.TYPE_CHECKING:  # not at run time: a push should not pay for the playbook models
    from opsctl.config.playbook import Playbook

DATA_DIR = "data"  # under the host's `root:` in the container
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
        return {"ok": True, **asdict(self)}


def container_path(tgt: Target, path: str) -> str:
    """An absolute container path; a relative one is under ``<root>/data``."""
    return posixpath.normpath(path if path.startswith("/")
                              else posixpath.join(tgt.host.root, DATA_DIR, path))


def resolve_method(method: str | None) -> str:
    chosen = method or os.environ.get(METHOD_ENV) or "auto"
    if chosen not in METHODS:
        raise ConfigError(f"transfer method {chosen!r} (from {METHOD_ENV if not method else '--method'})"
                          f" is not one of {', '.join(METHODS)}")
    return chosen


def _probe(tgt: Target, path: str, direction: str) -> dict[str, t.Any]:
    res = tgt.remote.pct_exec(tgt.ctid, ["python3", "-c", PROBE, path, direction], timeout=60,
                              step=f"{direction}: probe")
    if res.rc != 0:
        raise RemoteCommandFailed(f"{tgt.label}: {direction}: cannot inspect {path!r} in the "
                                  f"container (rc={res.rc}): {res.stderr_tail(2)}",
                                  argv=["python3", "-c", "<probe>", path], rc=res.rc)
    return t.cast(dict[str, t.Any], json.loads(res.stdout))


def _pick(tgt: Target, method: str, remote_rsync: str | None) -> str:
    if method == "auto":
        return "rsync" if remote_rsync and shutil.which("rsync") else "tar"
    if method == "rsync" and not remote_rsync:
        raise ConfigError(f"{tgt.label}: --method rsync, but the container has no rsync",
                          hint=f"install it there (opsctl exec --host {tgt.host.label} --ct "
                               f"{tgt.ctid} -- apt-get install -y rsync) or use --method tar")
    if method == "rsync" and not shutil.which("rsync"):
        raise ConfigError("--method rsync, but this machine has no rsync (apt-get install rsync)")
    return method


def push(tgt: Target, src: str | Path, dest: str | None = None, *, delete: bool = False,
         method: str | None = None, on_progress: Progress | None = None,
         bwlimit_kib: int | None = None) -> TransferReport:
    """Copy local ``src`` to the container so that it *is* ``dest`` afterwards.

    Raises:
        ConfigError: ``src`` missing or not a file/directory, unknown method.
        RemoteCommandFailed: the transfer failed (run it again to resume).
        TransportError, ContainerError and kin: as the connection or container did.
    """
    start = time.monotonic()
    local = Path(src).expanduser()
    if not (local.is_file() or local.is_dir()):
        raise ConfigError(f"push: {str(src)!r} is not a file or directory here")
    local = local.resolve()
    remote_dest = container_path(tgt, dest if dest else local.name)
    chosen = resolve_method(method)
    stats: TransferStats | None = None
    if chosen == "rsync" and not shutil.which("rsync"):
        raise ConfigError("--method rsync, but this machine has no rsync (apt-get install rsync)")
    if chosen != "tar" and shutil.which("rsync"):
        # rsync first, no probe: an unchanged re-push is one SSH connection. Only when it
        # fails, the probe says why (typed container errors) or that rsync is missing there.
        source = f"{local}/" if local.is_dir() else str(local)
        try:
            stats = rsync.run(tgt.host, tgt.ctid, source, rsync.remote_spec(tgt.host, remote_dest),
                              delete=delete, step="push", on_progress=on_progress,
                              bwlimit_kib=bwlimit_kib,
                              make_dir=posixpath.dirname(remote_dest.rstrip("/")) or "/")
        except RemoteCommandFailed:
            if _pick(tgt, chosen, _probe(tgt, remote_dest, "push")["rsync"]) == "rsync":
                raise
    if stats is None:
        stats = tarcopy.push(tgt.remote, tgt.ctid, local, remote_dest, delete=delete,
                             on_progress=on_progress, bwlimit_kib=bwlimit_kib)
    return _report("push", tgt, str(local), remote_dest, stats, start)


def pull(tgt: Target, src: str, dest: str | Path | None = None, *, delete: bool = False,
         method: str | None = None, on_progress: Progress | None = None,
         bwlimit_kib: int | None = None) -> TransferReport:
    """Copy container ``src`` here so that it *is* ``dest`` afterwards (default ./<name>).

    Raises:
        RemoteCommandFailed: ``src`` does not exist in the container, or the transfer failed.
        ConfigError, TransportError, ContainerError and kin: as :func:`push`.
    """
    start = time.monotonic()
    remote_src = container_path(tgt, src)
    local = Path(dest).expanduser() if dest else Path(posixpath.basename(remote_src))
    local = local.absolute()
    chosen = resolve_method(method)
    probe = _probe(tgt, remote_src, "pull")
    if probe["kind"] not in ("file", "dir"):
        what = "does not exist" if probe["kind"] == "missing" else "is not a file or directory"
        raise RemoteCommandFailed(f"{tgt.label}: pull: {remote_src!r} {what} in the container",
                                  argv=[remote_src])
    chosen = _pick(tgt, chosen, probe["rsync"])
    local.parent.mkdir(parents=True, exist_ok=True)
    if chosen == "rsync":
        source = remote_src + ("/" if probe["kind"] == "dir" else "")
        stats = rsync.run(tgt.host, tgt.ctid, rsync.remote_spec(tgt.host, source), str(local),
                          delete=delete, step="pull", on_progress=on_progress,
                          bwlimit_kib=bwlimit_kib)
    else:
        stats = tarcopy.pull(tgt.remote, tgt.ctid, remote_src, local, delete=delete,
                             on_progress=on_progress, bwlimit_kib=bwlimit_kib)
    return _report("pull", tgt, remote_src, str(local), stats, start)


def _report(direction: str, tgt: Target, src: str, dest: str, stats: TransferStats,
            start: float) -> TransferReport:
    return TransferReport(direction, tgt.label, src, dest, stats.method, stats.files, stats.bytes,
                          stats.total_bytes, stats.matched_bytes, stats.deleted,
                          round(time.monotonic() - start, 3))


def push_playbook_files(tgt: Target, book: Playbook, *, method: str | None = None,
                        on_progress: Progress | None = None) -> list[TransferReport]:
    """The playbook's ``files:`` (deploy runs this before launch; only changes travel)."""
    return [push(tgt, f.src, f.dest, method=method, on_progress=on_progress) for f in book.files]


def pull_playbook_outputs(tgt: Target, book: Playbook, *, method: str | None = None,
                          on_progress: Progress | None = None) -> list[TransferReport]:
    """The playbook's ``outputs:``, each to ``./<its name>``.

    Raises:
        ConfigError: the playbook lists no outputs.
    """
    if not book.outputs:
        raise ConfigError(f"pull: no SRC given and playbook {book.name!r} lists no outputs:",
                          hint="pass SRC, or add `outputs: [path, ...]` to the playbook")
    return [pull(tgt, out, method=method, on_progress=on_progress) for out in book.outputs]
