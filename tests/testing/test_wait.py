"""amqtransport.testing.wait: the suite's one polling helper."""

from __future__ import annotations

import itertools
import time

import pytest

from amqtransport.testing.wait import wait_for


def test_returns_the_first_truthy_value() -> None:
    values = iter([0, None, "", "ready", "later"])
    assert wait_for(lambda: next(values), timeout=5.0, interval=0.001) == "ready"


def test_times_out_naming_what_and_the_last_value() -> None:
    counter = itertools.count()
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"waiting for the queue to drain \(last: 0\)"):
        wait_for(lambda: 0 * next(counter), timeout=0.1, what="the queue to drain", interval=0.01)
    assert time.monotonic() - t0 >= 0.1
    assert next(counter) > 2  # it polled more than once


def test_ignored_exceptions_mean_not_yet_and_others_propagate() -> None:
    calls = itertools.count()

    def flaky() -> str:
        if next(calls) < 3:
            raise LookupError("not rendered yet")
        return "page"

    assert wait_for(flaky, timeout=5.0, interval=0.001, ignore=(LookupError,)) == "page"
    with pytest.raises(ZeroDivisionError):
        wait_for(lambda: 1 // 0, timeout=5.0, ignore=(LookupError,))
    with pytest.raises(AssertionError, match=r"last: KeyError\(.x.\)"):
        wait_for(lambda: {}["x"], timeout=0.05, interval=0.01, ignore=(LookupError,))
