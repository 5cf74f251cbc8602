"""Compile-cache fingerprint of a build: torch (with local tag), CUDA, Triton, GPU, Python.

Computing it imports torch in the build's python (seconds), so the result is cached in
the build's venv, keyed by the stat of torch's ``version.py`` and the GPU device nodes:
status and launch then read one small JSON file.
"""

from __future__ import annotations

import glob
import json
import os
import re
import typing as t

from remote_payload import procgroup
from remote_payload.agent.common import AgentFailure, read_json, write_json_atomic
from remote_payload.agent.torchenv.procs import clean_env
from remote_payload.wire import ErrorType

FACTS_FILE = ".opsctl-fingerprint.json"
INSPECT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inspect_torch.py")
_UNSAFE = re.compile(r"[^A-Za-z0-9.+_-]+")


def fingerprint_of(facts: t.Mapping[str, t.Any]) -> str:
    """Readable directory name, e.g. ``torch2.11.0+cu130-cuda13.0-tritonnone-NVIDIA_H200-py3.11.7``."""
    parts = [f"torch{facts.get('torch')}", f"cuda{facts.get('cuda') or 'none'}",
             f"triton{facts.get('triton') or 'none'}", str(facts.get("gpu") or "nogpu"),
             f"py{facts.get('python')}"]
    return "-".join(_UNSAFE.sub("_", p) for p in parts)


def _stat_key(build_dir: str) -> list[t.Any]:
    """Changes when torch is reinstalled in the venv or the visible GPUs change."""
    key: list[t.Any] = [os.path.realpath(build_dir)]
    for path in sorted(glob.glob(os.path.join(build_dir, "lib", "python3*", "site-packages",
                                              "torch", "version.py"))):
        st = os.stat(path)
        key.append([path, st.st_mtime_ns, st.st_size, st.st_ino])
    key.append(sorted(os.path.basename(p) for p in glob.glob("/dev/nvidia[0-9]*")))
    return key


def probe_facts(python: str, *, timeout_s: float = 180.0) -> dict[str, t.Any]:
    """Run ``inspect_torch.py --facts`` with ``python``.

    Raises
    ------
    AgentFailure
        ``TorchFactsFailed`` when torch does not import or the probe prints no result.
    """
    try:
        done = procgroup.run([python, "-I", INSPECT_SCRIPT, "--facts"], timeout_s,
                             env=clean_env())
    except procgroup.ChildTimeout as exc:
        raise AgentFailure(ErrorType.TorchFactsFailed,
                           f"torch facts with {python}: no answer within {timeout_s:g} s",
                           python=python, rc=exc.finished.rc,
                           stderr_tail=exc.finished.err.decode("utf-8", "replace")[-2000:]
                           ) from None
    result = parse_inspect_output(done.out.decode("utf-8", "replace"))
    if done.rc != 0 or result is None or "facts" not in result:
        raise AgentFailure(ErrorType.TorchFactsFailed, f"cannot read torch facts with {python}",
                           python=python, rc=done.rc,
                           stderr_tail=done.err.decode("utf-8", "replace")[-2000:])
    return dict(result["facts"])


def parse_inspect_output(stdout: str) -> dict[str, t.Any] | None:
    from remote_payload.agent.torchenv.inspect_torch import PREFIX

    for line in reversed(stdout.splitlines()):
        if line.startswith(PREFIX):
            try:
                data = json.loads(line[len(PREFIX):])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def store_facts(build_dir: str, facts: t.Mapping[str, t.Any]) -> None:
    write_json_atomic(os.path.join(build_dir, FACTS_FILE),
                      {"key": _stat_key(build_dir), "facts": dict(facts)})


def build_facts(build_dir: str) -> dict[str, t.Any]:
    """Cached facts of the build in ``build_dir`` (probing only when the key changed)."""
    cached = read_json(os.path.join(build_dir, FACTS_FILE), default=None)
    key = json.loads(json.dumps(_stat_key(build_dir)))  # lists, as read back from JSON
    if isinstance(cached, dict) and cached.get("key") == key and isinstance(cached.get("facts"),
                                                                            dict):
        return dict(cached["facts"])
    facts = probe_facts(os.path.join(build_dir, "bin", "python"))
    store_facts(build_dir, facts)
    return facts
