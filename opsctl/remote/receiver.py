"""The one receiver on this machine: everything a container sends back lands through here.

``opsctl pull`` (the tar stream of :mod:`opsctl.remote.tarcopy`, and rsync's local result)
and ``opsctl tensorboard``'s copy of event files write only through :class:`Receiver` (the
tar stream) or are checked by :func:`confine` (what rsync wrote). The container is
untrusted: it chooses names, modes, link targets, file kinds and sizes, and it can change its
tree while it is read (a directory swapped for a link to ``/``). The rules, and why:

- **Nothing outside the destination.** Every name is one relative path of plain components
  (no ``..``, ``.``, empty part, leading ``/`` or NUL). Every write is made relative to an open
  directory descriptor, each parent opened with ``O_NOFOLLOW | O_DIRECTORY``, never by a path
  string: a link standing where a directory was (planted here, or created by the stream) makes
  the write fail instead of going through it, however the tree changes between a check and
  the write (the swap race has no window: there is no separate check).
- **Links: kept only when they resolve inside the copy.** A link is kept when its target is
  relative, goes up (``..``) only at its start and never above the copy's root, and then only
  goes down. Every kept link then resolves inside, even through other kept links (each goes
  down from a place inside). An absolute link, a link that climbs out, a link as the whole
  copy, or one with ``..`` after a name is not created, and is named (:class:`Refusal`). A
  link is never followed while receiving.
- **Modes: the user's, never the container's.** As ``tar --no-same-permissions`` and rsync
  without ``-p``: a new file or directory gets the sent permission bits less this process's
  umask, without setuid, setgid or sticky bits, and always readable and writable (and, for
  a directory, enterable) by its owner, so a copy can be updated and removed by the user.
  Owners are never set (the files are the user's).
- **Only files, directories and links.** A device, FIFO or socket is never created; it is
  named (:class:`Refusal`), and the rest of the copy still arrives.
- **Bounded.** ``max_bytes`` caps the file data one receive writes (the TensorBoard copy uses
  :data:`remote_payload.limits.PULLED_EVENT_BYTES`); past it the receive stops with an error.

Why our own code and not ``tarfile.extractall`` with a filter or ``tar``: the ``data`` filter
of :mod:`tarfile` (Python 3.12+) checks names against the *current* tree by path and then
writes by path, so a link swapped in between the two is followed; GNU tar's
``--no-same-permissions`` handles modes but not links that leave. Neither verifies the
per-file sha256 the stream carries. rsync stays the fast path (delta transfer, resume inside
a file): :mod:`opsctl.remote.rsync` runs it with ``--safe-links`` and without ``-p``/``-D``,
and :func:`confine` then checks its local result against the same rules (a defence against
an rsync receiver bug, which a hostile sender is exactly the case of).
"""

from __future__ import annotations

import os
import stat
import typing as t
from dataclasses import dataclass

from remote_payload import limits, safe_write

#: Flags of a directory opened to write under: never through a link.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Flags of a part file: a new file of our own, never an existing name or a link.
_PART_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PART_SUFFIX = ".opsctl-part"


class ReceiveRefused(Exception):
    """The stream asked for something the receiver never does (a name leaving the
    destination, a write through a link, more data than the cap); nothing more is written."""


@dataclass(frozen=True)
class Refusal:
    """An entry of the source that was not created here, and why (shown to the user)."""

    rel: str
    why: str


def current_umask() -> int:
    """This process's umask, read without changing it (:func:`remote_payload.safe_write.umask`:
    ``os.umask`` sets it, which another thread would see)."""
    return safe_write.umask() & 0o777


def local_mode(sent: int, *, directory: bool, umask: int | None = None) -> int:
    """The mode a received file or directory gets here: the sent permission bits less the
    umask, without setuid/setgid/sticky, owner read+write (+ enter for a directory) kept."""
    mask = current_umask() if umask is None else umask
    owner = 0o700 if directory else 0o600
    return ((sent & 0o777) | owner) & ~mask & 0o777


