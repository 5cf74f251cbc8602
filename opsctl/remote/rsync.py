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
"""

from __future__ import annotations

import re

from opsctl.config.inventory import HostSpec
from opsctl.errors import RemoteCommandFailed
from opsctl.remote import transport
from opsctl.remote.command import CommandResult
from opsctl.remote.transfer import Progress, TransferStats, run_piped

_PROGRESS = re.compile(rb"^\s*([\d,]+)\s+(\d+)%")
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
               max_delete: int | None = None) -> list[str]:
    """The whole rsync command line; ``src``/``dest`` as rsync takes them (one is remote).
    ``make_dir``: a container directory to create first (a push's parent of DEST)."""
    server = ["rsync"] if make_dir is None else ["sh", "-c", MKDIR_THEN_RSYNC, "sh", make_dir]
    argv = ["rsync", "-rlt", "--checksum", "--executability", f"--partial-dir={PARTIAL_DIR}", "-s", "--stats",
            "--info=progress2", "--no-inc-recursive", "--rsh", transport.rsync_remote_shell(spec),
            "--rsync-path", transport.container_command(spec, ctid, server, step="rsync")]
    if delete and max_delete != 0:
        argv.append("--delete")
        if max_delete is not None:
            argv.append(f"--max-delete={max_delete}")
    if bwlimit_kib:
        argv.append(f"--bwlimit={bwlimit_kib}")
    return [*argv, "--", src, dest]


def parse_stats(text: str) -> dict[str, int]:
    """``--stats`` lines as {"Total file size": n, ...} (numbers without separators)."""
    return {k: int(v.replace(",", "")) for k, v in _STAT.findall(text)}


def run(spec: HostSpec, ctid: int, src: str, dest: str, *, delete: bool, step: str,
        on_progress: Progress | None = None, bwlimit_kib: int | None = None,
        make_dir: str | None = None, max_delete: int | None = None) -> TransferStats:
    """Run rsync; ``on_progress(done, total)`` as it goes.

    Raises:
        HostKeyError, AuthError, TransportError: the OpenSSH client could not connect.
        RemoteCommandFailed: rsync failed (its stderr tail; the whole output in the log).
    """
    argv = rsync_argv(spec, ctid, src, dest, delete=delete, bwlimit_kib=bwlimit_kib,
                      make_dir=make_dir, max_delete=max_delete)
    buf = bytearray()

    def progress(chunk: bytes) -> None:  # progress2 lines: "  1,048,576  50%  95.2MB/s ..."
        buf.extend(chunk)
        *lines, rest = re.split(rb"[\r\n]", bytes(buf))
        buf[:] = rest
        for line in lines:
            m = _PROGRESS.match(line)
            if m and on_progress is not None:
                done, pct = int(m[1].replace(b",", b"")), int(m[2])
                on_progress(done, done * 100 // pct if pct else None)

    res = run_piped(argv, on_stdout=progress)
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
                         deleted=stats.get("Number of deleted files", 0))
