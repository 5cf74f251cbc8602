"""Copy a file or a tree as a tar stream with a sha256 per file: the fallback of ``opsctl
push``/``pull`` when the container has no rsync (stdlib only, Python >= 3.10).

The same code runs on both ends: opsctl imports it, and sends its source to the container as
``python3 -c <this file> VERB ARGS`` (a constant; arguments are argv words, never code).

Why our own and not plain ``tar``: a plain tar stream neither verifies what arrived nor
resumes. Here every file member is followed by a ``.opsctl/sum`` member holding the sha256
the sender computed *while reading what it sent*; the receiver writes the file under a
temporary name, hashes what it wrote, and renames it into place only when the two agree. So
an interrupted transfer keeps every file it completed (the next run sends only the rest:
file-level resume; rsync resumes inside a file too), and nothing half-written ever has the
final name. The receiver decides what to ask for (``scan``: missing, another size or mtime,
or the same size and mtime but another sha256: contents are compared, never assumed from
size and mtime, like rsync's ``--checksum``).

Verbs (stdout: one JSON document, except ``send`` whose stdout is the tar stream)::

    list SRC               -> {"root": kind, "entries": [[rel, kind, size, mtime, mode, link], ...],
                               "sha256": {rel: hex, ...}}
    stat SRC               -> {rel: [size, mtime_ns, ctime_ns, ino], ...} (files only)
    scan DEST  < listing   -> {"send": [rel, ...]}
    plan DEST  < listing   -> {"send": [rel, ...], "delete": [rel, ...]} (changes nothing)
    send SRC   < {"send": [...]}  -> tar stream
    receive DEST [--delete [--max-delete N]] < tar stream  -> {"ok": true, "files": n, ...}

A file that changes while it is read (size, mtimes or inode differ before and after, or it
ended early) is *torn*: its checksum member says ``torn`` instead of a sha256, the receiver
drops what arrived (the previous copy stays), and the sender sends it once more at the end of
the stream; one torn again is listed in the receiver's reply (``"torn": [rel, ...]``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import stat
import sys
import tarfile
import typing as t

SUM = ".opsctl/sum"  # member after each file: its sha256 (or TORN)
TORN = "torn"  # the checksum member of a file that changed while it was read
LIST = ".opsctl/list.json"  # first member: every entry of the source (for --delete)
DATA = "data"  # member names are data/<rel>; the source root itself is "data"
PART = ".opsctl-part"  # suffix of a file being received (never the final name)
CHUNK = 1 << 20
#: levels below the root a tree may have (``limits.TREE_DEPTH``; this file runs alone in the
#: container, so it carries the number itself and a test holds the two equal)
TREE_DEPTH = 256

Entry = list[t.Any]  # [rel, kind ("file"|"dir"|"link"), size, mtime (int s), mode, link target]


class Refused(Exception):
    """A member or path the receiver will not write (outside DEST, odd type, bad sum)."""


def _lst(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _kind(st: os.stat_result | None) -> str:
    if st is None:
        return "missing"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISLNK(st.st_mode):
        return "link"
    return "other"


def _entry(path: str, rel: str, st: os.stat_result) -> Entry:
    kind = _kind(st)
    return [rel, kind, st.st_size if kind == "file" else 0, int(st.st_mtime),
            stat.S_IMODE(st.st_mode), os.readlink(path) if kind == "link" else None]


def depth_refusal(rel: str) -> str | None:
    """Why ``rel`` is too deep to copy (more than :data:`TREE_DEPTH` levels), or None."""
    levels = rel.count("/") + 1 if rel else 0
    if levels <= TREE_DEPTH:
        return None
    return (f"{rel[:60]!r}... lies {levels} levels deep, more than the {TREE_DEPTH} a copied "
            "tree may have")


def walk(top: str, *, topdown: bool = True) -> t.Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` without following links, iterative (``os.walk`` recurses before
    Python 3.12: a deep tree is a RecursionError) and bounded: a directory more than
    :data:`TREE_DEPTH` levels below ``top`` is refused. ``topdown`` as ``os.walk``'s (the
    caller may prune ``dirs`` only when it is true); errors reading a directory raise.

    Raises:
        Refused: the tree is deeper than :data:`TREE_DEPTH`.
        OSError: a directory could not be read.
    """
    stack: list[tuple[str, int, bool]] = [(top, 0, False)]
    after: list[tuple[str, list[str], list[str]]] = []
    while stack:
        here, level, done = stack.pop()
        if done:
            yield after.pop()
            continue
        dirs: list[str] = []
        files: list[str] = []
        with os.scandir(here) as it:
            for e in it:
                (dirs if e.is_dir(follow_symlinks=False) else files).append(e.name)
        if (dirs or files) and level + 1 > TREE_DEPTH:
            first = os.path.relpath(os.path.join(here, (dirs or files)[0]), top)
            raise Refused(depth_refusal(first) or f"a tree deeper than {TREE_DEPTH} levels")
        if topdown:
            yield here, dirs, files
        else:
            after.append((here, dirs, files))
            stack.append((here, level, True))
        stack.extend((os.path.join(here, d), level + 1, False) for d in reversed(dirs))