def split_rel(rel: str) -> list[str]:
    """``rel`` as its path components; ``""`` is the destination itself (``[]``).

    Raises:
        ReceiveRefused: an absolute name, ``..``, ``.``, an empty component or a NUL byte.
    """
    if rel == "":
        return []
    parts = rel.split("/")
    if rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise ReceiveRefused(f"unsafe path in transfer: {rel[:200]!r}")
    if len(parts) > limits.TREE_DEPTH:
        raise ReceiveRefused(f"{rel[:60]!r}... lies {len(parts)} levels deep, more than the "
                             f"{limits.TREE_DEPTH} a copied tree may have")
    return parts


def link_refusal(rel: str, target: str) -> str | None:
    """Why a link at ``rel`` (relative to the copy's root) pointing to ``target`` is not kept,
    or None when it resolves inside the copy (the rule in the module docstring)."""
    if rel == "":
        return "the copy itself would be a link"
    if not target or "\0" in target:
        return "a link with an empty target"
    if target.startswith("/"):
        return f"a link to the absolute path {target[:200]!r}, outside the copy"
    depth = len(rel.split("/")) - 1  # directories between the copy's root and the link
    ups, climbing = 0, True
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not climbing:
                return f"a link to {target[:200]!r}, with '..' after a name (it may leave the copy)"
            ups += 1
        else:
            climbing = False
    if ups > depth:
        return f"a link to {target[:200]!r}, which leaves the copy"
    return None


class _Part:
    """A file being received: an ``O_EXCL`` temporary name in its directory, renamed over
    the final name only by :meth:`Receiver.commit`."""

    def __init__(self, parent_fd: int, name: str, part: str, fd: int, rel: str) -> None:
        self.parent_fd, self.name, self.part, self.fd, self.rel = parent_fd, name, part, fd, rel

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]


