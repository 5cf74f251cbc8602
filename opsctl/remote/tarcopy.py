"""The tar fallback of ``opsctl push``/``pull``, for a container without rsync.

Both ends run :mod:`remote_payload.tarsync` (the container gets its source as
``python3 -c``): the receiving end first says which entries it lacks (``scan``: missing, or
size/mtime differ), only those travel, each file followed by the sha256 of what was read, and
the receiver renames a file into place only after its hash matched. The small steps (scan,
list) go through :meth:`Remote.pct_exec`, the one transport; only the data stream runs the
OpenSSH client with its pipes streamed (:func:`transfer.run_piped`), as rsync does: it is bulk
data (a pull can be gigabytes), which paramiko moves at a fraction of OpenSSH's rate, and the
same ``ssh`` argv as rsync's remote shell keeps one way to move files
(:func:`transport.openssh_argv`, strict host-key checking against the host's known_hosts).
"""

from __future__ import annotations

import json
import posixpath
import time
import typing as t
from pathlib import Path

from opsctl.config.inventory import HostSpec
from opsctl.errors import RemoteCommandFailed, SourceChanged
from opsctl.remote import transport
from opsctl.remote.transfer import Finished, Progress, TransferStats, run_piped
from remote_payload import tarsync

SOURCE = Path(tarsync.__file__).read_text(encoding="utf-8")


def _tarsync_argv(*args: str) -> list[str]:
    return ["python3", "-c", SOURCE, *args]


def _call(remote: transport.Remote, ctid: int, args: list[str], stdin: bytes | None,
          step: str) -> t.Any:
    res = remote.pct_exec(ctid, _tarsync_argv(*args), stdin=stdin, timeout=300, step=step)
    if res.rc != 0:
        raise _failed(remote.host, ctid, step, res.rc, res.stderr, res.argv)
    return json.loads(res.stdout)


def _failed(spec: HostSpec, ctid: int, step: str, rc: int, stderr: bytes,
            argv: t.Sequence[str]) -> RemoteCommandFailed:
    text = stderr.decode("utf-8", "replace")
    transport.classify_openssh_failure(spec, rc, text, step)
    tail = " | ".join(text.strip().splitlines()[-3:]) or f"exit {rc}"
    shown = [a if a != SOURCE else "<tarsync.py>" for a in argv]
    return RemoteCommandFailed(f"{spec.label}: container {ctid}: {step} failed (rc={rc}): {tail}",
                               argv=shown, rc=rc, stderr_tail=tail,
                               hint="run it again: files that arrived whole are not sent twice")


def _stream(spec: HostSpec, ctid: int, args: list[str], step: str, **pipes: t.Any) -> Finished:
    command = transport.container_command(spec, ctid, _tarsync_argv(*args), step=step)
    return run_piped([*transport.openssh_argv(spec), spec.address, command], **pipes)


def _sizes(doc: dict[str, t.Any], wanted: t.Collection[str]) -> tuple[int, int]:
    """(bytes of the wanted files, bytes of every file)."""
    want = set(wanted)
    files = [e for e in doc["entries"] if e[1] == "file"]
    return sum(e[2] for e in files if e[0] in want), sum(e[2] for e in files)


def _counter(total: int, on_progress: Progress | None,
             bwlimit_kib: int | None) -> t.Callable[[int], None]:
    """Counts file bytes as they pass; reports progress and sleeps to stay under the limit."""
    start = time.monotonic()
    done = [0]

    def counted(n: int) -> None:
        done[0] += n
        if on_progress is not None:
            on_progress(done[0], total)
        if bwlimit_kib:
            ahead = done[0] / (bwlimit_kib * 1024) - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)

    return counted


def remote_plan(remote: transport.Remote, ctid: int, doc: dict[str, t.Any],
                dest: str) -> dict[str, list[str]]:
    """What sending the listing ``doc`` to container ``dest`` would send and delete (changes
    nothing there)."""
    return t.cast(dict[str, list[str]],
                  _call(remote, ctid, ["plan", dest], json.dumps(doc).encode(), "push: plan"))


def remote_listing(remote: transport.Remote, ctid: int, src: str) -> dict[str, t.Any]:
    """:func:`tarsync.listing` of container ``src``."""
    return t.cast(dict[str, t.Any], _call(remote, ctid, ["list", src], None, "pull: list"))


def remote_stats(remote: transport.Remote, ctid: int, src: str) -> dict[str, t.Any]:
    """:func:`tarsync.stats` of container ``src`` (to see a file change during a transfer)."""
    return t.cast(dict[str, t.Any], _call(remote, ctid, ["stat", src], None, "pull: stat"))


