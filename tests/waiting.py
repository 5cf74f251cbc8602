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
        time.sleep(interval)
    if not got and what is not None:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
    return got
