"""What ``opsctl push``/``pull`` share below the use case: the container probe, the stats a
transfer reports, and running a local program (rsync, or the OpenSSH client for the tar
fallback's data stream: bulk data only, :mod:`.tarcopy` says why) with its pipes streamed —
never buffered whole, as a transfer can be many gigabytes.
"""

from __future__ import annotations

import os
import subprocess
import threading
import typing as t
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Finished:
    rc: int
    stdout: bytes  # empty when a sink consumed stdout
    stderr: bytes
    feed_error: BaseException | None = None
    sink_error: BaseException | None = None


def _stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` s: rsync moves its temporary file into the
    partial directory on SIGTERM; SIGKILL would leave it as garbage next to the user's files."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_piped(argv: t.Sequence[str], *, feed: t.Callable[[t.BinaryIO], None] | None = None,
              sink: t.Callable[[t.BinaryIO], None] | None = None,
              on_stdout: t.Callable[[bytes], None] | None = None) -> Finished:
    """Run ``argv`` locally; ``feed`` writes its stdin (a thread), ``sink`` reads its stdout
    (this thread), else stdout is collected, chunk by chunk through ``on_stdout``.

    ``LC_ALL=C`` so rsync's numbers are formatted the same way everywhere.
    """
    env = {**os.environ, "LC_ALL": "C"}
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if feed else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    stdout, stderr = t.cast(t.BinaryIO, proc.stdout), t.cast(t.BinaryIO, proc.stderr)
    err: list[bytes] = []
    errors: dict[str, BaseException] = {}
    reader = threading.Thread(target=lambda: err.append(stderr.read()), daemon=True)
    reader.start()
    writer = None
    if feed is not None:
        stdin = t.cast(t.BinaryIO, proc.stdin)

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
                proc.kill()
        else:
            while chunk := stdout.read1(65536):  # type: ignore[attr-defined]
                out.append(chunk)
                if on_stdout is not None:
                    on_stdout(chunk)
        rc = proc.wait()
    except BaseException:  # Ctrl-C: stop the local program, letting it clean up first
        _stop(proc)
        raise
    if writer is not None:
        writer.join(timeout=10)
    reader.join(timeout=10)
    return Finished(rc, b"".join(out), b"".join(err), errors.get("feed"), errors.get("sink"))
