"""Build, ship and verify ``remote_payload/`` in the container.

The payload travels as a tar stream on the stdin of one ``pct exec``; the
container side (:data:`UNPACK_SCRIPT`, a constant run by the container's
python3) checks every file against the sha256 manifest and only then switches
``payload -> payloads/<digest>`` with an atomic symlink rename. An unchanged
payload (same digest) is not sent again.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.config import paths

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


# Runs in the container as `python3 -c UNPACK_SCRIPT <root>`; stdin is the tar.gz.
# Constant text (never built from input); prints one JSON line.
UNPACK_SCRIPT = r"""
import hashlib, json, os, shutil, sys, tarfile, time
root = sys.argv[1]
store = os.path.join(root, "payloads")
os.makedirs(store, exist_ok=True)
tmp = os.path.join(store, ".incoming-%d" % os.getpid())
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
except (tarfile.TarError, OSError, EOFError) as e:
    fail("payload transfer broken: %s" % e)
man = json.load(open(os.path.join(tmp, "MANIFEST.json")))
seen = []
for rel, want in man["files"].items():
    p = os.path.join(tmp, rel)
    try:
        got = hashlib.sha256(open(p, "rb").read()).hexdigest()
    except OSError:
        fail("missing after transfer: " + rel)
    if got != want:
        fail("sha256 mismatch after transfer: %s (%s != %s)" % (rel, got[:12], want[:12]))
    seen.append(rel)
import compileall  # bytecode now, so every later agent call starts fast
compileall.compile_dir(tmp, quiet=2, workers=1)
final = os.path.join(store, man["digest"][:16])
if os.path.exists(final):
    shutil.rmtree(final)
os.rename(tmp, final)
link = os.path.join(root, "payload")
previous = os.path.realpath(link) if os.path.islink(link) else None
if os.path.exists(link) and not os.path.islink(link):
    shutil.rmtree(link)
tmp_link = link + ".tmp-%d" % os.getpid()
os.symlink(os.path.relpath(final, root), tmp_link)
os.replace(tmp_link, link)
keep = {os.path.realpath(final), previous}
for d in os.listdir(store):
    full = os.path.realpath(os.path.join(store, d))
    if full not in keep:
        shutil.rmtree(full, ignore_errors=True)
print(json.dumps({"ok": True, "digest": man["digest"], "files": len(seen), "path": final}))
"""
