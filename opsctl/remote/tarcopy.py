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
from opsctl.errors import ConfigError, EntriesRefused, RemoteCommandFailed, SourceChanged
from opsctl.remote import receiver, shapes, transport
from opsctl.remote.transfer import Finished, Progress, TransferStats, run_piped
from remote_payload import tarsync, wire_shapes

SOURCE = Path(tarsync.__file__).read_text(encoding="utf-8")


def _tarsync_argv(*args: str) -> list[str]:
    return ["python3", "-c", SOURCE, *args]


def _call(remote: transport.Remote, ctid: int, args: list[str], stdin: bytes | None,
          step: str) -> t.Any:
    """One small tarsync verb (``args[0]``) in the container, its answer read as the verb's
    shape (``wire_shapes.HELPER_SHAPES["tarsync <verb>"]``).

    Raises:
        RemoteCommandFailed: it failed; ReplyShapeError: it answered something else.
    """
    res = remote.pct_exec(ctid, _tarsync_argv(*args), stdin=stdin, timeout=300, step=step)
    if res.rc != 0:
        raise _failed(remote.host, ctid, step, res.rc, res.stderr, res.argv)
    return shapes.parse_doc(wire_shapes.HELPER_SHAPES[f"tarsync {args[0]}"], res.stdout,
                            where=f"{remote.host.label}: container {ctid}: {step}")


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
    """:func:`tarsync.listing` of container ``src``, checked (:func:`receiver.check_listing`).

    Raises:
        RemoteCommandFailed: the container failed, or sent a listing that is not one.
    """
    doc = _call(remote, ctid, ["list", src], None, "pull: list")
    try:
        return receiver.check_listing(doc)
    except receiver.ReceiveRefused as exc:
        raise RemoteCommandFailed(f"{remote.host.label}: container {ctid}: pull: list: {exc}; "
                                  "nothing fetched", argv=["tarsync", "list", src],
                                  hint="the container's python3 or tarsync answered something "
                                       "else than a listing; check the container") from None


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
        ConfigError: ``src`` is deeper than ``limits.TREE_DEPTH`` (nothing sent).
        SourceChanged: a file changed while it was read, twice (the previous copy stays).
        RemoteCommandFailed: the container refused or broke off (files completed stay).
        TransportError and its kin: as the connection failed.
    """
    spec = remote.host
    try:
        doc = tarsync.listing(str(src), sums=True)
    except tarsync.Refused as exc:
        raise ConfigError(f"{spec.label}: push: {str(src)!r} cannot be sent: {exc}; nothing "
                          "sent", hint="send a shallower tree (or its parts one by one)") from None
    wanted = _call(remote, ctid, ["scan", dest], json.dumps(doc).encode(), "push: scan")["send"]
    moved, total = _sizes(doc, wanted)
    counted = _counter(moved, on_progress, bwlimit_kib)
    torn: list[str] = []
    res = _stream(spec, ctid, ["receive", dest, *_delete_args(delete, max_delete)], "push",
                  feed=lambda out: torn.extend(tarsync.send(str(src), doc, wanted, out, counted)))
    if res.rc != 0:
        raise _failed(spec, ctid, "push", res.rc, res.stderr, ["tarsync", "receive", dest])
    reply = t.cast(wire_shapes.TarReceivedDoc, shapes.parse_doc(
        wire_shapes.TarReceivedDoc, res.stdout, where=f"{spec.label}: container {ctid}: push"))
    torn = sorted(set(torn) | set(reply["torn"]))
    if torn:
        raise torn_error(f"{spec.label}: container {ctid}", "push", dest, torn, "tar")
    return TransferStats("tar", files=reply["files"], bytes=reply["bytes"], total_bytes=total,
                         deleted=reply["deleted"])


def pull(remote: transport.Remote, ctid: int, src: str, dest: Path, *, delete: bool,
         on_progress: Progress | None = None, bwlimit_kib: int | None = None,
         max_delete: int | None = None, max_bytes: int | None = None,
         confirmed: t.Collection[str] | None = None) -> TransferStats:
    """Fetch ``src`` (a file or a tree in the container) to ``dest`` here, written only
    through :class:`receiver.Receiver` (its rules: nothing outside ``dest``, no link leaving
    it, the user's modes, no device or FIFO; ``max_bytes`` of file data at most).
    ``confirmed``: the names a ``--delete`` was approved to remove; it removes only those,
    and nothing when the stream would make it remove another (that one is named).

    Raises:
        SourceChanged: a file changed while it was read, twice (the previous copy stays).
        EntriesRefused: the source holds entries not created here (named), or the stream
            broke the receiver's rules (everything else that arrived is in place).
        RemoteCommandFailed: the container side failed, or what arrived did not verify.
        TransportError and its kin: as the connection failed.
    """
    spec = remote.host
    where = f"{spec.label}: container {ctid}"
    doc = remote_listing(remote, ctid, src)
    try:
        wanted = tarsync.scan(str(dest), doc)
    except tarsync.Refused as exc:
        raise EntriesRefused(f"{where}: pull: {exc}; nothing fetched") from None
    moved, total = _sizes(doc, wanted)
    counted = _counter(moved, on_progress, bwlimit_kib)
    got: dict[str, t.Any] = {}
    into = receiver.Receiver(dest, max_bytes=max_bytes)
    for rel in doc["skipped"]:
        into.refuse(rel, "not a file, directory or link (a device, FIFO or socket), "
                         "not created here")

    def sink(stream: t.BinaryIO) -> None:
        got.update(tarsync.receive(str(dest), stream, delete=delete and max_delete != 0,
                                   counted=counted, max_delete=max_delete, writer=into,
                                   confirmed=confirmed))

    res = _stream(spec, ctid, ["send", src], "pull",
                  feed=lambda out: out.write(json.dumps({"send": wanted}).encode()), sink=sink)
    if isinstance(res.sink_error, receiver.ReceiveRefused):
        raise EntriesRefused(f"{where}: pull: what arrived was refused: {res.sink_error}",
                             refused=[[r.rel, r.why] for r in into.refused],
                             hint="what arrived before it is in place; check what writes that "
                                  "tree in the container")
    if res.sink_error is not None:
        raise RemoteCommandFailed(f"{where}: pull: what arrived was "
                                  f"refused: {res.sink_error}", argv=["tarsync", "send", src],
                                  hint="run it again: files that arrived whole are kept")
    if res.rc != 0:
        raise _failed(spec, ctid, "pull", res.rc, res.stderr, ["tarsync", "send", src])
    if got.get("torn"):
        raise torn_error(where, "pull", str(dest), got["torn"], "tar")
    refused_error(where, into.refused)
    return TransferStats("tar", files=got["files"], bytes=got["bytes"], total_bytes=total,
                         deleted=got["deleted"])


def refused_error(where: str, refused: t.Sequence[receiver.Refusal]) -> None:
    """Raise the one error naming the entries a pull did not create (none: return).

    Raises:
        EntriesRefused: some were refused.
    """
    if refused:
        raise EntriesRefused(f"{where}: pull: {len(refused)} entr{'y' if len(refused) == 1 else 'ies'}"
                             f" not created here: {receiver.describe(refused)}",
                             refused=[[r.rel, r.why] for r in refused],
                             hint="everything else arrived; remove or replace those entries in "
                                  "the container (links inside the tree, relative, are kept)")