class Receiver:
    """Writes one received tree (or one file) at ``dest``, by the rules of this module.

    ``dest`` itself is the user's choice (a pull's DEST, checked by the caller); everything
    below it comes from the container. Use as a context manager: :meth:`close` removes a
    part file left by a broken stream and closes the directory descriptors.
    """

    def __init__(self, dest: str | os.PathLike[str], *, max_bytes: int | None = None,
                 umask: int | None = None) -> None:
        self.dest = os.path.abspath(os.fspath(dest))
        self.max_bytes = max_bytes
        self.umask = current_umask() if umask is None else umask
        self.refused: list[Refusal] = []
        self.bytes = 0
        self._root_fd: int | None = None  # the copy's root dir (a tree) or DEST's parent (a file)
        self._single = False
        self._parts: list[_Part] = []

    # -- the destination ------------------------------------------------------------------

    def begin(self, root_kind: str) -> None:
        """Open where the copy goes: ``dest`` as a directory (made when missing) for a tree,
        ``dest``'s parent for a single file. ``dest`` itself is never followed as a link.

        Raises:
            ReceiveRefused: ``dest`` (for a tree) is a link or not a directory.
            OSError: this machine refused (permission, full disk).
        """
        if root_kind == "dir":
            os.makedirs(os.path.dirname(self.dest), exist_ok=True)
            try:
                os.mkdir(self.dest, local_mode(0o755, directory=True, umask=self.umask))
            except FileExistsError:
                pass
            try:
                self._root_fd = os.open(self.dest, _DIR_FLAGS)
            except OSError as exc:
                raise ReceiveRefused(f"{self.dest!r} is a link or not a directory here; "
                                     f"nothing written through it ({exc.strerror})") from None
        else:
            parent = os.path.dirname(self.dest)
            os.makedirs(parent, exist_ok=True)
            self._root_fd = os.open(parent, _DIR_FLAGS)
            self._single = True

    def _where(self, rel: str, *, create: bool) -> tuple[int, str, list[int]]:
        """(descriptor of ``rel``'s parent, ``rel``'s last name, descriptors to close).

        Raises:
            ReceiveRefused: a parent is a link, or not a directory.
        """
        if self._root_fd is None:
            raise ReceiveRefused("data before the stream's listing")
        parts = split_rel(rel)
        if self._single:
            if parts:
                raise ReceiveRefused(f"{rel[:200]!r} inside a single-file copy")
            return self._root_fd, os.path.basename(self.dest), []
        if not parts:
            raise ReceiveRefused("the copy's root is not a file")
        fd, opened = self._root_fd, []
        try:
            for name in parts[:-1]:
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(name, local_mode(0o755, directory=True, umask=self.umask), dir_fd=fd)
                    fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:  # ELOOP, ENOTDIR: a link or a file stands there
                    raise ReceiveRefused(f"{rel[:200]!r} would be written through "
                                         f"{name[:100]!r}, which is not a directory here "
                                         f"({exc.strerror})") from None
                opened.append(fd)
        except BaseException:
            for o in opened:
                os.close(o)
            raise
        return fd, parts[-1], opened

    @staticmethod
    def _kind(parent: int, name: str) -> str:
        try:
            st = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            return "missing"
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        if stat.S_ISREG(st.st_mode):
            return "file"
        return "link" if stat.S_ISLNK(st.st_mode) else "other"

    # -- what the stream asks for ----------------------------------------------------------

    def refuse(self, rel: str, why: str) -> None:
        """Note an entry that is not created (a device, FIFO or socket; an unsafe link)."""
        self.refused.append(Refusal(rel, why))

    def mkdir(self, rel: str, mode: int) -> None:
        """A directory at ``rel`` (an existing one keeps its contents; its mode is set).

        Raises:
            ReceiveRefused: a parent is a link or not a directory.
        """
        if rel == "" and not self._single:
            if self._root_fd is not None:
                os.fchmod(self._root_fd, local_mode(mode, directory=True, umask=self.umask))
            return
        parent, name, opened = self._where(rel, create=True)
        try:
            if self._kind(parent, name) in ("file", "link", "other"):
                os.unlink(name, dir_fd=parent)
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
            except FileExistsError:
                pass
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            try:
                os.fchmod(fd, local_mode(mode, directory=True, umask=self.umask))
            finally:
                os.close(fd)
        finally:
            for o in opened:
                os.close(o)

    def symlink(self, rel: str, target: str) -> None:
        """A link at ``rel``, kept only when it resolves inside the copy (else refused).

        Raises:
            ReceiveRefused: a parent is a link or not a directory, or ``rel`` is a directory.
        """
        why = link_refusal(rel, target)
        if why is not None:
            self.refuse(rel, why)
            return
        parent, name, opened = self._where(rel, create=True)
        try:
            kind = self._kind(parent, name)
            if kind == "dir":
                raise ReceiveRefused(f"{rel[:200]!r} is a directory here; the source has a link")
            if kind != "missing":
                os.unlink(name, dir_fd=parent)
            os.symlink(target, name, dir_fd=parent)
        finally:
            for o in opened:
                os.close(o)

    def open_file(self, rel: str) -> _Part:
        """A part file for ``rel``: written by the caller, then :meth:`commit` or
        :meth:`discard`.

        Raises:
            ReceiveRefused: a parent is a link or not a directory.
        """
        parent, name, opened = self._where(rel, create=True)
        part = "." + name[:200] + PART_SUFFIX
        try:
            if self._kind(parent, part) != "missing":
                os.unlink(part, dir_fd=parent)  # left by an interrupted run (never a dir here)
            fd = os.open(part, _PART_FLAGS, 0o600, dir_fd=parent)
        except BaseException:
            for o in opened:
                os.close(o)
            raise
        for o in opened[:-1]:
            os.close(o)
        p = _Part(parent, name, part, fd, rel)
        self._parts.append(p)
        return p

    def count(self, n: int) -> None:
        """Count ``n`` bytes of file data against ``max_bytes``.

        Raises:
            ReceiveRefused: the cap is passed.
        """
        self.bytes += n
        if self.max_bytes is not None and self.bytes > self.max_bytes:
            raise ReceiveRefused(f"more than {self.max_bytes} bytes of file data sent; the cap "
                                 "of this copy (nothing more written)")

    def commit(self, p: _Part, mode: int, mtime: float) -> None:
        """Give the part file its mode and mtime and rename it over its name.

        Raises:
            ReceiveRefused: a directory stands at the name.
        """
        try:
            os.fchmod(p.fd, local_mode(mode, directory=False, umask=self.umask))
            os.utime(p.fd, (mtime, mtime))
            if self._kind(p.parent_fd, p.name) == "dir":
                raise ReceiveRefused(f"{p.rel[:200]!r} is a directory here; the source has a file")
            os.replace(p.part, p.name, src_dir_fd=p.parent_fd, dst_dir_fd=p.parent_fd)
        except BaseException:
            self.discard(p)
            raise
        self._release(p)

    def discard(self, p: _Part) -> None:
        """Remove a part file (a torn or mismatched file: the previous copy stays)."""
        try:
            os.unlink(p.part, dir_fd=p.parent_fd)
        except FileNotFoundError:
            pass
        self._release(p)

    def _release(self, p: _Part) -> None:
        if p in self._parts:
            self._parts.remove(p)
            os.close(p.fd)
            if p.parent_fd != self._root_fd:
                os.close(p.parent_fd)

    def close(self) -> None:
        for p in list(self._parts):
            self.discard(p)
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Confined:
    """What :func:`confine` found in a received tree."""

    refused: list[Refusal]
    modes_fixed: int
    bytes: int


