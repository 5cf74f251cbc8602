"""One ``wait_for`` for every test that waits for something to become true."""

from __future__ import annotations

import time
import typing as t

T = t.TypeVar("T")


def wait_for(cond: t.Callable[[], T], timeout: float = 10.0, *, what: str | None = None,
             interval: float = 0.1) -> T:
    """Poll ``cond`` until it returns something truthy, and return that.

    At ``timeout`` seconds the last value is returned (so ``assert wait_for(...)`` fails with
    the test's own message), or, when ``what`` says what was awaited, AssertionError names it.
    """
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got or time.monotonic() >= deadline:
            break
        time.sleep(interval)  # scenario: the one polling interval of the suite
    if not got and what is not None:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
    return got


def wait_for_value(fetch: t.Callable[[], T], done: t.Callable[[T], object], timeout: float = 10.0,
                   *, interval: float = 0.1) -> T:
    """Read ``fetch()`` until ``done`` holds for what it read, and return that value.

    At ``timeout`` seconds the last value read is returned, so the caller's own assertion on it
    shows what the state was (a job's status document, a log's lines).
    """
    last: list[T] = []

    def reached() -> bool:
        last[:] = [fetch()]
        return bool(done(last[0]))

    wait_for(reached, timeout, interval=interval)
    return last[0]
