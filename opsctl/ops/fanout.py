"""Run one function per key in parallel, with bounded concurrency and a deadline per key.

The result is fabric's ``GroupResult`` idea: a mapping key -> value or exception, with
``.ok`` and ``.failed`` views, so one bad host never hides the others' answers.

Why not fabric's ``ThreadingGroup``: it runs *one* command string on every connection, while
a fleet call runs different commands per host (a ``pct exec`` per container, each host's own
agent root), goes through opsctl's own :class:`~opsctl.remote.transport.Remote` (host-key
policy, connection multiplexer, pct failure classification), and needs a deadline per host.
Why not ``concurrent.futures``: its worker threads are joined at interpreter exit, so one host
that hangs past its deadline (a black-holed TCP connect, a stuck ``pct``) would keep the
command from exiting. Here every call runs in a daemon thread; a call past its deadline is
abandoned (its row says so) and its slot goes to the next key.
"""

from __future__ import annotations

import threading
import time
import typing as t
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

K = t.TypeVar("K", bound=Hashable)
V = t.TypeVar("V")


class Abandoned(Exception):
    """The call did not return within its deadline; its thread was left behind (daemon)."""

    def __init__(self, deadline_s: float):
        super().__init__(f"no answer within {deadline_s:g} s")
        self.deadline_s = deadline_s


@dataclass
class Results(Mapping[K, "V | BaseException"]):
    """key -> the call's return value or the exception it raised (or :class:`Abandoned`)."""

    by_key: dict[K, V | BaseException] = field(default_factory=dict)

    def __getitem__(self, key: K) -> V | BaseException:
        return self.by_key[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self.by_key)

    def __len__(self) -> int:
        return len(self.by_key)

    @property
    def ok(self) -> dict[K, V]:
        return {k: v for k, v in self.by_key.items() if not isinstance(v, BaseException)}

    @property
    def failed(self) -> dict[K, BaseException]:
        return {k: v for k, v in self.by_key.items() if isinstance(v, BaseException)}


def run_all(keys: Iterable[K], fn: Callable[[K], V], *, max_parallel: int,
            deadline_s: float) -> Results[K, V]:
    """``fn(key)`` for every key, at most ``max_parallel`` at once, each within ``deadline_s``.

    The deadline counts from the moment the key's call starts (a key waiting for a free slot
    is not charged). Exceptions are results, never raised here — except KeyboardInterrupt
    in the calling thread.

    Raises:
        ValueError: ``max_parallel`` < 1 or ``deadline_s`` <= 0.
    """
    if max_parallel < 1 or not deadline_s > 0:
        raise ValueError(f"max_parallel={max_parallel}, deadline_s={deadline_s}")
    order = list(dict.fromkeys(keys))
    pending = list(order)
    results: Results[K, V] = Results()
    cond = threading.Condition()
    finished: dict[K, V | BaseException] = {}
    started: dict[K, float] = {}

    def work(key: K) -> None:
        try:
            value: V | BaseException = fn(key)
        except BaseException as exc:  # a result, reported in its row
            value = exc
        with cond:
            finished[key] = value
            cond.notify()

    while pending or started:
        with cond:
            while pending and len(started) < max_parallel:
                key = pending.pop(0)
                started[key] = time.monotonic()
                threading.Thread(target=work, args=(key,), daemon=True,
                                 name=f"fanout-{key}").start()
            now = time.monotonic()
            next_deadline = min(s + deadline_s for s in started.values())
            if not any(k in finished for k in started):
                cond.wait(timeout=max(0.0, next_deadline - now))
            now = time.monotonic()
            for key in list(started):
                if key in finished:
                    results.by_key[key] = finished.pop(key)
                    del started[key]
                elif now - started[key] >= deadline_s:
                    results.by_key[key] = Abandoned(deadline_s)
                    del started[key]  # its slot is free again; a late answer is ignored
                    finished.pop(key, None)
    return Results({key: results.by_key[key] for key in order})  # in the order given
