"""rsync between this machine and a container, through the host's sshd and ``pct exec``.

rsync runs the OpenSSH client as its remote shell (``--rsh``, :func:`transport.openssh_argv`,
host key checked strictly against the host's known_hosts) and, on the host, starts its server
half inside the container: ``--rsync-path`` is the container command string
(:func:`transport.container_command`: ``env LC_ALL=C.UTF-8 pct exec CT --keep-env 0 -- rsync``,
``sudo -n`` for a non-root user), to which rsync appends ``--server …``. (The remote shell
cannot carry ``pct exec`` itself: rsync puts the host name right after it.)

Why the OpenSSH client and not the one transport (:class:`~opsctl.remote.transport.Remote`):
rsync needs a *program* as its remote shell, which paramiko is not. The probe before a
transfer, and every other plain command of push/pull, goes through ``Remote.pct_exec``.

Options, and why:
- ``--checksum``: a file of the same size is compared by content, not skipped for its mtime
  (a local file that differs but kept size and mtime was once kept and called verified); a
  re-transfer reads both copies once.
- ``-rlt --executability``: tree, symlinks, mtimes, and the
  executable bit. Not ``-p``: it would give every *existing* destination directory the
  source's mode (``/tmp`` 1777 became 755, ``/root`` 700 became 755). Without it a new file or
  directory gets the source's mode less the receiver's umask, and an existing one keeps its
  mode; owners are left alone too (root in the container, the user here).
- ``--partial-dir=.opsctl-partial``: an interrupted transfer keeps what arrived, in that
  directory next to the file, never under the file's own name (plain ``--partial`` put half a
  file in place of the previous copy); the next run uses it as the basis of rsync's delta
  transfer, so it does not start from zero (``matched_bytes``), and removes the directory.
- ``-s`` (``--secluded-args``, formerly ``--protect-args``): paths travel inside rsync's
  protocol, never through the host's shell, whatever characters they hold.
- rsync checks every file it wrote with a whole-file checksum and retries a mismatch.
- ``--delete`` only when asked, with ``--max-delete`` = the count that was confirmed.

Receiving here (a pull) adds the rules of :mod:`opsctl.remote.receiver`, the one receiver on
this machine: ``--safe-links`` (a link that is absolute or climbs out of the tree is not
created), no ``-D`` (devices, FIFOs and sockets are not created), no ``-p`` (special bits
dropped, the umask applied, as above), ``--info=nonreg1,symsafe1,name1`` so rsync names what it
skipped (:func:`parse_refusals`), and ``--max-size`` with ``--info=skip1`` for a capped copy
(a file over it is named, not created). Then
:func:`receiver.confine` checks the local result against the same rules.

A capped copy stops at its cap, not after it: ``--max-size`` is per file, so rsync's progress
lines are watched (:func:`over_cap`) and rsync's group is ended as soon as the data moved
passes the cap, or its percentage proves the source's files add up to more than the cap;
what the stop left in :data:`PARTIAL_DIR` is removed (:func:`remove_partials`), and the error
names the cap.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from opsctl.config.inventory import HostSpec
from opsctl.errors import EntriesRefused, RemoteCommandFailed
from opsctl.remote import transport
from opsctl.remote.command import CommandResult
from opsctl.remote.receiver import Refusal
from opsctl.remote.transfer import Progress, TransferStats, run_piped

_PROGRESS = re.compile(rb"^\s*([\d,]+)\s+(\d+)%")
_SKIPPED = re.compile(rb'^skipping non-regular file "(.*)"$', re.S)
_UNSAFE = re.compile(rb'^ignoring unsafe symlink "(.*)" -> "(.*)"$', re.S)
_TOO_BIG = re.compile(rb"^(.*) is over max-size$", re.S)
#: bytes of rsync's output kept for its --stats (at its end); the file names before are dropped
STDOUT_KEPT = 1 << 20
#: refusals kept from rsync's output (the rest are dropped)
REFUSALS_KEPT = 1000


def parse_refusals(line: bytes, max_size: int | None = None) -> Refusal | None:
    """The entry rsync says it skipped on one of its output lines (its names as rsync
    prints them: odd bytes as ``\\#ooo``), or None for any other line. Names are cut to a
    readable length; the line is the container's doing, so anything is possible here."""
    if m := _SKIPPED.match(line):
        return Refusal(m[1].decode("utf-8", "replace")[:300],
                       "not a file, directory or link (a device, FIFO or socket), not created here")
    if m := _UNSAFE.match(line):
        target = m[2].decode("utf-8", "replace")[:200]
        return Refusal(m[1].decode("utf-8", "replace")[:300],
                       f"a link to {target!r}, which leaves the copy, not created here")
    if m := _TOO_BIG.match(line):
        return Refusal(m[1].decode("utf-8", "replace")[:300],
                       f"a file larger than the copy's cap of {max_size} bytes, not created here")
    return None
_STAT = re.compile(r"^([A-Za-z][A-Za-z ]+?): ([\d,]+)", re.M)


def remote_spec(spec: HostSpec, path: str) -> str:
    """``host:path`` as rsync parses it (an IPv6 address in brackets)."""
    host = f"[{spec.address}]" if ":" in spec.address else spec.address
    return f"{host}:{path}"


#: The container side of a push: make DEST's parent directory, then become rsync's server
#: (rsync before 3.2.3 has no --mkpath). Constant code; the directory is an argument ($1) and
#: rsync's own ``--server …`` words follow it.
MKDIR_THEN_RSYNC = 'mkdir -p -- "$1" && shift && exec rsync "$@"'


#: Where an interrupted transfer keeps what arrived (relative: in the file's directory; rsync
#: excludes it from the transfer and from ``--delete``).
PARTIAL_DIR = ".opsctl-partial"


def rsync_argv(spec: HostSpec, ctid: int, src: str, dest: str, *, delete: bool,
               bwlimit_kib: int | None = None, make_dir: str | None = None,
               max_delete: int | None = None, receiving_here: bool = False,
               max_size: int | None = None) -> list[str]:
    """The whole rsync command line; ``src``/``dest`` as rsync takes them (one is remote).
    ``make_dir``: a container directory to create first (a push's parent of DEST).
    ``receiving_here``: a pull (the receiver's rules, module docstring); ``max_size``: the
    largest file it creates."""
    server = ["rsync"] if make_dir is None else ["sh", "-c", MKDIR_THEN_RSYNC, "sh", make_dir]
    argv = ["rsync", "-rlt", "--checksum", "--executability", f"--partial-dir={PARTIAL_DIR}", "-s", "--stats",
            "--info=progress2", "--no-inc-recursive", "--rsh", transport.rsync_remote_shell(spec),
            "--rsync-path", transport.container_command(spec, ctid, server, step="rsync")]
    if receiving_here:
        argv += ["--safe-links", "--no-perms", "--no-devices", "--no-specials",
                 "--info=nonreg1,symsafe1,name1"]
        if max_size is not None:
            argv += [f"--max-size={max_size}", "--info=skip1"]
    if delete and max_delete != 0:
        argv.append("--delete")
        if max_delete is not None:
            argv.append(f"--max-delete={max_delete}")
    if bwlimit_kib:
        argv.append(f"--bwlimit={bwlimit_kib}")
    return [*argv, "--", src, dest]


def over_cap(done: int, pct: int, cap: int) -> bool:
    """Whether one progress2 line (``done`` bytes, ``pct`` percent of the whole) proves the
    copy passes ``cap`` bytes: ``done`` already does, or the total does. rsync prints the
    percentage truncated (``int(100.0 * done / total)``), so ``total > done * 100 / (pct + 1)``:
    the first line of a copy too large for its cap stops it, before most of it is written."""
    return done > cap or (0 <= pct <= 100 and done * 100 // (pct + 1) >= cap)


class _OverCap(Exception):
    """Raised from the progress reader to stop rsync (its group is ended on the way out)."""

    def __init__(self, done: int) -> None:
        super().__init__(done)
        self.done = done


def remove_partials(dest: str) -> None:
    """Remove what an rsync stopped at the cap left in :data:`PARTIAL_DIR` under ``dest``
    (rsync's own directory: the source's tree never has one, rsync excludes the name), and
    the directory when that empties it; beside a single-file ``dest``, that file's part only.
    Links are never followed; the walk keeps its own stack, so a deep tree cannot exhaust the
    interpreter's recursion limit."""
    top = Path(dest)
    with _quiet():
        os.unlink(top.parent / PARTIAL_DIR / top.name)
    with _quiet():
        os.rmdir(top.parent / PARTIAL_DIR)
    stack = [top] if top.is_dir() and not top.is_symlink() else []
    while stack:
        here = stack.pop()
        try:
            with os.scandir(here) as entries:
                items = list(entries)
        except OSError:
            continue
        if here.name == PARTIAL_DIR and here != top:
            for e in items:
                if not e.is_dir(follow_symlinks=False):
                    with _quiet():
                        os.unlink(e.path)
            with _quiet():
                os.rmdir(here)
            continue
        stack.extend(Path(e.path) for e in items if e.is_dir(follow_symlinks=False))


class _quiet:
    """Ignore an OSError (a name that went away, a directory that is not empty)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, OSError)


def parse_stats(text: str) -> dict[str, int]:
    """``--stats`` lines as {"Total file size": n, ...} (numbers without separators)."""
    return {k: int(v.replace(",", "")) for k, v in _STAT.findall(text)}


def run(spec: HostSpec, ctid: int, src: str, dest: str, *, delete: bool, step: str,
        on_progress: Progress | None = None, bwlimit_kib: int | None = None,
        make_dir: str | None = None, max_delete: int | None = None,
        receiving_here: bool = False, max_size: int | None = None) -> TransferStats:
    """Run rsync; ``on_progress(done, total)`` as it goes. The stats name what rsync skipped
    (``refused``: with ``receiving_here``, devices, FIFOs and links leaving the tree).

    Raises:
        HostKeyError, AuthError, TransportError: the OpenSSH client could not connect.
        RemoteCommandFailed: rsync failed (its stderr tail; the whole output in the log).
        EntriesRefused: ``max_size`` given and the copy passed it (rsync stopped there).
    """
    argv = rsync_argv(spec, ctid, src, dest, delete=delete, bwlimit_kib=bwlimit_kib,
                      make_dir=make_dir, max_delete=max_delete, receiving_here=receiving_here,
                      max_size=max_size)
    buf = bytearray()
    refused: list[Refusal] = []

    def progress(chunk: bytes) -> None:  # progress2 lines: "  1,048,576  50%  95.2MB/s ..."
        buf.extend(chunk)
        *lines, rest = re.split(rb"[\r\n]", bytes(buf))
        buf[:] = rest
        if len(buf) > 1 << 16:  # one endless "line": keep its tail only, never all of it
            del buf[:-4096]
        for line in lines:
            if (r := parse_refusals(line, max_size)) is not None and len(refused) < REFUSALS_KEPT:
                refused.append(r)
            m = _PROGRESS.match(line)
            if m:
                done, pct = int(m[1].replace(b",", b"")), int(m[2])
                if max_size is not None and over_cap(done, pct, max_size):
                    raise _OverCap(done)
                if on_progress is not None:
                    on_progress(done, done * 100 // pct if pct else None)

    try:
        res = run_piped(argv, on_stdout=progress, keep_bytes=STDOUT_KEPT)
    except _OverCap as exc:
        if receiving_here:
            remove_partials(dest)
        raise EntriesRefused(
            f"{spec.label}: container {ctid}: {step}: stopped at the copy's cap of {max_size} "
            f"bytes of files ({exc.done} bytes moved; the source holds more); what did not "
            "arrive whole was removed",
            hint="remove what is not needed from the container's tree") from None
    stderr = res.stderr.decode("utf-8", "replace")
    if res.rc != 0:
        transport.classify_openssh_failure(spec, res.rc, stderr, step)
        result = CommandResult(tuple(argv), " ".join(argv), res.rc, res.stdout, res.stderr, 0.0)
        path = transport.save_log(step, result)
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        raise RemoteCommandFailed(f"{spec.label}: container {ctid}: {step}: rsync failed "
                                  f"(rc={res.rc}): {tail}", argv=argv, rc=res.rc,
                                  stderr_tail=tail, log_path=str(path),
                                  hint="run it again to resume (what arrived is kept in "
                                      f"{PARTIAL_DIR}/)")
    stats = parse_stats(res.stdout.decode("utf-8", "replace"))
    return TransferStats(method="rsync", files=stats.get("Number of regular files transferred", 0),
                         bytes=stats.get("Literal data", 0),
                         total_bytes=stats.get("Total file size", 0),
                         matched_bytes=stats.get("Matched data", 0),
                         deleted=stats.get("Number of deleted files", 0),
                         refused=tuple(refused))
