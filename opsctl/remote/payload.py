"""Build, ship and verify ``remote_payload/`` in the container.

The payload travels as a tar stream on the stdin of one ``pct exec``; the
container side (:data:`UNPACK_SCRIPT`, a constant run by the container's
python3) unpacks it into a directory private to that transfer, checks every
file against the sha256 manifest and only then switches
``payload -> payloads/<digest>`` with an atomic symlink rename. An unchanged
payload (same digest) is not sent again, and a payload directory a live job
runs from is never removed or rewritten (jobs are bound to the resolved
``payloads/<digest>``, see the agent's ``launch``).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.config import paths
from opsctl.remote import command

_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


@dataclass(frozen=True)
class Manifest:
    files: dict[str, str]  # relpath (under the payload dir) -> sha256
    digest: str
    contents: dict[str, tuple[bytes, int]] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> bytes:
        return json.dumps({"files": self.files, "digest": self.digest}, indent=1,
                          sort_keys=True).encode()


def build_manifest(src: Path | None = None) -> Manifest:
    """Snapshot the payload: each file is read once, so what is hashed is what is sent."""
    src = src or paths.payload_source()
    files: dict[str, str] = {}
    contents: dict[str, tuple[bytes, int]] = {}
    for path in sorted(src.rglob("*")):
        rel_parts = path.relative_to(src).parts
        if any(p in _SKIP_DIRS for p in rel_parts) or path.suffix in _SKIP_SUFFIXES:
            continue
        if path.is_file():
            rel = "/".join((src.name, *rel_parts))
            data = path.read_bytes()
            files[rel] = hashlib.sha256(data).hexdigest()
            contents[rel] = (data, path.stat().st_mode & 0o777)
    digest = hashlib.sha256("\n".join(f"{k} {v}" for k, v in files.items()).encode()).hexdigest()
    return Manifest(files=files, digest=digest, contents=contents)


def tar_bytes(manifest: Manifest) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for rel, (data, mode) in [("MANIFEST.json", (manifest.to_json(), 0o644)),
                                  *manifest.contents.items()]:
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# Runs in the container as `python3 -c UNPACK_SCRIPT <root>` (command.standalone: the
# shared /proc and bounded readers travel with it); stdin is the tar.gz.
# Constant text (never built from input); prints one JSON line.
#
# Rules: a transfer unpacks into its own private directory (mkdtemp), so two
# concurrent deploys never see each other's files; payloads/<digest> is content-addressed
# and never rewritten once it exists and verifies; the rename, the symlink switch and the
# pruning run under payloads/.lock; and a payload directory some live process still uses
# (its cwd or PYTHONPATH, or a live job's launch.json) is never removed.
_UNPACK_MAIN = r"""
import fcntl, hashlib, json, os, re, shutil, sys, tarfile, tempfile, time
from remote_payload import boundedread, procfs
root = sys.argv[1]
store = os.path.join(root, "payloads")
os.makedirs(store, exist_ok=True)
real_store = os.path.realpath(store)
tmp = tempfile.mkdtemp(prefix=".incoming-", dir=store)
os.chmod(tmp, 0o755)
def fail(msg):
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"ok": False, "error": msg})); sys.exit(3)
try:
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|gz") as tar:
        for m in tar:
            name = os.path.normpath(m.name)
            if name.startswith(("/", "..")) or not (m.isfile() or m.isdir()):
                fail("unsafe member in payload: %r" % m.name)
            tar.extract(m, tmp, set_attrs=False)
    man = json.load(open(os.path.join(tmp, "MANIFEST.json")))
except (tarfile.TarError, OSError, EOFError, ValueError) as e:
    fail("payload transfer broken: %s" % e)
shipped_manifest = open(os.path.join(tmp, "MANIFEST.json"), "rb").read()
def verify(d):
    try:
        if open(os.path.join(d, "MANIFEST.json"), "rb").read() != shipped_manifest:
            return "MANIFEST.json differs"
    except OSError:
        return "MANIFEST.json missing"
    for rel, want in man["files"].items():
        try:
            got = hashlib.sha256(open(os.path.join(d, rel), "rb").read()).hexdigest()
        except OSError:
            return "missing after transfer: " + rel
        if got != want:
            return "sha256 mismatch after transfer: %s (%s != %s)" % (rel, got[:12], want[:12])
    return None
