"""One process-wide lock for torch.compile work done from threads.

Why: up to torch 2.13 ``torch.fx._symbolic_trace._is_fx_tracing_flag`` is a
plain module global. While one thread compiles (AOTAutograd's ``make_fx`` sets
the flag), any other thread that calls an already-compiled function raises
``Detected that you are using FX to symbolically trace a dynamo-optimized
function`` or the process hangs (docs/troubleshooting.md, "Never silent: probe, stacks, diagnosis").
Serialising every compile
(first call, each new shape, first backward) behind this lock avoids the
compile-vs-compile race.

The lock alone does not cover a thread that makes *warm* compiled calls while
another thread compiles: on the H200 exactly that warm caller raised the error
(``tests/fixtures/h200-torch-2.11.0-cu130/fx-race-error-*.txt``). Wrap warm calls
in :func:`compiled_call` (shared among callers, exclusive against
:func:`serialized_compile`) or use :func:`guard_first_calls`, which does both.

Stdlib only: importing this module must not import torch.
"""

from __future__ import annotations

import contextlib
import threading
import typing as t

#: The one lock. Re-entrant so a guarded function may call another guarded one.
COMPILE_LOCK = threading.RLock()


class _WarmGate:
    """Shared for warm compiled calls, closed while a compile holds :data:`COMPILE_LOCK`.

    Writer-preferring: once a compile is waiting, new warm calls wait too, so a
    thread stepping in a tight loop cannot starve another thread's compile.
    A thread inside a warm call may itself compile (a new shape): its own warm
    calls do not block its compile.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers: dict[int, int] = {}  # thread ident -> nesting depth
        self._writer: int | None = None
        self._writer_depth = 0
        self._writers_waiting = 0

    @contextlib.contextmanager
    def shared(self) -> t.Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            # re-entrant for a thread already inside (as reader or writer); else wait for
            # no compile running and none waiting
            while not (self._writer == me or me in self._readers
                       or (self._writer is None and not self._writers_waiting)):
                self._cond.wait()
            self._readers[me] = self._readers.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._readers[me] -= 1
                if not self._readers[me]:
                    del self._readers[me]
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> t.Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._writer_depth += 1
            else:
                self._writers_waiting += 1
                try:
                    while self._writer is not None or any(
                            tid != me for tid in self._readers):
                        self._cond.wait()
                finally:
                    self._writers_waiting -= 1
                self._writer, self._writer_depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._writer_depth -= 1
                if not self._writer_depth:
                    self._writer = None
                self._cond.notify_all()


_GATE = _WarmGate()


@contextlib.contextmanager
def serialized_compile() -> t.Iterator[None]:
    """Hold the process-wide compile lock (and keep warm compiled calls out) for the block.

    The gate is taken before :data:`COMPILE_LOCK` so a thread compiling from inside its
    own warm call cannot deadlock with another thread waiting to compile. Two threads
    that *both* compile from inside warm calls at the same time still would: compile
    new shapes outside :func:`compiled_call`.
    """
    with _GATE.exclusive(), COMPILE_LOCK:
        yield


@contextlib.contextmanager
def compiled_call() -> t.Iterator[None]:
    """Around a *warm* compiled call: runs concurrently with other warm calls, never
    while another thread is inside :func:`serialized_compile`."""
    with _GATE.shared():
        yield


F = t.TypeVar("F", bound=t.Callable[..., t.Any])


def guard_first_calls(fn: F, key: t.Callable[..., t.Hashable] | None = None) -> F:
    """Wrap a compiled callable: its first call per ``key(*args)`` compiles under the lock.

    ``key`` maps the call's arguments to a shape signature (default: one key for
    all calls). Later calls with a seen key run as :func:`compiled_call` (in
    parallel with each other, paused only while some thread compiles). Backward
    passes triggered outside still need the caller to hold
    :func:`serialized_compile` around the first ``.backward()``.
    """
    seen: set[t.Hashable] = set()

    def wrapper(*args: t.Any, **kwargs: t.Any) -> t.Any:
        k = key(*args, **kwargs) if key is not None else None
        if k in seen:
            with compiled_call():
                return fn(*args, **kwargs)
        with serialized_compile():
            out = fn(*args, **kwargs)
            seen.add(k)
            return out

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return t.cast(F, wrapper)
