"""Compiled bytecode for a torch env that cannot keep its own (issue 28: start-up).

Why: every start of the trainer imports ~2,200 modules of torch, dynamo and inductor. Where their
bytecode cannot be cached next to the sources (``PYTHONDONTWRITEBYTECODE`` set, as many container
images do, or a read-only env) and none was shipped with them, Python compiles them all from
source again at every start: on the H200 machine (2026-12-02) a warm restart spent ~9.6 s of its
~25 s in ``compile()``, and each of inductor's compile workers pays the same again. Python's own
``sys.pycache_prefix`` (``PYTHONPYCACHEPREFIX``) keeps bytecode in a separate tree instead: the
trainer points it at the torch build's cache folder (``OPSCTL_CACHE_DIR``, which the agent gives
every job) before torch is imported, and exports it to the processes it starts. Nothing is ever
written next to the sources, so a tree stays as clean as ``PYTHONDONTWRITEBYTECODE`` asked;
``OPSCTL_PYCACHE=off`` leaves Python's behaviour exactly as configured.

Nothing changes where bytecode is already cached or can be (a writable env: Python writes it
there itself), or where the user chose a prefix. A failure here only costs the speed-up: the
trainer starts either way.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
import typing as t

from .. import wire

ENV_SWITCH = "OPSCTL_PYCACHE"  # "off": leave Python's bytecode caching alone
SUBDIR = "pycache"


def cache_bytecode(package: str = "torch",
                   environ: t.MutableMapping[str, str] | None = None) -> str | None:
    """Keep bytecode under the cache folder when ``package``'s cannot be kept next to it.

    Returns the prefix now in use, or None when nothing was changed."""
    env = os.environ if environ is None else environ
    if env.get(ENV_SWITCH, "").strip().lower() in ("off", "0", "no") or sys.pycache_prefix:
        return None
    try:
        spec = importlib.util.find_spec(package)  # locates a top-level package, imports nothing
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    if _keeps_its_own(spec.origin):
        return None
    base = env.get(wire.ENV_CACHE_DIR) or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "opsctl")
    prefix = os.path.join(base, SUBDIR)
    try:
        os.makedirs(prefix, exist_ok=True)
    except OSError:
        return None
    if not os.access(prefix, os.W_OK | os.X_OK):
        return None
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False
    env["PYTHONPYCACHEPREFIX"] = prefix  # ranks, compile workers and torchrun children
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return prefix


def _keeps_its_own(source: str) -> bool:
    """Whether Python finds or writes ``source``'s bytecode next to it without help."""
    if pyc_is_current(importlib.util.cache_from_source(source), source):
        return True
    return not sys.dont_write_bytecode and os.access(os.path.dirname(source), os.W_OK | os.X_OK)


def pyc_is_current(pyc: str, source: str) -> bool:
    """Whether ``pyc`` is bytecode Python would load for ``source`` as it is now (PEP 552
    header: magic, flags, then the source's mtime and size, or a hash Python trusts)."""
    try:
        with open(pyc, "rb") as f:
            head = f.read(16)
        st = os.stat(source)
    except OSError:
        return False
    return header_matches(head, int(st.st_mtime), st.st_size)


def header_matches(head: bytes, mtime: int, size: int) -> bool:
    """The 16-byte pyc header ``head`` against the source's mtime and size."""
    if len(head) < 16 or head[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags, word1, word2 = t.cast(tuple[int, int, int], struct.unpack("<III", head[4:16]))
    if flags & 0b1:  # hash-based (PEP 552): Python trusts it, or checks the hash itself
        return True
    return flags == 0 and word1 == mtime & 0xFFFFFFFF and word2 == size & 0xFFFFFFFF