def confine(dest: str | os.PathLike[str], *, since_ns: int, umask: int | None = None
            ) -> Confined:
    """Check a tree another program received (rsync) against this module's rules, through
    directory descriptors that never follow a link: a link that leaves the copy, a device,
    FIFO or socket is removed when it changed at or after ``since_ns`` (this transfer made it)
    and named either way; setuid, setgid and sticky bits and bits the umask masks are cleared.
    Also sums the file bytes (for a size cap).

    Raises:
        OSError: the tree could not be read.
        ReceiveRefused: the tree is deeper than :data:`limits.TREE_DEPTH` levels.
    """
    mask = current_umask() if umask is None else umask
    refused: list[Refusal] = []
    fixed = [0]
    total = [0]
    top = os.path.abspath(os.fspath(dest))
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return Confined([], 0, 0)
    if stat.S_ISLNK(st.st_mode):
        refused.append(Refusal("", "the copy itself is a link"))
        return Confined(refused, 0, 0)

    def fix(fd: int, st: os.stat_result, directory: bool) -> None:
        mode = stat.S_IMODE(st.st_mode)
        if mode & (0o7000 | mask):
            os.fchmod(fd, mode & 0o777 & ~mask)
            fixed[0] += 1

    def visit_file(parent: int, name: str, rel: str) -> None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=parent)
        except PermissionError:  # an unreadable file of ours: chmod by name, it is no link
            st = os.lstat(name, dir_fd=parent)
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) & (0o7000 | mask):
                os.chmod(name, stat.S_IMODE(st.st_mode) & 0o777 & ~mask, dir_fd=parent)
                fixed[0] += 1
            total[0] += st.st_size
            return
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                fix(fd, st, False)
                total[0] += st.st_size
        finally:
            os.close(fd)

    def names(fd: int) -> list[str]:
        with os.scandir(fd) as it:
            return sorted((e.name for e in it), reverse=True)  # popped from the end: in order

    def walk(root: int) -> None:
        """Iterative (a deep tree is never a RecursionError), holding one descriptor per
        level of the current path, at most :data:`limits.TREE_DEPTH` of them."""
        frames: list[tuple[int, str, list[str]]] = [(root, "", names(root))]
        try:
            while frames:
                fd, prefix, left = frames[-1]
                if not left:
                    frames.pop()
                    if fd != root:
                        os.close(fd)
                    continue
                name = left.pop()
                rel = prefix + name
                if len(frames) > limits.TREE_DEPTH:
                    raise ReceiveRefused(
                        f"{rel[:60]!r}... lies more than {limits.TREE_DEPTH} levels deep, "
                        "the most a copied tree may have; the copy was not checked below "
                        "that level")
                st = os.lstat(name, dir_fd=fd)
                if stat.S_ISLNK(st.st_mode):
                    why = link_refusal(rel, os.readlink(name, dir_fd=fd))
                    if why is not None:
                        _drop(fd, name, rel, why, st)
                elif stat.S_ISDIR(st.st_mode):
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    try:
                        fix(sub, os.fstat(sub), True)
                        frames.append((sub, rel + "/", names(sub)))
                    except BaseException:
                        os.close(sub)
                        raise
                elif stat.S_ISREG(st.st_mode):
                    visit_file(fd, name, rel)
                else:
                    _drop(fd, name, rel, special_kind(st.st_mode), st)
        finally:
            for fd, _prefix, _left in frames:
                if fd != root:
                    os.close(fd)

    def _drop(fd: int, name: str, rel: str, why: str, st: os.stat_result) -> None:
        if st.st_ctime_ns >= since_ns:
            os.unlink(name, dir_fd=fd)
            refused.append(Refusal(rel, why + "; removed"))
        else:
            refused.append(Refusal(rel, why + "; older than this pull, left as it was"))

    if stat.S_ISDIR(st.st_mode):
        root = os.open(top, _DIR_FLAGS)
        try:
            walk(root)
        finally:
            os.close(root)
    elif stat.S_ISREG(st.st_mode):
        parent = os.open(os.path.dirname(top), _DIR_FLAGS)
        try:
            visit_file(parent, os.path.basename(top), "")
        finally:
            os.close(parent)
    else:
        refused.append(Refusal("", special_kind(st.st_mode)))
    return Confined(refused, fixed[0], total[0])


