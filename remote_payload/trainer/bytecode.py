"""Compiled bytecode for a torch env that cannot keep its own (it shortens the start-up).

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

A cold prefix (the first start in a new cache folder) is filled in parallel: while this process
imports torch on one core, a ``compileall`` child compiles torch, triton and sympy on the
others (:func:`prime`). On the H200 machine a cold start reached its process group 7.5 s later
than a warm one (2026-12-02), all of it ``compile()`` on one core. Python's own atomic writes
make the two writers safe: each pyc appears whole or not at all, and whichever comes first is
used. One primer per prefix (a lock the primer alone holds: :func:`drive`), none on machines of under
:data:`PRIME_MIN_CPUS` cores, where it would only take the importing core's time.

Nothing changes where bytecode is already cached or can be (a writable env: Python writes it
there itself), or where the user chose a prefix. A failure here only costs the speed-up: the
trainer starts either way.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import signal
import struct
import sys
import time
import typing as t

from .. import procgroup, wire

ENV_SWITCH = "OPSCTL_PYCACHE"  # "off": leave Python's bytecode caching alone
SUBDIR = "pycache"
#: what the trainer imports at start, largest first: the packages a cold prefix is filled with
PRIME_PACKAGES = ("torch", "triton", "sympy")
#: never imported by the trainer, and much of torch's and sympy's sources
PRIME_SKIP = r"[/\\](testing[/\\]_internal|tests?)[/\\]"
PRIME_MIN_CPUS = 4
_PRIME_LOCK = ".priming"


def cache_bytecode(package: str = "torch",
                   environ: t.MutableMapping[str, str] | None = None) -> str | None:
    """Keep bytecode under the cache folder when ``package``'s cannot be kept next to it.

    Returns the prefix now in use, or None when nothing was changed."""
    env = os.environ if environ is None else environ
    if env.get(ENV_SWITCH, "").strip().lower() in ("off", "0", "no") or sys.pycache_prefix:
        return None
    found = _source(package)
    if found is None or _keeps_its_own(found[0]):
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
    cpus = os.cpu_count() or 1
    prime(prefix, env, cpus - 2 if cpus >= PRIME_MIN_CPUS else 0)
    return prefix


def prime(prefix: str, environ: t.Mapping[str, str], workers: int,
          packages: t.Sequence[str] | None = None) -> procgroup.Group | None:
    """Compile the bytecode of those ``packages`` (None: :data:`PRIME_PACKAGES`) that have
    none in ``prefix`` yet (it is ``sys.pycache_prefix`` by then) on ``workers`` processes,
    in a primer (:func:`drive`) that this process does not wait for. Returns the primer, or
    None when none was started: no workers, no package that needs it, or another primer
    holds the prefix."""
    if workers < 1:
        return None
    names = PRIME_PACKAGES if packages is None else packages
    roots = [root for name in names if (root := _cold(name)) is not None]
    if not roots:
        return None
    try:
        lock = os.open(os.path.join(prefix, _PRIME_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                       0o644)
    except OSError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # handed to the primer, which alone
        argv = [sys.executable, "-c", _DRIVER, _PAYLOAD_ROOT, str(os.getpid()), prefix,  # keeps it
                str(workers), *roots]
        return procgroup.Group(argv, env={**environ, "PYTHONPYCACHEPREFIX": prefix},
                               stdout=procgroup.DEVNULL, stderr=procgroup.DEVNULL,
                               hand_over={_LOCK_FD: lock})
    except OSError:  # held by another primer, or no process to be had: only the speed-up
        return None
    finally:
        os.close(lock)


_PAYLOAD_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DRIVER = ("import sys; sys.path.insert(0, sys.argv[1]); "
           "from remote_payload.trainer.bytecode import drive; sys.exit(drive(sys.argv[2:]))")
_PR_SET_PDEATHSIG = 1
_LOCK_FD = 3  # where the primer finds the prefix's lock, taken by :func:`prime`


def drive(args: t.Sequence[str]) -> int:
    """The primer: ``PARENT_PID PREFIX WORKERS ROOT...``. Holds the prefix's lock alone (taken
    by :func:`prime` and handed over as fd 3, close-on-exec here, so neither ``compileall``
    nor its workers ever hold it), runs
    ``compileall`` as a process group of its own (:mod:`remote_payload.procgroup`) and ends
    that whole group when it is itself ended (SIGTERM, SIGHUP, Ctrl-C, or its parent's end:
    the kernel's parent-death signal). Killed outright (SIGKILL), it lets go of the lock with
    its last breath; workers it left behind carry the token recorded in the lock file, and
    the next primer ends them before it starts its own. When ``compileall`` itself ends first
    (a SIGKILL of it alone), its workers are ended with it: the group is ended whenever the
    wait for it ends. Returns compileall's exit status (128 + N after signal N; 0: another
    primer holds the prefix)."""
    parent, prefix, workers, roots = int(args[0]), args[1], int(args[2]), list(args[3:])
    procgroup.install_signal_handlers()
    del prefix  # named for ps; the lock came as fd _LOCK_FD, already taken
    lock = _LOCK_FD
    os.set_inheritable(lock, False)  # compileall and its workers never hold it
    try:
        _die_with(parent)
        for token in os.read(lock, 4096).decode("ascii", "replace").split():
            procgroup.signal_marked(token, signal.SIGKILL)  # a killed primer's workers
        argv = [sys.executable, "-m", "compileall", "-q", "-j", str(workers), "-x", PRIME_SKIP,
                *roots]
        child = procgroup.Group(argv, stdout=procgroup.DEVNULL, stderr=procgroup.DEVNULL)
        os.ftruncate(lock, 0)
        os.pwrite(lock, f"{child.token}\n".encode(), 0)
        try:
            while not child.exited():  # unreaped until its tree is ended: see Group.end
                time.sleep(0.1)
        finally:
            child.end()
        rc = t.cast(int, child.returncode)
        return 128 - rc if rc < 0 else rc  # an exit status: 128 + N after signal N
    except procgroup.Terminated as exc:
        return exc.code
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        os.close(lock)  # the last holder: the lock is free


def _die_with(parent: int) -> None:
    """SIGTERM to this process when ``parent`` ends (Linux ``PR_SET_PDEATHSIG``)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # no prctl: the primer may outlive its parent
        return
    if os.getppid() != parent:  # it ended before the signal was asked for
        raise procgroup.Terminated(signal.SIGTERM)  # as the signal would have ended this


def _cold(package: str) -> str | None:
    """``package``'s folder when the prefix (``sys.pycache_prefix``, set by then) holds no
    current bytecode of its ``__init__``, else None."""
    found = _source(package)
    if found is None or not found[1]:
        return None
    origin = found[0]
    if pyc_is_current(importlib.util.cache_from_source(origin), origin):
        return None
    return os.path.dirname(origin)


def _source(name: str) -> tuple[str, bool] | None:
    """``name``'s ``.py`` source and whether it is a package's ``__init__`` (located, not
    imported), or None when Python would not load it from a ``.py`` source."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return spec.origin, bool(spec.submodule_search_locations)


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
