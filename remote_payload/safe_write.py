"""The one way opsctl, the agent and the trainer write a file or a directory a user keeps.

Every write goes to a temporary name beside the target (``.<name>.<random>.tmp``), is flushed
to the disk (the file, then its directory) and renamed over the target, so a reader or a
crash sees the old content or the new, never half of either. A directory of files (an
export, a checkpoint) is filled under a temporary sibling directory and swapped in whole:
a failure while it is written leaves the previous directory as it was. A line added to a
file of lines (``known_hosts``, a history) is appended in place (:func:`append_line`,
:func:`append_text`), and a link is re-pointed by a new link renamed over it
(:func:`write_link`). ``tests/unit/test_only_safe_write.py`` fails on a write anywhere else
that its allow-list does not name with a reason.

The rules, and why:

- **A link at the destination is never followed.** A file is replaced by ``rename``, which
  acts on the link itself; a link *is* refused, so nothing written through a dangling or
  planted link lands elsewhere; modes are set with ``fchmod`` on the new file's descriptor,
  never through a path (an export once made a ``config.json`` link's target 0644).
- **A directory opsctl did not write is never replaced** unless the caller passes
  ``force``: opsctl's directories carry :data:`MARKER` (``{"written_by": "opsctl",
  "kind": ...}``). An empty directory holds nothing to lose and is taken.
- **Never the current directory, ``/``, a top-level directory or a home** (as typed and
  with links resolved), nor a directory that contains the current directory: with or
  without ``force``. An empty path is the current directory and is refused too.
- **The OS saying no** (a full disk, a read-only file system, no permission, a file where a
  directory is needed) is a :class:`WriteFailed` naming the path and the reason in one line.

Both errors subclass :class:`OSError`, so code that already survives a failed write (the
agent's never-raise writers) still does. Stdlib only: the agent (Python 3.10) imports it on
every ``status`` poll, so its import pulls in nothing beyond ``os``/``stat``/``json``
(``tempfile``, ``shutil``, ``ctypes`` and ``pathlib`` are imported where a directory is
written).
Ours because nothing in the stdlib renames atomically with these refusals, and the
well-kept packages (``atomicwrites`` is archived; ``safer`` follows links) do not either.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import json
import os
import stat
import typing as t

if t.TYPE_CHECKING:
    import pathlib

#: The file that says "opsctl wrote this directory" (and what it is: ``kind``).
MARKER = ".opsctl-written.json"
_MARKER_MAX = 1 << 20

PathLike = t.Union[str, "os.PathLike[str]"]


class DestinationError(OSError):
    """A destination could not be written; the message is one line and names the path."""

    def __init__(self, path: PathLike, reason: str, code: int = 0):
        super().__init__(code, reason, os.fspath(path))
        self.path = os.fspath(path)
        self.reason = reason

    def __str__(self) -> str:
        # a name with a newline or another control character is shown quoted: one line
        plain = self.path and self.path.isprintable()
        return f"{self.path if plain else repr(self.path)}: {self.reason}"


class DestinationRefused(DestinationError):
    """A rule refused the destination (a link, a protected place, someone else's
    directory); nothing was written."""


class WriteFailed(DestinationError):
    """The OS refused the write (full disk, read-only, permission, not a directory); the
    previous content is kept."""


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def failure(path: PathLike, exc: OSError) -> WriteFailed:
    """The :class:`WriteFailed` of an ``OSError`` met while writing ``path`` (a file where a
    directory is needed is named)."""
    where = os.path.dirname(os.path.abspath(os.fspath(path)))
    while where != "/" and not os.path.lexists(where):
        where = os.path.dirname(where)
    if os.path.lexists(where) and not os.path.isdir(where):
        what = ("is a symbolic link that leads nowhere (dangling, or a loop)"
                if os.path.islink(where) else "is not a directory")
        return WriteFailed(path, f"cannot write: {where} {what}", errno_mod.ENOTDIR)
    return WriteFailed(path, f"cannot write: {exc.strerror or exc}", exc.errno or 0)


# --- where a directory may be written ------------------------------------------------------


def _contains(outer: str, inner: str) -> bool:
    return outer == "/" or inner == outer or inner.startswith(outer.rstrip("/") + "/")


def protected_refusal(path: PathLike, *, cwd: str | None = None,
                      home: str | None = None) -> str | None:
    """Why a directory may never be written or replaced at ``path``, or None.

    Refused: an empty path, ``/`` or a top-level directory, a home, the current directory
    or a directory that contains it; each as typed and with links resolved.
    """
    raw = os.fspath(path)
    if raw.strip() == "":
        return "an empty path is the current directory; name a directory of its own"
    here = cwd or os.getcwd()
    homes = {h for h in (home, os.environ.get("HOME"), os.path.expanduser("~")) if h}
    typed = os.path.normpath(os.path.abspath(raw))
    for where in {typed, os.path.realpath(raw)}:
        if len([p for p in where.split("/") if p]) <= 1:
            return "it is / or a top-level directory"
        for h in homes:
            if where in {os.path.normpath(h), os.path.realpath(h)}:
                return "it is a home directory"
        for c in {os.path.normpath(here), os.path.realpath(here)}:
            if _contains(where, c):
                return ("it is the current directory" if where == c
                        else f"it contains the current directory ({c})")
    return None


def read_regular(path: PathLike, limit: int) -> bytes:
    """The bytes of a regular file opsctl keeps state in (at most ``limit``), never through a
    link and never waiting (:func:`remote_payload.boundedread.read_regular`): a FIFO or a
    device planted there is an error, not a hang.

    Raises:
        OSError: missing, a link (``ELOOP``), not a regular file (``EINVAL``, ``EISDIR``),
            over ``limit`` (``EFBIG``), or unreadable.
    """
    from remote_payload import boundedread

    return boundedread.read_regular(path, limit)


def read_marker(directory: PathLike) -> dict[str, t.Any] | None:
    """The marker of a directory opsctl wrote, or None (none, a link, a FIFO or another
    non-file, unreadable, over 1 MiB, foreign): :func:`read_regular`."""
    try:
        doc = json.loads(read_regular(os.path.join(os.fspath(directory), MARKER), _MARKER_MAX))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("written_by") == "opsctl" else None


def manifest(directory: PathLike) -> dict[str, list[int]]:
    """Every file and link under ``directory`` (not the marker) -> ``[size, mtime_ns]``, by
    ``lstat`` (links are not followed). The marker records it when the directory is written,
    so a file added or changed since (a copy of an export the user edited, a marker planted
    in a model directory) makes the directory someone else's again."""
    root = os.fspath(directory)
    found: dict[str, list[int]] = {}
    for here, dirs, files in os.walk(root):
        for name in [*files, *dirs]:
            full = os.path.join(here, name)
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode):
                continue
            rel = os.path.relpath(full, root)
            if rel != MARKER:
                found[rel] = [st.st_size, st.st_mtime_ns]
    return found