bad = verify(tmp)
if bad:
    fail(bad)
import compileall  # bytecode now, so every later agent call starts fast
compileall.compile_dir(tmp, quiet=2, workers=1)
def top(path):
    # the payloads/<name> a path lies in, or None
    path = os.path.realpath(path)
    if not path.startswith(real_store + os.sep):
        return None
    return path[len(real_store) + 1:].split(os.sep, 1)[0]
def alive(pid, ticks):
    return isinstance(pid, int) and procfs.alive(pid, ticks if isinstance(ticks, int) else None)
def record(path):
    # one of the agent's records (a link there is refused, not followed; 8 MiB at most)
    return json.loads(boundedread.read_regular(path, 8 << 20))
def in_use():
    used = set()
    for pid in procfs.pids():
        cwd = procfs.link(pid, "cwd")
        if cwd is None:
            continue
        used.add(top(cwd))
        for var in procfs.environ_entries(pid):
            if var.startswith(b"PYTHONPATH="):
                for p in var[11:].decode("utf-8", "replace").split(os.pathsep):
                    used.add(top(p))
    jobs = os.path.join(root, "jobs")
    for j in (os.listdir(jobs) if os.path.isdir(jobs) else []):
        try:
            launch = record(os.path.join(jobs, j, "launch.json"))
        except (OSError, ValueError):
            continue
        name = top(launch.get("payload_dir") or "")
        if name is None or name in used:
            continue
        try:
            pid = record(os.path.join(jobs, j, "pid"))
        except (OSError, ValueError):
            pid = None
        try:  # a queued job runs this payload when it starts
            queued = record(os.path.join(jobs, j, "status.json")).get("state") == "QUEUED"
        except (OSError, ValueError, AttributeError):
            queued = False
        if queued:
            live = True
        elif pid is None:  # launched, the wrapper has not recorded its start yet
            live = time.time() - float(launch.get("created_at") or 0) < 120
        else:
            live = alive(pid.get("wrapper_pid"), pid.get("wrapper_start_ticks")) or alive(
                pid.get("pid"), pid.get("start_ticks"))
        if live:
            used.add(name)
    used.discard(None)
    return used
final = os.path.join(store, man["digest"][:16])
# the names opsctl gives what it puts in payloads/: a digest, a transfer's private directory,
# a damaged copy set aside
ours = re.compile(r"[0-9a-f]{16}|\.incoming-[A-Za-z0-9_]+|\.damaged-[0-9]+-[0-9a-f]{16}")
with open(os.path.join(store, ".lock"), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.isdir(final) and verify(final) is None:
        shutil.rmtree(tmp, ignore_errors=True)  # the same bytes are there: never rewrite them
    else:
        if os.path.lexists(final):  # damaged: set it aside (a process may still hold it)
            os.rename(final, os.path.join(store, ".damaged-%d-%s" % (time.time(), man["digest"][:16])))
        os.rename(tmp, final)
    link = os.path.join(root, "payload")
    previous = top(link) if os.path.islink(link) else None
    if os.path.lexists(link) and not os.path.islink(link):  # someone's own: never removed
        fail("%s is not the link opsctl keeps there; nothing was removed: move it away, "
             "or set root: to a directory of opsctl's own" % link)
    tmp_link = link + ".tmp-%d" % os.getpid()
    os.symlink(os.path.relpath(final, root), tmp_link)
    os.replace(tmp_link, link)
    keep = {os.path.basename(final), previous} | in_use()
    kept = sorted(k for k in keep if k)
    for d in os.listdir(store):
        full = os.path.join(store, d)
        # only what opsctl makes here: a payloads/ that is a link to a disk or a home
        # holds the user's own directories beside them
        if d in keep or not ours.fullmatch(d) or not os.path.isdir(full):
            continue
        if d.startswith(".") and time.time() - os.path.getmtime(full) < 3600:
            continue  # another transfer's private dir (or a recent leftover): not ours
        shutil.rmtree(full, ignore_errors=True)
print(json.dumps({"ok": True, "digest": man["digest"], "files": len(man["files"]), "path": final,
                  "kept": kept}))
"""
UNPACK_SCRIPT = command.standalone(_UNPACK_MAIN, "<opsctl payload unpack>")
