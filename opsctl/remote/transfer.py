"""What ``opsctl push``/``pull`` share below the use case: the container probe, the stats a
transfer reports, and running a local program (rsync, or the OpenSSH client for the tar
fallback's data stream: bulk data only, :mod:`.tarcopy` says why) with its pipes streamed —
never buffered whole, as a transfer can be many gigabytes.
"""

from __future__ import annotations

import os
import threading
import typing as t
from dataclasses import dataclass

from opsctl.remote.receiver import Refusal
from remote_payload import limits, procgroup

#: progress callback: (bytes of file data moved so far, bytes to move in all or None)
Progress = t.Callable[[int, "int | None"], None]

# Runs in the container as `python3 -c PROBE PATH push|pull|look` through Remote.pct_exec (so a
# missing or stopped container, an unknown host key or a refused login are the usual typed
# errors before any data moves). Constant text; prints one JSON line: rsync's path, the kind of
# PATH, PATH with symlinks resolved, and the homes of the user it runs as ($HOME and passwd),
# which `--delete` never touches. For a push it makes the destination's parent directory, as
# rsync before 3.2.3 has no --mkpath; `look` changes nothing (a dry run, the --delete guard).
PROBE = r"""
import json, os, pwd, shutil, stat, sys
path, mode = sys.argv[1], sys.argv[2]
if mode == "push":
    os.makedirs(os.path.dirname(path.rstrip("/")) or "/", exist_ok=True)
try:
    st = os.stat(path)
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
except FileNotFoundError:
    kind = "missing"
homes = {os.environ.get("HOME") or ""}
try:
    homes.add(pwd.getpwuid(os.getuid()).pw_dir)
except KeyError:
    pass
print(json.dumps({"rsync": shutil.which("rsync"), "kind": kind, "real": os.path.realpath(path),
                  "homes": sorted(h for h in homes if h)}))
"""


@dataclass(frozen=True)
class TransferStats:
    """What one transfer moved. ``bytes`` is file data actually sent; ``matched_bytes`` is
    data rsync found already there (an unchanged file, or a resumed partial one)."""

    method: str  # "rsync" | "tar"
    files: int  # files transferred (not the ones already up to date)
    bytes: int
    total_bytes: int  # size of everything the source holds
    matched_bytes: int = 0
    deleted: int = 0
    refused: tuple[Refusal, ...] = ()  # entries rsync did not create (the receiver's rules)


@dataclass(frozen=True)
class Finished:
    rc: int
    stdout: bytes  # empty when a sink consumed stdout
    stderr: bytes
    feed_error: BaseException | None = None
    sink_error: BaseException | None = None


#: Ctrl-C or SIGTERM: the local program gets SIGTERM and this long before SIGKILL: rsync
#: moves its temporary file into the partial directory on SIGTERM; SIGKILL would leave it as
#: garbage next to the user's files.
STOP_GRACE_S = 5.0


def run_piped(argv: t.Sequence[str], *, feed: t.Callable[[t.BinaryIO], None] | None = None,
              sink: t.Callable[[t.BinaryIO], None] | None = None,
              on_stdout: t.Callable[[bytes], None] | None = None,
              keep_bytes: int | None = None) -> Finished:
    """Run ``argv`` locally as a process group (:mod:`remote_payload.procgroup`); ``feed``
    writes its stdin (a thread), ``sink`` reads its stdout (this thread), else stdout is
    collected, chunk by chunk through ``on_stdout``; ``keep_bytes``: only its last that many
    bytes are kept (rsync names every file it sends). Its whole tree is ended before this
    returns or raises.

    ``LC_ALL=C`` so rsync's numbers are formatted the same way everywhere. Started from the
    main thread, the child gets SIGTERM when opsctl ends, however it ends (a SIGKILL mid-pull
    included: procgroup's ``die_with_parent``).
    """
    env = {**os.environ, "LC_ALL": "C"}
    # from another thread the death signal would come when that thread ends, so there the
    # tree is ended by this function's own clean-up only
    group = procgroup.Group(argv, env=env, stdin=procgroup.PIPE if feed else procgroup.DEVNULL,
                            die_with_parent=threading.current_thread() is threading.main_thread())
    stdout = t.cast(t.BinaryIO, os.fdopen(t.cast(int, group.out), "rb"))
    stderr = os.fdopen(t.cast(int, group.err), "rb")
    err: list[bytes] = []
    errors: dict[str, BaseException] = {}
    keep = limits.cap("CHILD_OUTPUT_BYTES")

    def read_stderr() -> None:
        # what ssh relays from the container: read to its end, only the last ``keep`` bytes
        # kept (rsync's own complaints come last; a chatty container must not fill memory)
        size = 0
        while chunk := stderr.read1(1 << 16):
            err.append(chunk)
            size += len(chunk)
            while size - len(err[0]) >= keep:
                size -= len(err.pop(0))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    writer = None
    if feed is not None:
        stdin = t.cast(t.BinaryIO, os.fdopen(t.cast(int, group.inp), "wb"))

        def write() -> None:
            try:
                feed(stdin)
            except BaseException as exc:  # BrokenPipe: the remote side died; stderr says why
                errors["feed"] = exc
            finally:
                try:
                    stdin.close()
                except OSError:
                    pass
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
    out: list[bytes] = []
    try:
        if sink is not None:
            try:
                sink(stdout)
            except Exception as exc:
                errors["sink"] = exc
                group.end(grace=0)
        else:
            kept = 0
            while chunk := stdout.read1(65536):  # type: ignore[attr-defined]
                out.append(chunk)
                kept += len(chunk)
                while keep_bytes is not None and len(out) > 1 and kept - len(out[0]) >= keep_bytes:
                    kept -= len(out.pop(0))
                if on_stdout is not None:
                    on_stdout(chunk)
        rc = group.wait()
    except BaseException:  # Ctrl-C: stop the local program, letting it clean up first
        group.end(grace=STOP_GRACE_S)
        raise
    finally:
        stdout.close()
    if writer is not None:
        writer.join(timeout=10)
    reader.join(timeout=10)
    group.end()  # what it started and left running (nothing, normally: a quick scan)
    stderr.close()
    return Finished(rc, b"".join(out), b"".join(err), errors.get("feed"), errors.get("sink"))
