"""Helpers shared by the client tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(cond: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``cond`` every 5 ms until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.005)
    raise AssertionError(f"{what} not met within {timeout} s")
