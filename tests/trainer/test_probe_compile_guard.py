"""compile_guard: compiles are exclusive, warm compiled calls share, nobody deadlocks."""

from __future__ import annotations

import threading
import time

from remote_payload.compile_guard import (
    COMPILE_LOCK,
    compiled_call,
    guard_first_calls,
    serialized_compile,
)

WAIT = 5.0


def in_thread(fn: object) -> threading.Thread:
    th = threading.Thread(target=fn, daemon=True)  # type: ignore[arg-type]
    th.start()
    return th


def test_warm_calls_run_concurrently_with_each_other() -> None:
    both_inside = threading.Barrier(2, timeout=WAIT)

    def warm() -> None:
        with compiled_call():
            both_inside.wait()  # would time out if warm calls were serialized

    threads = [in_thread(warm), in_thread(warm)]
    for th in threads:
        th.join(WAIT)
    assert not any(th.is_alive() for th in threads)
    assert not both_inside.broken


def test_a_warm_call_waits_while_another_thread_compiles() -> None:
    compiling, release = threading.Event(), threading.Event()
    order: list[str] = []

    def compiler() -> None:
        with serialized_compile():
            compiling.set()
            release.wait(WAIT)
            order.append("compile done")

    def warm() -> None:
        with compiled_call():
            order.append("warm call")

    c = in_thread(compiler)
    assert compiling.wait(WAIT)
    w = in_thread(warm)
    time.sleep(0.1)  # scenario: a window for the warm call to enter, which it must not
    assert order == [], "the warm call must not enter while a compile runs"
    release.set()
    c.join(WAIT)
    w.join(WAIT)
    assert order == ["compile done", "warm call"]


def test_a_compile_waits_for_warm_calls_and_new_warm_calls_queue_behind_it() -> None:
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def long_warm() -> None:
        with compiled_call():
            inside.set()
            release.wait(WAIT)
            order.append("long warm done")

    def compiler() -> None:
        with serialized_compile():
            order.append("compile")

    def late_warm() -> None:
        with compiled_call():
            order.append("late warm")

    a = in_thread(long_warm)
    assert inside.wait(WAIT)
    b = in_thread(compiler)
    time.sleep(0.1)  # scenario: the compile is waiting before the late warm call arrives
    c = in_thread(late_warm)  # arrives while the compile waits: must not starve it
    time.sleep(0.1)  # scenario: a window for the late warm call to enter, which it must not
    assert order == []
    release.set()
    for th in (a, b, c):
        th.join(WAIT)
    assert order == ["long warm done", "compile", "late warm"]


def test_compiling_from_inside_ones_own_warm_call_does_not_deadlock() -> None:
    done = threading.Event()

    def nested() -> None:
        with compiled_call(), serialized_compile(), serialized_compile(), compiled_call():
            done.set()

    in_thread(nested).join(WAIT)
    assert done.is_set()
    assert COMPILE_LOCK.acquire(blocking=False), "the lock is free again"
    COMPILE_LOCK.release()


def test_guard_first_calls_compiles_once_per_key_under_the_lock() -> None:
    calls: list[tuple[int, bool]] = []

    def fn(n: int) -> int:
        # an RLock is re-acquirable by its holder, so ask whether this thread owns it
        calls.append((n, COMPILE_LOCK._is_owned()))  # type: ignore[attr-defined]
        return n * 2

    g = guard_first_calls(fn, key=lambda n: n)
    assert [g(1), g(1), g(2)] == [2, 2, 4]
    assert calls == [(1, True), (1, False), (2, True)]
    assert g.__wrapped__ is fn  # type: ignore[attr-defined]