def special_kind(mode: int) -> str:
    """What a non-file, non-directory, non-link is, as the refusal names it."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not created here"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file, not created here"
    if stat.S_ISSOCK(mode):
        return "a socket, not created here"
    return "not a file, directory or link, not created here"


def describe(refused: t.Sequence[Refusal], limit: int = 3) -> str:
    """The first few refusals as one line of text."""
    shown = "; ".join(f"{r.rel or '.'!r}: {r.why}" for r in refused[:limit])
    more = f"; and {len(refused) - limit} more" if len(refused) > limit else ""
    return shown + more


#: entries of a container's listing accepted (a tree of a million files fits)
LISTING_ENTRIES = 1_000_000
_KINDS = ("file", "dir", "link", "other")
_HEX = frozenset("0123456789abcdef")


def check_listing(doc: object) -> dict[str, t.Any]:
    """A container's ``tarsync list`` document, checked before any of it is used here:
    ``{"root": kind, "entries": [[rel, kind, size, mtime, mode, link], ...],
    "sha256": {rel: hex}, "skipped": [rel, ...]}`` with safe names (:func:`split_rel`),
    known kinds, whole non-negative numbers, a link target only on a link, at most
    :data:`LISTING_ENTRIES` entries.

    Raises:
        ReceiveRefused: anything else (what is wrong, cut to a readable length).
    """
    def bad(why: str) -> ReceiveRefused:
        return ReceiveRefused(f"the container's listing is malformed: {why[:300]}")

    if not isinstance(doc, dict) or doc.get("root") not in ("file", "dir", "link", "other",
                                                             "missing"):
        raise bad("no known root kind")
    entries = doc.get("entries")
    if not isinstance(entries, list) or len(entries) > LISTING_ENTRIES:
        raise bad(f"entries is not a list of at most {LISTING_ENTRIES} rows")
    seen: set[str] = set()
    rows: list[list[t.Any]] = []
    for e in entries:
        if not (isinstance(e, list) and len(e) == 6 and isinstance(e[0], str)):
            raise bad(f"row {str(e)[:100]!r}")
        rel, kind, size, mtime, mode, link = e
        split_rel(rel)
        if kind not in _KINDS or rel in seen:
            raise bad(f"row {rel[:100]!r}: kind {str(kind)[:20]!r} or a name listed twice")
        for n in (size, mtime, mode):
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 1 << 63:
                raise bad(f"row {rel[:100]!r}: {str(n)[:30]!r} is no whole number")
        if (kind == "link") != isinstance(link, str) or (link is not None and kind != "link"):
            raise bad(f"row {rel[:100]!r}: a link target on a {kind}, or a link without one")
        seen.add(rel)
        rows.append([rel, kind, size, mtime, mode, link])
    if (rows and rows[0][0] != "") or any(r[0] == "" for r in rows[1:]):
        raise bad("the root row is not first")
    sums = doc.get("sha256", {})
    if not isinstance(sums, dict) or not all(
            isinstance(k, str) and k in seen and isinstance(v, (str, type(None)))
            and (v is None or (len(v) == 64 and set(v) <= _HEX)) for k, v in sums.items()):
        raise bad("sha256 is not {name of a listed file: 64 hex digits}")
    skipped = doc.get("skipped", [])
    if not isinstance(skipped, list) or len(skipped) > LISTING_ENTRIES or not all(
            isinstance(s, str) for s in skipped):
        raise bad("skipped is not a list of names")
    for s in skipped:
        split_rel(s)
    return {"root": doc["root"], "entries": rows, "sha256": dict(sums), "skipped": list(skipped)}
