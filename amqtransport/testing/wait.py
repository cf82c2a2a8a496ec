"""Polling until a condition holds: the one ``wait_for`` of the test suite and the harnesses.

A test that waits for something another thread or process does (a node becoming master,
a bridge forwarding, a socket closing) polls a condition with a deadline.
:func:`wait_for` does that once: it returns the condition's first truthy value, and after
``timeout`` seconds raises ``AssertionError`` naming what was awaited and the last value
seen (or the last exception, when ``ignore`` lets some pass: a page between two renders).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(
    cond: Callable[[], T],
    timeout: float = 5.0,
    what: str = "condition",
    *,
    interval: float = 0.005,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """Poll ``cond()`` every ``interval`` seconds until it returns a truthy value, and
    return that value; ``AssertionError`` naming ``what`` after ``timeout`` seconds.
    Exceptions of the ``ignore`` types count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = cond()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(interval)
