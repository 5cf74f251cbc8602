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
        for top, dirs, files in os.walk(src):
            dirs.sort()
            for name in sorted(dirs + files):
                full = os.path.join(top, name)
                rel = os.path.relpath(full, src)
                est = os.lstat(full)
                if _kind(est) == "other":
                    skipped.append(rel)  # fifo, socket, device: not data
                    continue
                entries.append(_entry(full, rel, est))
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
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
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise Refused(f"unsafe path in transfer: {rel!r}")
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


def receive(dest: str, stream: t.BinaryIO, *, delete: bool = False,
            counted: t.Callable[[int], None] | None = None,
            max_delete: int | None = None) -> dict[str, t.Any]:
    """Unpack a :func:`send` stream at ``dest``, verifying each file before it is renamed.

    ``max_delete``: ``--delete`` removes nothing when it would remove more (what was
    confirmed; the destination changed since).

    Raises:
        Refused: an unsafe name, a symlinked parent, an unexpected member or a sha256 mismatch
            (the file being received is removed; files completed before stay).
    """
    files = nbytes = 0
    torn: set[str] = set()
    names: dict[str, t.Any] | None = None
    pending: tuple[str, str, str, tarfile.TarInfo] | None = None  # part, target, digest, info
    real_dest = None
    writing: list[str] = []  # the part file being written, removed if the stream breaks off
    try:
        with tarfile.open(fileobj=stream, mode="r|", encoding="utf-8",
                          errors="surrogateescape") as tar:
            for m in tar:
                if m.name == LIST:
                    names = json.loads(_read(tar, m))
                    if names["root"] == "dir":
                        os.makedirs(dest, exist_ok=True)
                    else:
                        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
                    real_dest = os.path.realpath(dest if names["root"] == "dir" else
                                                 os.path.dirname(os.path.abspath(dest)))
                    continue
                if m.name == SUM:
                    if pending is None:
                        raise Refused("checksum member without a file")
                    part, target, digest, info = pending
                    want = _read(tar, m).decode()
                    got = "" if info.name == DATA else info.name[len(DATA) + 1:]
                    if want == TORN:  # changed while it was read: keep the previous copy
                        os.unlink(part)
                        torn.add(got)
                        pending = None
                        continue
                    if want != digest:
                        os.unlink(part)
                        raise Refused(f"sha256 mismatch for {target!r}: sent {want[:12]}, "
                                      f"received {digest[:12]}")
                    os.chmod(part, info.mode & 0o7777)
                    os.utime(part, (info.mtime, info.mtime))
                    if os.path.isdir(target) and not os.path.islink(target):
                        raise Refused(f"{target!r} is a directory; the source has a file there")
                    os.replace(part, target)
                    torn.discard(got)
                    files += 1
                    pending = None
                    continue
                if names is None or real_dest is None or pending is not None:
                    raise Refused(f"unexpected member {m.name!r}")
                rel = "" if m.name == DATA else m.name[len(DATA) + 1:] if m.name.startswith(DATA + "/") \
                    else None
                if rel is None:
                    raise Refused(f"unexpected member {m.name!r}")
                target = _target(dest, rel)
                parent = os.path.realpath(os.path.dirname(os.path.abspath(target)))
                if rel and not (parent == real_dest or parent.startswith(real_dest + os.sep)):
                    raise Refused(f"{rel!r} would be written through a symlink out of the destination")
                if m.isdir():
                    if _kind(_lst(target)) not in ("dir", "missing"):
                        os.unlink(target)
                    os.makedirs(target, exist_ok=True)
                    os.chmod(target, m.mode & 0o7777)
                elif m.issym():
                    if _kind(_lst(target)) == "dir":
                        raise Refused(f"{target!r} is a directory; the source has a symlink there")
                    if _lst(target) is not None:
                        os.unlink(target)
                    os.symlink(m.linkname, target)
                elif m.isfile():
                    part = os.path.join(os.path.dirname(target), "." + os.path.basename(target) + PART)
                    writing[:] = [part]
                    src = tar.extractfile(m)
                    h = hashlib.sha256()
                    with open(part, "wb") as f:
                        while True:
                            data = src.read(CHUNK) if src is not None else b""
                            if not data:
                                break
                            h.update(data)
                            f.write(data)
                            nbytes += len(data)
                            if counted is not None:
                                counted(len(data))
                    pending = (part, target, h.hexdigest(), m)
                else:
                    raise Refused(f"unexpected member type for {m.name!r}")
    except BaseException:  # a broken stream, Ctrl-C: no half file stays behind
        for part in writing:
            if os.path.exists(part):
                os.unlink(part)
        raise
    if pending is not None:
        os.unlink(pending[0])
        raise Refused(f"stream ended before the checksum of {pending[1]!r}")
    deleted = _delete_extra(dest, names, max_delete) if delete and names and names["root"] == "dir" \
        else []
    return {"ok": True, "files": files, "bytes": nbytes, "deleted": len(deleted),
            "torn": sorted(torn)}


def _read(tar: tarfile.TarFile, m: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(m)
    return f.read() if f is not None else b""


def extras(dest: str, entries: t.Iterable[t.Any]) -> list[str]:
    """What ``dest`` has beyond the source's entries (names, or listing rows), deepest first."""
    keep = {e if isinstance(e, str) else e[0] for e in entries}
    gone: list[str] = []
    if _kind(_lst(dest)) != "dir":
        return gone
    for top, dirs, files in os.walk(dest, topdown=False):
        for name in files + dirs:
            rel = os.path.relpath(os.path.join(top, name), dest)
            if rel not in keep:
                gone.append(rel)
    return gone


def _delete_extra(dest: str, names: dict[str, t.Any], max_delete: int | None) -> list[str]:
    """Remove what ``dest`` has beyond the source's entries (deepest first); nothing when
    that is more than ``max_delete``."""
    gone = extras(dest, names["entries"])
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
    except (Refused, OSError, tarfile.TarError, ValueError, KeyError) as exc:
        sys.stderr.write(f"tarsync {verb}: {type(exc).__name__}: {exc}\n")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