def _sha256(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def listing(src: str, *, sums: bool = False) -> dict[str, t.Any]:
    """Every file, directory and symlink under ``src`` (or ``src`` itself), sorted; with
    ``sums``, each file's sha256 too (what :func:`scan` compares a same-sized file by)."""
    doc = _listing(src)
    if sums:
        doc["sha256"] = {e[0]: _sha256(_target(src, e[0])) for e in doc["entries"]
                         if e[1] == "file"}
    return doc


def _listing(src: str) -> dict[str, t.Any]:
    st = _lst(src)
    kind = _kind(st)
    if st is None or kind in ("missing", "other"):
        return {"root": kind, "entries": []}
    entries = [_entry(src, "", st)]
    skipped = []
    if kind == "dir":
        for top, dirs, files in walk(src):
            dirs.sort()
            for name in sorted(dirs + files):
                full = os.path.join(top, name)
                rel = os.path.relpath(full, src)
                est = os.lstat(full)
                if _kind(est) == "other":
                    skipped.append(rel)  # fifo, socket, device: not data
                    continue
                entries.append(_entry(full, rel, est))
    return {"root": kind, "entries": entries, "skipped": skipped}


def _sig(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when a file is written or replaced."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def stats(src: str) -> dict[str, list[int]]:
    """``{rel: [size, mtime_ns, ctime_ns, ino]}`` of every file of a :func:`listing`: two of
    these, taken before and after a transfer, name the files that changed during it."""
    out = {}
    for rel, kind, *_ in listing(src)["entries"]:
        if kind == "file":
            st = _lst(_target(src, rel))
            if st is not None:
                out[rel] = list(_sig(st)[:4])
    return out


def changed(before: dict[str, t.Any], after: dict[str, t.Any]) -> list[str]:
    """Files of ``before`` that differ in ``after`` (or are gone from it)."""
    return sorted(rel for rel, sig in before.items() if after.get(rel) != sig)


def _target(dest: str, rel: str) -> str:
    """Where ``rel`` goes under ``dest``; refuses names leaving it."""
    if rel == "":
        return dest
    parts = rel.split("/")
    if rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise Refused(f"unsafe path in transfer: {rel[:200]!r}")
    deep = depth_refusal(rel)
    if deep is not None:
        raise Refused(deep)
    return os.path.join(dest, *parts)


def scan(dest: str, doc: dict[str, t.Any]) -> list[str]:
    """The entries of a listing that ``dest`` lacks or has in another kind, size, mtime or
    content (the listing's sha256, where it has them)."""
    sums = doc.get("sha256") or {}
    want = []
    for rel, kind, size, mtime, _mode, link in doc["entries"]:
        st = _lst(_target(dest, rel))
        have = _kind(st)
        if kind == "dir":
            same = have == "dir"
        elif kind == "link":
            same = have == "link" and os.readlink(_target(dest, rel)) == link
        else:
            same = (have == "file" and st is not None and st.st_size == size
                    and int(st.st_mtime) == mtime
                    and (rel not in sums or _sha256(_target(dest, rel)) == sums[rel]))
        if not same:
            want.append(rel)
    return want


def plan(dest: str, doc: dict[str, t.Any]) -> dict[str, list[str]]:
    """What a transfer of ``doc`` to ``dest`` would send, and what ``--delete`` would remove."""
    gone = extras(dest, doc["entries"]) if doc["root"] == "dir" else []
    return {"send": scan(dest, doc), "delete": gone}


class _Hashing(io.RawIOBase):
    """A file read through sha256: what is hashed is exactly what is sent. A file that ends
    before ``size`` (it shrank) is padded with zeros, to keep the stream whole, and ``short``."""

    def __init__(self, f: t.BinaryIO, counted: t.Callable[[int], None] | None, size: int):
        self.f, self.h, self.counted, self.left, self.short = f, hashlib.sha256(), counted, size, False

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        if len(data) < n:
            self.short = True
            data += bytes(n - len(data))
        self.left -= len(data)
        self.h.update(data)
        if self.counted is not None and data:
            self.counted(len(data))
        return data


def send(src: str, doc: dict[str, t.Any], wanted: t.Collection[str], out: t.BinaryIO,
         counted: t.Callable[[int], None] | None = None) -> list[str]:
    """Write the tar stream of ``wanted`` entries of ``doc`` (a listing of ``src``).

    Returns the files that changed while they were read, twice (the receiver dropped them).
    """
    wanted = set(wanted)
    torn: list[str] = []
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as tar:
        names = json.dumps({"root": doc["root"], "entries": [e[0] for e in doc["entries"]]})
        _add_bytes(tar, LIST, names.encode("utf-8", "surrogateescape"))
        for rel, kind, _size, mtime, mode, link in doc["entries"]:
            if rel not in wanted:
                continue
            path = _target(src, rel)
            info = tarfile.TarInfo(f"{DATA}/{rel}" if rel else DATA)
            info.mtime, info.mode = mtime, mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif not _send_file(tar, path, info, counted):
                torn.append(rel)
        again = [rel for rel in torn if not _send_file(tar, _target(src, rel), tarfile.TarInfo(
            f"{DATA}/{rel}" if rel else DATA), counted)]
    return again


def _send_file(tar: tarfile.TarFile, path: str, info: tarfile.TarInfo,
               counted: t.Callable[[int], None] | None) -> bool:
    """Add one file and its checksum member; False (and a TORN checksum) when it changed while
    it was read: the header's size, mode and mtime are the file's when it was opened."""
    with open(path, "rb") as f:
        before = os.fstat(f.fileno())
        info.size, info.mtime = before.st_size, int(before.st_mtime)
        info.mode = stat.S_IMODE(before.st_mode)
        reader = _Hashing(f, counted, info.size)
        tar.addfile(info, reader)
        after = os.fstat(f.fileno())
    now = _lst(path)
    whole = not reader.short and _sig(after) == _sig(before) and now is not None \
        and _sig(now) == _sig(before)
    _add_bytes(tar, SUM, reader.h.hexdigest().encode() if whole else TORN.encode())
    return whole


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


class Writer(t.Protocol):
    """Where :func:`receive` writes: :class:`PathWriter` here (the container side of a push),
    ``opsctl.remote.receiver.Receiver`` on the user's machine (a pull)."""

    bytes: int

    def begin(self, root_kind: str) -> None: ...
    def mkdir(self, rel: str, mode: int) -> None: ...
    def symlink(self, rel: str, target: str) -> None: ...
    def open_file(self, rel: str) -> t.Any: ...
    def count(self, n: int) -> None: ...
    def commit(self, part: t.Any, mode: int, mtime: float) -> None: ...
    def discard(self, part: t.Any) -> None: ...
    def refuse(self, rel: str, why: str) -> None: ...
    def close(self) -> None: ...


class _PathPart:
    def __init__(self, part: str, target: str) -> None:
        self.part, self.target = part, target
        self.f = open(part, "wb")  # noqa: SIM115 - closed in commit/discard

    def write(self, data: bytes) -> None:
        self.f.write(data)


class PathWriter:
    """Writes by path under ``dest`` (the container's side of a push: the files are the
    user's own, sent from their machine), refusing names that leave it or go through a link."""

    def __init__(self, dest: str) -> None:
        self.dest, self.bytes, self.real = dest, 0, ""
        self.parts: list[_PathPart] = []

    def begin(self, root_kind: str) -> None:
        if root_kind == "dir":
            os.makedirs(self.dest, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(self.dest)), exist_ok=True)
        self.real = os.path.realpath(self.dest if root_kind == "dir" else
                                     os.path.dirname(os.path.abspath(self.dest)))

    def _target(self, rel: str) -> str:
        if not self.real:
            raise Refused(f"unexpected member for {rel!r} before the listing")
        target = _target(self.dest, rel)
        parent = os.path.realpath(os.path.dirname(os.path.abspath(target)))
        if rel and not (parent == self.real or parent.startswith(self.real + os.sep)):
            raise Refused(f"{rel!r} would be written through a symlink out of the destination")
        return target

    def mkdir(self, rel: str, mode: int) -> None:
        target = self._target(rel)
        if _kind(_lst(target)) not in ("dir", "missing"):
            os.unlink(target)
        os.makedirs(target, exist_ok=True)
        os.chmod(target, mode & 0o7777)

    def symlink(self, rel: str, link: str) -> None:
        target = self._target(rel)
        if _kind(_lst(target)) == "dir":
            raise Refused(f"{target!r} is a directory; the source has a symlink there")
        if _lst(target) is not None:
            os.unlink(target)
        os.symlink(link, target)

    def open_file(self, rel: str) -> _PathPart:
        target = self._target(rel)
        part = os.path.join(os.path.dirname(target), "." + os.path.basename(target) + PART)
        p = _PathPart(part, target)
        self.parts.append(p)
        return p

    def count(self, n: int) -> None:
        self.bytes += n

    def commit(self, p: _PathPart, mode: int, mtime: float) -> None:
        p.f.close()
        os.chmod(p.part, mode & 0o7777)
        os.utime(p.part, (mtime, mtime))
        if os.path.isdir(p.target) and not os.path.islink(p.target):
            self.discard(p)
            raise Refused(f"{p.target!r} is a directory; the source has a file there")
        os.replace(p.part, p.target)
        self.parts.remove(p)

    def discard(self, p: _PathPart) -> None:
        p.f.close()
        if os.path.exists(p.part):
            os.unlink(p.part)
        if p in self.parts:
            self.parts.remove(p)

    def refuse(self, rel: str, why: str) -> None:
        raise Refused(f"{rel!r}: {why}")

    def close(self) -> None:
        for p in list(self.parts):
            self.discard(p)


def _special(m: tarfile.TarInfo) -> str | None:
    """What a member that is no file, directory or link is (None: it is one of those)."""
    if m.isfifo():
        return "a FIFO (named pipe), not created here"
    if m.ischr() or m.isblk():
        return "a device file, not created here"
    if m.isdir() or m.issym() or m.isfile():
        return None
    return f"a tar member of type {m.type!r} (a hard link or another kind), not created here"


def receive(dest: str, stream: t.BinaryIO, *, delete: bool = False,
            counted: t.Callable[[int], None] | None = None,
            max_delete: int | None = None, writer: Writer | None = None,
            confirmed: t.Collection[str] | None = None) -> dict[str, t.Any]:
    """Unpack a :func:`send` stream at ``dest``, verifying each file before it is renamed.

    ``max_delete``: ``--delete`` removes nothing when it would remove more (what was
    confirmed; the destination changed since). ``confirmed``: the names the user approved
    for removal; ``--delete`` removes only those, and removes nothing when the stream's own
    listing would make it remove another (:func:`_delete_extra`). ``writer``: what writes
    (default :class:`PathWriter`); the stream's order and checksums are checked here either way.

    Raises:
        Refused: an unsafe name, a symlinked parent, an unexpected member or a sha256 mismatch
            (the file being received is removed; files completed before stay).
    """
    out: Writer = writer if writer is not None else PathWriter(dest)
    files = 0
    torn: set[str] = set()
    names: dict[str, t.Any] | None = None
    pending: tuple[t.Any, str, str, tarfile.TarInfo] | None = None  # part, rel, digest, info
    try:
        with tarfile.open(fileobj=stream, mode="r|", encoding="utf-8",
                          errors="surrogateescape") as tar:
            for m in tar:
                if m.name == LIST:
                    if names is not None:
                        raise Refused("a second listing in the stream")
                    names = _listing_member(_read(tar, m, LIST_BYTES))
                    out.begin(names["root"])
                    continue
                if m.name == SUM:
                    if pending is None:
                        raise Refused("checksum member without a file")
                    part, got, digest, info = pending
                    pending = None
                    want = _read(tar, m, 64).decode("ascii", "replace")
                    if want == TORN:  # changed while it was read: keep the previous copy
                        out.discard(part)
                        torn.add(got)
                        continue
                    if want != digest:
                        out.discard(part)
                        raise Refused(f"sha256 mismatch for {got!r}: sent {want[:12]!r}, "
                                      f"received {digest[:12]}")
                    out.commit(part, info.mode, info.mtime)
                    torn.discard(got)
                    files += 1
                    continue
                if names is None or pending is not None:
                    raise Refused(f"unexpected member {m.name[:200]!r}")
                rel = "" if m.name == DATA else m.name[len(DATA) + 1:] if m.name.startswith(DATA + "/") \
                    else None
                if rel is None:
                    raise Refused(f"unexpected member {m.name[:200]!r}")
                _target(dest, rel)  # the name's own rule, before any writer sees it
                why = _special(m)
                if why is not None:
                    out.refuse(rel, why)
                elif m.isdir():
                    out.mkdir(rel, m.mode)
                elif m.issym():
                    out.symlink(rel, m.linkname)
                else:
                    part = out.open_file(rel)
                    src = tar.extractfile(m)
                    h = hashlib.sha256()
                    while True:
                        data = src.read(CHUNK) if src is not None else b""
                        if not data:
                            break
                        out.count(len(data))
                        h.update(data)
                        part.write(data)
                        if counted is not None:
                            counted(len(data))
                    pending = (part, rel, h.hexdigest(), m)
        if pending is not None:
            out.discard(pending[0])
            raise Refused(f"stream ended before the checksum of {pending[1]!r}")
    finally:  # a broken stream, Ctrl-C: no half file stays behind
        out.close()
    deleted = _delete_extra(dest, names, max_delete, confirmed) \
        if delete and names and names["root"] == "dir" else []
    return {"ok": True, "files": files, "bytes": out.bytes, "deleted": len(deleted),
            "torn": sorted(torn)}


#: bytes of the stream's listing member read (a source of a million entries fits)
LIST_BYTES = 256 << 20
#: entries of the stream's listing (``opsctl.remote.receiver.LISTING_ENTRIES``)
LISTING_ENTRIES = 1_000_000


def _listing_member(data: bytes) -> dict[str, t.Any]:
    """The stream's first member, checked: ``{"root": kind, "entries": [name, ...]}``.

    Raises:
        Refused: anything else.
    """
    try:  # on a pull this is the container's word, read here: 100k ``[`` is no traceback
        doc = json.loads(data.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        raise Refused("the stream's listing is not JSON (or nested too deep)") from None
    if (not isinstance(doc, dict) or doc.get("root") not in ("file", "dir", "link")
            or not isinstance(doc.get("entries"), list)
            or not all(isinstance(e, str) for e in doc["entries"])):
        raise Refused("the stream's listing is not {root, entries}")
    if len(doc["entries"]) > LISTING_ENTRIES:
        raise Refused(f"the stream's listing has more than {LISTING_ENTRIES} entries")
    for e in doc["entries"]:
        _target("/", e)
    return doc


def _read(tar: tarfile.TarFile, m: tarfile.TarInfo, limit: int) -> bytes:
    """A small member's bytes; one larger than ``limit`` is refused (never read whole)."""
    if m.size > limit:
        raise Refused(f"member {m.name[:100]!r} of {m.size} bytes, more than {limit}")
    f = tar.extractfile(m)
    return f.read(limit) if f is not None else b""


def extras(dest: str, entries: t.Iterable[t.Any]) -> list[str]:
    """What ``dest`` has beyond the source's entries (names, or listing rows), deepest first."""
    keep = {e if isinstance(e, str) else e[0] for e in entries}
    gone: list[str] = []
    if _kind(_lst(dest)) != "dir":
        return gone
    for top, dirs, files in walk(dest, topdown=False):
        for name in files + dirs:
            rel = os.path.relpath(os.path.join(top, name), dest)
            if rel not in keep:
                gone.append(rel)
    return gone


def _delete_extra(dest: str, names: dict[str, t.Any], max_delete: int | None,
                  confirmed: t.Collection[str] | None = None) -> list[str]:
    """Remove what ``dest`` has beyond the source's entries (deepest first); nothing when
    that is more than ``max_delete``, or when it holds a name outside ``confirmed`` (the
    stream listed the source otherwise than the plan the user approved: the stream's word
    never widens what is removed). A confirmed name the stream now lists stays."""
    gone = extras(dest, names["entries"])
    if confirmed is not None:
        unconfirmed = [rel for rel in gone if rel not in set(confirmed)]
        if unconfirmed:
            shown = ", ".join(repr(r[:100]) for r in unconfirmed[:3])
            one = len(unconfirmed) == 1
            raise Refused(f"--delete would remove {len(unconfirmed)} entr"
                          f"{'y that was' if one else 'ies that were'} not confirmed "
                          f"({shown}{' ...' if len(unconfirmed) > 3 else ''}): the stream "
                          "listed the source otherwise than the plan; nothing deleted")
    if max_delete is not None and len(gone) > max_delete:
        raise Refused(f"--delete would now remove {len(gone)} entries, more than the "
                      f"{max_delete} confirmed; nothing deleted (the destination changed)")
    for rel in gone:
        full = os.path.join(dest, rel)
        if os.path.isdir(full) and not os.path.islink(full):
            os.rmdir(full)  # its contents were removed first (bottom-up walk)
        else:
            os.unlink(full)
    return gone


def _stopped(signum: int, _frame: t.Any) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):  # once: a second one must not cut the clean-up
        signal.signal(sig, signal.SIG_IGN)
    raise Refused(f"stopped by signal {signum}")  # so receive() removes its half file


def main(argv: list[str]) -> int:
    verb, path, *rest = argv
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the peer went away (Ctrl-C on its side)
        signal.signal(sig, _stopped)
    try:
        if verb == "list":
            json.dump(listing(path, sums=True), sys.stdout)
        elif verb == "stat":
            json.dump(stats(path), sys.stdout)
        elif verb == "scan":
            json.dump({"send": scan(path, json.load(sys.stdin))}, sys.stdout)
        elif verb == "plan":
            json.dump(plan(path, json.load(sys.stdin)), sys.stdout)
        elif verb == "send":
            wanted = json.load(sys.stdin)["send"]
            send(path, listing(path), wanted, sys.stdout.buffer)
        elif verb == "receive":
            cap = int(rest[rest.index("--max-delete") + 1]) if "--max-delete" in rest else None
            json.dump(receive(path, sys.stdin.buffer, delete="--delete" in rest, max_delete=cap),
                      sys.stdout)
        else:
            raise Refused(f"unknown verb {verb!r}")
    except (Refused, OSError, tarfile.TarError, ValueError, KeyError, RecursionError) as exc:
        sys.stderr.write(f"tarsync {verb}: {type(exc).__name__}: {str(exc)[:300]}\n")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
