"""Stream a local wheelhouse into the container (air-gapped torch builds).

Only the wheels the container lacks (by name and size) travel, as one uncompressed tar on
the stdin of one ``pct exec``; the container side writes each atomically and answers with
its sha256, which is checked here.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import threading
import time
import typing as t
from pathlib import Path

from opsctl.errors import RemoteCommandFailed, ReplyShapeError
from opsctl.remote import shapes
from opsctl.remote.agent_client import Agent
from opsctl.remote.transport import save_log
from remote_payload.wire_shapes import WheelListDoc, WheelsReceivedDoc

Progress = t.Callable[[str], None]

# Runs in the container: `python3 -c LIST_SCRIPT <dir>` -> {"name": size} of the wheels there.
LIST_SCRIPT = r"""
import json, os, sys
d = sys.argv[1]
out = {}
if os.path.isdir(d):
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if n.endswith(".whl") and os.path.isfile(p):
            out[n] = os.path.getsize(p)
print(json.dumps(out))
"""

# Runs in the container: stdin is an uncompressed tar of wheels; each lands atomically in <dir>.
RECEIVE_SCRIPT = r"""
import hashlib, json, os, sys, tarfile
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
got = {}
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
    for m in tar:
        name = os.path.basename(m.name)
        if not m.isfile() or name != m.name or not name.endswith(".whl"):
            print(json.dumps({"ok": False, "error": "unexpected member %r" % m.name})); sys.exit(3)
        src = tar.extractfile(m)
        tmp = os.path.join(d, ".incoming-" + name)
        h = hashlib.sha256()
        with open(tmp, "wb") as f:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                h.update(b); f.write(b)
        os.replace(tmp, os.path.join(d, name))
        got[name] = h.hexdigest()
print(json.dumps({"ok": True, "files": got}))
"""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def push_wheels(agent: Agent, files: t.Sequence[Path], dest: str,
                progress: Progress | None = None) -> dict[str, t.Any]:
    """Stream the wheels the container lacks (by name and size) into ``dest``; verify sha256.

    Raises:
        RemoteCommandFailed: transfer or checksum failed (output saved).
    """
    r = agent.remote.pct_exec(agent.ctid, [agent.python, "-c", LIST_SCRIPT, dest], timeout=30,
                              step="list wheelhouse")
    where = agent.remote.host.target_label(agent.ctid)
    try:  # what is there is only a shortcut: an answer that is no list sends every wheel
        have: dict[str, int] = shapes.parse_doc(WheelListDoc, r.stdout or b"{}",
                                                where=f"{where}: list wheelhouse")
    except ReplyShapeError:
        have = {}
    missing = [f for f in files if have.get(f.name) != f.stat().st_size]
    total = sum(f.stat().st_size for f in missing)
    if not missing:
        return {"sent": 0, "bytes": 0, "present": len(files)}
    if progress:
        progress(f"streaming {len(missing)} wheels ({total / 1e6:.0f} MB) into the container")
    rfd, wfd = os.pipe()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(wfd, "wb") as w, tarfile.open(fileobj=w, mode="w|") as tar:
                for f in missing:
                    tar.add(str(f), arcname=f.name)
        except BaseException as exc:  # surfaced below; the reader sees EOF
            errors.append(exc)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    start = time.monotonic()
    with os.fdopen(rfd, "rb") as reader:
        res = agent.remote.pct_exec(agent.ctid, [agent.python, "-c", RECEIVE_SCRIPT, dest],
                                    timeout=1800, stdin=reader, step="push wheels")
    writer.join()
    lines = res.stdout.strip().splitlines()
    try:
        doc: WheelsReceivedDoc = shapes.parse_doc(WheelsReceivedDoc, lines[-1] if lines else b"",
                                                  where=f"{where}: push wheels")
    except ReplyShapeError as exc:
        doc = {"ok": False, "error": "no reply" if not lines else str(exc)}
    bad = [f.name for f in missing if doc.get("files", {}).get(f.name) != _sha256(f)]
    if res.rc != 0 or not doc.get("ok") or bad or errors:
        path = save_log("push-wheels", res)
        why = doc.get("error") or (f"checksum mismatch: {bad[:3]}" if bad else
                                   (repr(errors[0]) if errors else res.stderr_tail(1)))
        raise RemoteCommandFailed(
            f"{agent.remote.host.target_label(agent.ctid)}: wheel transfer failed: {why}",
            log_path=str(path))
    return {"sent": len(missing), "bytes": total, "present": len(files) - len(missing),
            "seconds": round(time.monotonic() - start, 2)}