def torn_error(where: str, step: str, dest: str, files: t.Sequence[str],
               method: str) -> SourceChanged:
    """The error of a transfer whose files kept changing while they were sent (``files``
    relative to ``dest``; "" is a single file, named by its own name)."""
    files = [f or posixpath.basename(dest.rstrip("/")) for f in files]
    shown = ", ".join(repr(f) for f in files[:3]) + (" …" if len(files) > 3 else "")
    kept = ("the previous copy at the destination was kept" if method == "tar" else
            f"their copy under {dest} may be torn")
    return SourceChanged(f"{where}: {step}: {len(files)} file(s) changed while they were sent, "
                         f"also on the re-send: {shown}; {kept}", files=files,
                         hint="stop what writes them (or wait until it has finished), then "
                              "run the same command again")


def _delete_args(delete: bool, max_delete: int | None) -> list[str]:
    if not delete or max_delete == 0:
        return []
    return ["--delete", *(["--max-delete", str(max_delete)] if max_delete is not None else [])]


def push(remote: transport.Remote, ctid: int, src: Path, dest: str, *, delete: bool,
         on_progress: Progress | None = None, bwlimit_kib: int | None = None,
         max_delete: int | None = None) -> TransferStats:
    """Send ``src`` (a file or a tree) to ``dest`` in the container.

    ``max_delete``: ``--delete`` removes nothing when it would remove more than this.

    Raises:
        SourceChanged: a file changed while it was read, twice (the previous copy stays).
        RemoteCommandFailed: the container refused or broke off (files completed stay).
        TransportError and its kin: as the connection failed.
    """
    spec = remote.host
    doc = tarsync.listing(str(src), sums=True)
    wanted = _call(remote, ctid, ["scan", dest], json.dumps(doc).encode(), "push: scan")["send"]
    moved, total = _sizes(doc, wanted)
    counted = _counter(moved, on_progress, bwlimit_kib)
    torn: list[str] = []
    res = _stream(spec, ctid, ["receive", dest, *_delete_args(delete, max_delete)], "push",
                  feed=lambda out: torn.extend(tarsync.send(str(src), doc, wanted, out, counted)))
    if res.rc != 0:
        raise _failed(spec, ctid, "push", res.rc, res.stderr, ["tarsync", "receive", dest])
    reply = json.loads(res.stdout)
    torn = sorted(set(torn) | set(reply.get("torn", [])))
    if torn:
        raise torn_error(f"{spec.label}: container {ctid}", "push", dest, torn, "tar")
    return TransferStats("tar", files=reply["files"], bytes=reply["bytes"], total_bytes=total,
                         deleted=reply["deleted"])


def pull(remote: transport.Remote, ctid: int, src: str, dest: Path, *, delete: bool,
         on_progress: Progress | None = None, bwlimit_kib: int | None = None,
         max_delete: int | None = None) -> TransferStats:
    """Fetch ``src`` (a file or a tree in the container) to ``dest`` here.

    Raises:
        SourceChanged: a file changed while it was read, twice (the previous copy stays).
        RemoteCommandFailed: the container side failed, or what arrived did not verify.
        TransportError and its kin: as the connection failed.
    """
    spec = remote.host
    doc = remote_listing(remote, ctid, src)
    wanted = tarsync.scan(str(dest), doc)
    moved, total = _sizes(doc, wanted)
    counted = _counter(moved, on_progress, bwlimit_kib)
    got: dict[str, t.Any] = {}

    def sink(stream: t.BinaryIO) -> None:
        got.update(tarsync.receive(str(dest), stream, delete=delete and max_delete != 0,
                                   counted=counted, max_delete=max_delete))

    res = _stream(spec, ctid, ["send", src], "pull",
                  feed=lambda out: out.write(json.dumps({"send": wanted}).encode()), sink=sink)
    if res.sink_error is not None:
        raise RemoteCommandFailed(f"{spec.label}: container {ctid}: pull: what arrived was "
                                  f"refused: {res.sink_error}", argv=["tarsync", "send", src],
                                  hint="run it again: files that arrived whole are kept")
    if res.rc != 0:
        raise _failed(spec, ctid, "pull", res.rc, res.stderr, ["tarsync", "send", src])
    if got.get("torn"):
        raise torn_error(f"{spec.label}: container {ctid}", "pull", str(dest), got["torn"], "tar")
    return TransferStats("tar", files=got["files"], bytes=got["bytes"], total_bytes=total,
                         deleted=got["deleted"])
