"""One process-wide lock for torch.compile work done from threads.

Why: up to torch 2.13 ``torch.fx._symbolic_trace._is_fx_tracing_flag`` is a
plain module global. While one thread compiles (AOTAutograd's ``make_fx`` sets
the flag), any other thread that calls an already-compiled function raises
``Detected that you are using FX to symbolically trace a dynamo-optimized
function`` or the process hangs (see DESIGN.md §1). Serialising every compile
(first call, each new shape, first backward) behind this lock avoids both.

Stdlib only: importing this module must not import torch.
"""

from __future__ import annotations

import contextlib
import threading
import typing as t

#: The one lock. Re-entrant so a guarded function may call another guarded one.
COMPILE_LOCK = threading.RLock()


@contextlib.contextmanager
def serialized_compile() -> t.Iterator[None]:
    """Hold the process-wide compile lock for the duration of the block."""
    with COMPILE_LOCK:
        yield


F = t.TypeVar("F", bound=t.Callable[..., t.Any])


def guard_first_calls(fn: F, key: t.Callable[..., t.Hashable] | None = None) -> F:
    """Wrap a compiled callable so its first call per ``key(*args)`` holds the lock.

    ``key`` maps the call's arguments to a shape signature (default: one key for
    all calls). Later calls with a seen key run unlocked, so steady-state
    throughput is unaffected; backward passes triggered outside still need the
    caller to hold :func:`serialized_compile` around the first ``.backward()``.
    """
    seen: set[t.Hashable] = set()

    def wrapper(*args: t.Any, **kwargs: t.Any) -> t.Any:
        k = key(*args, **kwargs) if key is not None else None
        if k in seen:
            return fn(*args, **kwargs)
        with COMPILE_LOCK:
            out = fn(*args, **kwargs)
            seen.add(k)
            return out

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return t.cast(F, wrapper)