def _changed(directory: str, marker: dict[str, t.Any], keep: t.Collection[str]) -> list[str]:
    """Files of ``directory`` the marker's manifest does not list as they are now (a marker
    with no manifest lists nothing: it was planted or copied by hand)."""
    listed = marker.get("files")
    listed = listed if isinstance(listed, dict) else {}
    try:
        now = manifest(directory)
    except OSError as exc:
        return [f"(unreadable: {exc.strerror or exc})"]
    return sorted(k for k, v in now.items() if k not in keep and listed.get(k) != v)


def _only_kept(directory: str, keep: t.Collection[str]) -> bool:
    """Whether ``directory`` holds nothing but files or links named in ``keep``."""
    try:
        with os.scandir(directory) as it:
            return all(e.name in keep and not e.is_dir(follow_symlinks=False) for e in it)
    except OSError:
        return False


def mount_inside(directory: PathLike) -> str | None:
    """A mount point under ``directory`` (another file system: a bind of /proc, a data
    disk), or None. Removing the old directory would delete into it."""
    root = os.fspath(directory)
    try:
        dev = os.lstat(root).st_dev
    except OSError:
        return None
    for here, dirs, _files in os.walk(root):
        for name in dirs:
            full = os.path.join(here, name)
            with contextlib.suppress(OSError):
                st = os.lstat(full)
                if stat.S_ISDIR(st.st_mode) and st.st_dev != dev:
                    return full
    return None


def _is_empty_dir(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False


def check_directory(path: PathLike, *, kind: str, force: bool = False,
                    keep: t.Collection[str] = ()) -> None:
    """Refuse a destination directory that :func:`new_directory` may not replace.

    A directory is opsctl's when its marker is of ``kind`` and its manifest lists every file
    there as it is now (``keep``: names the caller carries into the new directory, so a
    change to them loses nothing; a directory holding only those is taken too). A directory
    holding a mount point is refused even with ``force``: removing the old one would delete
    into the other file system.

    Raises:
        DestinationRefused: a protected place, a link, a file, a mount point inside, or a
            non-empty directory that is not opsctl's unchanged (without ``force``), or one of
            another kind.
    """
    dest = os.fspath(path)
    why = protected_refusal(dest)
    if why is not None:
        raise DestinationRefused(dest, f"refused as a destination: {why}")
    _check_existing(dest, kind=kind, force=force, keep=keep)


def _check_existing(dest: str, *, kind: str, force: bool, keep: t.Collection[str],
                    shown: str | None = None) -> None:
    """:func:`check_directory` less the protected places; ``shown`` names ``dest`` in the
    message. Checked again while another writer swaps a directory in meanwhile (the marker
    of one and the files of the other are not compared)."""
    for _attempt in range(5):
        try:
            before = os.lstat(dest).st_ino
        except FileNotFoundError:
            return
        except OSError:
            before = -1
        try:
            _check_once(dest, kind=kind, force=force, keep=keep, shown=shown)
            return
        except DestinationRefused:
            with contextlib.suppress(OSError):
                if os.lstat(dest).st_ino == before:
                    raise
        except FileNotFoundError:
            return
    _check_once(dest, kind=kind, force=force, keep=keep, shown=shown)


def _check_once(dest: str, *, kind: str, force: bool, keep: t.Collection[str],
                shown: str | None) -> None:
    shown = dest if shown is None else shown
    st = _existing_not_a_link(dest, shown, "is a symbolic link; not followed (name the real "
                                           "directory, or remove the link)")
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise DestinationRefused(shown, "is a file, not a directory; nothing written")
    if _is_empty_dir(dest):
        return
    mount = mount_inside(dest)
    if mount is not None:
        raise DestinationRefused(shown, f"holds a mount point ({os.path.relpath(mount, dest)}); "
                                        "nothing replaced, even with --force (unmount it first)")
    marker = read_marker(dest)
    if marker is None and not force and _only_kept(dest, keep):
        return  # e.g. a hub clone's README.md alone: the caller carries it, nothing lost
    if marker is None and not force:
        raise DestinationRefused(shown, f"holds files opsctl did not write (no {MARKER}); "
                                        "nothing replaced (pass --force to replace it)")
    if marker is not None and marker.get("kind") != kind and not force:
        raise DestinationRefused(shown, f"is a {marker.get('kind')} opsctl wrote, not a {kind}; "
                                        "nothing replaced")
    changed = [] if marker is None or force else _changed(dest, marker, keep)
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        raise DestinationRefused(shown, f"holds files opsctl did not write or that changed "
                                        f"since ({changed[0]!r}{more}); nothing replaced (pass "
                                        "--force to replace it)")


# --- files ---------------------------------------------------------------------------------


def _temp_name(parent: str, name: str, suffix: str) -> str:
    return os.path.join(parent, f".{name[:200]}.{os.urandom(6).hex()}{suffix}")


def _new_temp_file(parent: str, name: str) -> tuple[int, str]:
    """A new file beside the target, 0600, created exclusively (never an existing name or a
    link); ``tempfile.mkstemp`` without importing ``tempfile``."""
    while True:
        tmp = _temp_name(parent, name, ".tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except FileExistsError:
            continue
        return fd, tmp


def _new_temp_dir(parent: str, name: str, suffix: str) -> str:
    while True:
        tmp = _temp_name(parent, name, suffix)
        try:
            os.mkdir(tmp, 0o700)
        except FileExistsError:
            continue
        return tmp


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _existing_not_a_link(path: str, shown: str, refusal: str) -> os.stat_result | None:
    """What is at ``path`` (never followed), or None when nothing is.

    Raises:
        DestinationRefused: a symbolic link is there (``refusal`` says why).
        DestinationError: ``path`` cannot be looked at.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise failure(shown, exc) from None
    if stat.S_ISLNK(st.st_mode):
        raise DestinationRefused(shown, refusal)
    return st


def _check_file_target(path: str) -> None:
    st = _existing_not_a_link(path, path, "is a symbolic link; not followed, nothing written")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise DestinationRefused(path, "is not a regular file (a directory, FIFO or device); "
                                       "nothing written")


def check_file(path: PathLike) -> None:
    """Refuse a file destination :func:`write_with` would refuse (a link, a directory, a
    device), before the work that makes its content.

    Raises:
        DestinationRefused: as :func:`write_with`.
    """
    raw = os.fspath(path)
    if raw.endswith("/") or os.path.basename(os.path.abspath(raw)) in ("", ".", ".."):
        raise DestinationRefused(raw, "names a directory, not a file")
    _check_file_target(os.path.abspath(raw))


def write_with(path: PathLike, fill: t.Callable[[t.BinaryIO], object], *,
               mode: int = 0o644, durable: bool = True, make_parents: bool = False) -> None:
    """``fill(f)`` writes the new content into a temporary file beside ``path``, which is
    flushed and renamed over ``path``. ``mode`` less the umask; ``durable=False`` skips
    the fsyncs (a file rewritten every few seconds whose loss costs nothing);
    ``make_parents`` creates missing parent directories.

    Raises:
        DestinationRefused: ``path`` is a link, a directory or a device.
        WriteFailed: the OS said no (the previous file is kept).
    """
    dest = os.path.abspath(os.fspath(path))
    if os.fspath(path).endswith("/") or os.path.basename(dest) in ("", ".", ".."):
        raise DestinationRefused(os.fspath(path), "names a directory, not a file")
    _check_file_target(dest)
    parent, name = os.path.split(dest)
    try:
        if make_parents:
            os.makedirs(parent, exist_ok=True)
        fd, tmp = _new_temp_file(parent, name)
    except OSError as exc:
        raise failure(dest, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fchmod(f.fileno(), mode & ~umask())
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, dest)
        if durable:
            _fsync_dir(parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, DestinationError):
            raise failure(dest, exc) from None
        raise


def write_bytes(path: PathLike, data: bytes, *, mode: int = 0o644, durable: bool = True,
                make_parents: bool = False) -> None:
    """:func:`write_with` of ``data``."""
    write_with(path, lambda f: f.write(data), mode=mode, durable=durable,
               make_parents=make_parents)


def write_text(path: PathLike, text: str, *, mode: int = 0o644, durable: bool = True,
               make_parents: bool = False) -> None:
    """:func:`write_with` of ``text`` as UTF-8."""
    write_bytes(path, text.encode("utf-8"), mode=mode, durable=durable,
                make_parents=make_parents)


def write_json(path: PathLike, doc: t.Any, *, mode: int = 0o644, durable: bool = True,
               dumps: t.Callable[..., str] | None = None) -> None:
    """``doc`` as indented, key-sorted JSON (no NaN) and a newline; ``dumps`` may replace
    ``json.dumps`` (the wire's strict one)."""
    if dumps is None:
        text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False)
    else:
        text = dumps(doc, indent=1, sort_keys=True)
    write_text(path, text + "\n", mode=mode, durable=durable)


def append_text(path: PathLike, text: str, *, mode: int = 0o644) -> None:
    """Append ``text`` to a log (created ``mode``); a link or a device there is refused.

    Raises:
        DestinationRefused: ``path`` is a link (``O_NOFOLLOW``) or not a regular file.
        WriteFailed: the OS said no.
    """
    dest = os.fspath(path)
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno_mod.ELOOP:
            raise DestinationRefused(dest, "is a symbolic link; not followed, nothing written") \
                from None
        raise failure(dest, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DestinationRefused(dest, "is not a regular file; nothing written")
        os.write(fd, text.encode("utf-8"))
    except OSError as exc:
        if isinstance(exc, DestinationError):
            raise
        raise failure(dest, exc) from None
    finally:
        os.close(fd)


def write_link(path: PathLike, target: str) -> None:
    """Point the symbolic link ``path`` at ``target`` in one step: a new link beside it,
    renamed over it, so a reader sees the old target or the new one, never no link.

    Raises:
        DestinationRefused: something other than a link is at ``path`` (never replaced).
        WriteFailed: the OS said no.
    """
    dest = os.path.abspath(os.fspath(path))
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise failure(dest, exc) from None
    if st is not None and not stat.S_ISLNK(st.st_mode):
        raise DestinationRefused(dest, "is not a symbolic link; nothing replaced")
    parent, name = os.path.split(dest)
    while True:
        tmp = _temp_name(parent, name, ".tmp")
        try:
            os.symlink(target, tmp)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise failure(dest, exc) from None
    try:
        os.replace(tmp, dest)
        _fsync_dir(parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise failure(dest, exc) from None


def append_line(path: PathLike, line: str, *, mode: int = 0o644) -> None:
    """Append ``line`` as a line of its own to a file of lines the user keeps (known_hosts),
    created ``mode`` less the umask.

    A last line without its newline (a hand edit, another tool) gets it first, so the two
    lines are never glued into one. Appended in place (``O_APPEND``, one ``write``) rather
    than rewritten: the file keeps its inode, mode and owner, and a concurrent append by
    another program (ssh's own) is never lost; opsctl's appenders hold the file's ``flock``
    so two of them never both add the missing newline. A link or a non-file is refused.

    Raises:
        DestinationRefused: ``path`` is a link (``O_NOFOLLOW``) or not a regular file, or
            ``line`` holds a line break.
        WriteFailed: the OS said no.
    """
    import fcntl

    dest = os.fspath(path)
    if "\n" in line or "\r" in line:
        raise DestinationRefused(dest, "the line to append holds a line break; nothing written")
    try:
        fd = os.open(dest, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK | os.O_NOCTTY, mode)
    except OSError as exc:
        if exc.errno == errno_mod.ELOOP:
            raise DestinationRefused(dest, "is a symbolic link; not followed, nothing written "
                                           "(name the real file)") from None
        raise failure(dest, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DestinationRefused(dest, "is not a regular file; nothing written")
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        glued = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        data = (("\n" if glued else "") + line + "\n").encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    except OSError as exc:
        if isinstance(exc, DestinationError):
            raise
        raise failure(dest, exc) from None
    finally:
        os.close(fd)


# --- directories ---------------------------------------------------------------------------

_RENAME_EXCHANGE = 2


def exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    C library or the file system has no such call."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno_mod.EINVAL, errno_mod.ENOSYS):
        return False
    raise OSError(err, os.strerror(err), b)


def _fsync_tree(root: str) -> None:
    for here, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(here, name)
            if os.path.islink(p):  # a link (a carried README.md) is the directory's entry
                continue
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(here)


def _swap_in(tmp: str, dest: str, kind: str, force: bool, keep: t.Collection[str]) -> None:
    """Put the finished ``tmp`` at ``dest``; the old directory (if any) is removed after.

    What was at ``dest`` is checked again once it is in our hands (swapped to our temporary
    name): a link or someone else's directory put there after the first check is swapped
    back and refused, never removed."""
    import shutil

    parent, name = os.path.split(dest)
    try:
        os.rename(tmp, dest)  # dest missing or an empty directory
    except OSError as exc:
        if exc.errno not in (errno_mod.EEXIST, errno_mod.ENOTEMPTY):
            raise
        check_directory(dest, kind=kind, force=force, keep=keep)
        if exchange(tmp, dest):
            old = taken = tmp
            try:
                _check_existing(taken, kind=kind, force=force, keep=keep, shown=dest)
            except DestinationRefused:
                exchange(tmp, dest)
                raise
        else:
            old = _new_temp_dir(parent, name, ".old")
            taken = os.path.join(old, "d")
            os.rename(dest, taken)
            try:
                _check_existing(taken, kind=kind, force=force, keep=keep, shown=dest)
            except DestinationRefused:
                os.rename(taken, dest)
                os.rmdir(old)
                raise
            os.rename(tmp, dest)
        _fsync_dir(parent)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(parent)


#: a temporary sibling younger than this is never taken for a killed writer's
STALE_AFTER_S = 10.0


def _is_temp_of(entry: str, name: str) -> bool:
    head = f".{name[:200]}."
    if not entry.startswith(head) or not entry.endswith((".tmp", ".old")):
        return False
    middle = entry[len(head):-4]
    return len(middle) == 12 and all(c in "0123456789abcdef" for c in middle)


def _lock_dir(path: str) -> int | None:
    """An open descriptor of ``path`` holding its exclusive ``flock``, or None (a live
    writer holds it, or it is not a directory of ours)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def clean_stale(path: PathLike) -> None:
    """Remove the temporary siblings of ``path`` a killed writer left (``.<name>.<hex>.tmp``
    and ``.old``), and only those: a live writer holds a ``flock`` on its temporary
    directory, a killed one holds nothing. One of another user (a shared, sticky parent) is
    never touched; one made in the last :data:`STALE_AFTER_S` seconds is left (its writer may
    not have locked it yet). An ``.old`` still holding the previous directory (killed between
    the two renames) while ``path`` is missing is put back, not removed."""
    import shutil
    import time

    dest = os.path.normpath(os.path.abspath(os.fspath(path)))
    parent, name = os.path.split(dest)
    try:
        entries = [e.name for e in os.scandir(parent) if _is_temp_of(e.name, name)
                   and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for entry in entries:
        full = os.path.join(parent, entry)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if st.st_uid != os.geteuid() or st.st_mtime > time.time() - STALE_AFTER_S:
            continue  # another user's (a shared, sticky parent), or too young to judge
        fd = _lock_dir(full)
        if fd is None:
            continue
        try:
            kept = os.path.join(full, "d")
            if entry.endswith(".old") and os.path.isdir(kept) and not os.path.lexists(dest):
                with contextlib.suppress(OSError):
                    os.rename(kept, dest)
            if mount_inside(full) is None:
                shutil.rmtree(full, ignore_errors=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def new_directory(path: PathLike, *, kind: str, force: bool = False, mode: int = 0o755,
                  keep: t.Collection[str] = ()) -> t.Iterator[pathlib.Path]:
    """Fill a fresh temporary sibling of ``path`` (yielded), then swap it in whole.

    On a normal exit the files are fsynced, :data:`MARKER` written (``kind`` and the
    :func:`manifest` of what was written), and the directory renamed into place (the previous
    one, if any, swapped out and removed). On an exception the temporary directory is removed
    and ``path`` is untouched. Temporary siblings a killed writer left are removed first
    (:func:`clean_stale`). ``keep``: as :func:`check_directory`.

    Raises:
        DestinationRefused: as :func:`check_directory`.
        WriteFailed: the OS said no (disk full, read-only, permission, a file in the way).
    """
    import pathlib
    import shutil

    dest = os.path.normpath(os.path.abspath(os.fspath(path)))
    check_directory(path, kind=kind, force=force, keep=keep)
    parent, name = os.path.split(dest)
    clean_stale(dest)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = _new_temp_dir(parent, name, ".tmp")
    except OSError as exc:
        raise failure(dest, exc) from None
    held = _lock_dir(tmp)
    try:
        yield pathlib.Path(tmp)
        write_json(os.path.join(tmp, MARKER), {"written_by": "opsctl", "kind": kind,
                                               "files": manifest(tmp)}, durable=False)
        os.chmod(tmp, mode & ~umask())  # made 0700; tmp is ours, never a link
        _fsync_tree(tmp)
        _swap_in(tmp, dest, kind, force, keep)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and not isinstance(exc, DestinationError):
            raise failure(dest, exc) from None
        raise
    finally:
        if held is not None:
            os.close(held)


def remove_directory(path: PathLike, *, kind: str) -> None:
    """Remove a directory opsctl wrote as ``kind`` and nobody changed since (its marker's
    manifest lists every file there as it is now): a run's old checkpoint. Nothing there is a
    no-op.

    It is renamed to a temporary sibling first (``.<name>.<hex>.tmp``), so a reader or a crash
    sees the whole directory or none of it at ``path``; :func:`clean_stale` removes what a
    killed removal left. Never a link, a protected place, a directory holding a mount point.

    Raises:
        DestinationRefused: a link, a file, a protected place, a mount point inside, no marker
            or another kind, or files changed or added since it was written.
        WriteFailed: the rename was refused by the OS.
    """
    import shutil

    dest = os.path.normpath(os.path.abspath(os.fspath(path)))
    why = protected_refusal(dest)
    if why is not None:
        raise DestinationRefused(dest, f"refused for removal: {why}")
    st = _existing_not_a_link(dest, dest, "is a symbolic link; not followed, nothing removed")
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise DestinationRefused(dest, "is a file, not a directory; nothing removed")
    marker = read_marker(dest)
    if marker is None or marker.get("kind") != kind:
        raise DestinationRefused(dest, f"is not a {kind} opsctl wrote (no {MARKER} of that "
                                       "kind); nothing removed")
    changed = _changed(dest, marker, ())
    if changed:
        raise DestinationRefused(dest, f"holds files changed or added since it was written "
                                       f"({changed[0]!r}); nothing removed")
    if mount_inside(dest) is not None:
        raise DestinationRefused(dest, "holds a mount point; nothing removed")
    parent, name = os.path.split(dest)
    tmp = _temp_name(parent, name, ".tmp")
    try:
        os.rename(dest, tmp)
    except OSError as exc:
        raise failure(dest, exc) from None
    # what the rename moved is checked again: a directory or a link swapped in at ``dest``
    # after the checks above (someone else's, made in that instant) goes back, untouched
    try:
        moved: os.stat_result | None = os.lstat(tmp)
    except OSError:
        moved = None
    if moved is None or (moved.st_dev, moved.st_ino) != (st.st_dev, st.st_ino) \
            or _changed(tmp, marker, ()):
        try:
            os.rename(tmp, dest)
        except OSError:
            raise DestinationRefused(dest, f"was replaced or changed while it was being removed; "
                                           f"it is kept as {tmp}, nothing removed") from None
        raise DestinationRefused(dest, "was replaced or changed while it was being removed; "
                                       "nothing removed")
    _fsync_dir(parent)
    shutil.rmtree(tmp, ignore_errors=True)
