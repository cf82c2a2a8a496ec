"""Pure reconnect schedules for ``failover:`` and ``static:`` (no clock, no sleeping).

Theory of operation
-------------------
``failover_schedule(endpoints, options, startup=...)`` is an iterator of
:class:`Attempt` ``(endpoint, delay, pass_number)``.  One *pass* tries every endpoint
once, in order (shuffled per pass with ``randomize``; with ``priorityBackup`` the
priority endpoints -- those in ``priorityURIs``, else the first of the list -- come
first, in their given order).  There is no delay inside a pass; the first attempt of
pass ``n + 1`` carries the delay that follows ``n`` failed passes::

    delay(n) = min(initialReconnectDelay * reconnectDelayExponent ** (n - 1),
                   maxReconnectDelay)                       (useExponentialBackOff)
    delay(n) = initialReconnectDelay                        (otherwise)

plus, when ``reconnectJitter`` = j > 0, a uniform extra in ``[0, j * delay(n)]`` (drawn
from ``rng``, so a seeded ``random.Random`` gives a reproducible schedule).  The delay
maths is tenacity's ``wait_exponential`` / ``wait_fixed`` (in milliseconds).

The number of passes: ``maxReconnectAttempts`` -1 is unlimited, 0 is exactly one pass
(no reconnect after a failure: the error goes up), N is N passes.  With
``startup=True`` (no connection has been made yet) ``startupMaxReconnectAttempts``
replaces it unless it is -1.  When the iterator ends the caller raises
``ReconnectExhausted``; the caller stops iterating as soon as an attempt succeeds and
sleeps ``attempt.delay`` seconds before each attempt itself (sleep is the caller's).

``failed_last(attempts, failed)`` is ActiveMQ's rule for the link that just failed
(``FailoverTransport.getConnectList``: the URI of the failed transport is removed and
added back at the end of the list): in every pass of a reconnect, the endpoint whose
address is ``failed`` is tried last (after the shuffle of ``randomize`` and the
priority endpoints of ``priorityBackup``), and the pass's delay stays on its first
attempt.  A broker that died, hung or was cut off is thus not the first thing a
reconnect waits on when another broker of the list may already serve.

``static_delays(options)`` is the discovery agent's backoff: ``initialReconnectDelay``,
then multiplied by ``backOffMultiplier`` each failure, capped at ``maxReconnectDelay``
(constant without ``useExponentialBackOff``), ``maxReconnectAttempts`` values or
unlimited when 0.  ``minConnectTime`` is applied by the agent: a connection that lived
at least that long restarts the iterator.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Generic, TypeVar, cast

from tenacity import wait_exponential, wait_fixed

from amqtransport.errors import UriError
from amqtransport.options import FailoverOptions, StaticOptions

if TYPE_CHECKING:
    from tenacity import RetryCallState
    from tenacity.wait import wait_base

__all__ = [
    "Attempt",
    "failover_schedule",
    "failed_last",
    "failover_delay_ms",
    "pass_limit",
    "static_delays",
    "static_delay_ms",
    "describe_failover",
    "describe_static",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Attempt(Generic[T]):
    """One connection attempt: sleep ``delay`` seconds, then try ``endpoint``."""

    endpoint: T
    delay: float  # seconds to sleep BEFORE this attempt
    pass_number: int  # 1-based


class _State:
    """The one attribute of tenacity's RetryCallState the wait strategies read."""

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


def _wait(strategy: wait_base, n: int) -> float:
    return float(strategy(cast("RetryCallState", _State(n))))


def _backoff_ms(exponential: bool, initial: float, maximum: float, exp_base: float, n: int) -> float:
    """The ``n``-th delay (``n`` < 1 counts as 1): ``initial * exp_base ** (n-1)`` capped at
    ``maximum`` when ``exponential``, else always ``initial`` (tenacity computes it)."""
    strategy: wait_base
    if exponential:
        strategy = wait_exponential(multiplier=initial, max=maximum, exp_base=exp_base)
    else:
        strategy = wait_fixed(initial)
    return _wait(strategy, max(1, n))


def failover_delay_ms(options: FailoverOptions, failed_passes: int) -> float:
    """Delay in ms (without jitter) after ``failed_passes`` (>= 1) failed passes."""
    return _backoff_ms(
        options.use_exponential_backoff,
        options.initial_reconnect_delay,
        options.max_reconnect_delay,
        options.reconnect_delay_exponent,
        failed_passes,
    )


def pass_limit(options: FailoverOptions, *, startup: bool) -> int | None:
    """How many passes the schedule makes (None: unlimited)."""
    limit = options.max_reconnect_attempts
    if startup and options.startup_max_reconnect_attempts != -1:
        limit = options.startup_max_reconnect_attempts
    if limit < 0:
        return None
    return max(1, limit)


def _key(endpoint: object) -> str:
    address = getattr(endpoint, "address", None)
    if isinstance(address, str):
        return address
    if isinstance(endpoint, str):
        return _normalise(endpoint)
    return str(endpoint)


def _normalise(text: str) -> str:
    from amqtransport.uri import LeafUri, parse_uri

    try:
        node = parse_uri(text)
    except UriError:
        return text
    return node.address if isinstance(node, LeafUri) else str(node)


def _pass_order(
    endpoints: Sequence[T], options: FailoverOptions, rng: random.Random
) -> list[T]:
    """One pass: indices shuffled (randomize), priority ones moved to the front.

    Works on indices so that equal (or unhashable) endpoints each keep their slot.
    """
    order = list(range(len(endpoints)))
    if options.randomize:
        rng.shuffle(order)
    if options.priority_backup:
        if options.priority_uris:
            keys = [_key(endpoint) for endpoint in endpoints]
            first: list[int] = []
            for wanted in (_normalise(uri) for uri in options.priority_uris):
                first.extend(i for i in order if keys[i] == wanted and i not in first)
        else:
            first = [0]
        order = first + [i for i in order if i not in first]
    return [endpoints[i] for i in order]


def failover_schedule(
    endpoints: Sequence[T],
    options: FailoverOptions,
    *,
    startup: bool,
    rng: random.Random | None = None,
) -> Iterator[Attempt[T]]:
    """The failover reconnect schedule (see the module docstring)."""
    endpoints = list(endpoints)
    if not endpoints:
        return
    rng = rng if rng is not None else random.Random()
    limit = pass_limit(options, startup=startup)
    pass_number = 1
    while limit is None or pass_number <= limit:
        for index, endpoint in enumerate(_pass_order(endpoints, options, rng)):
            delay = 0.0
            if index == 0 and pass_number > 1:
                ms = failover_delay_ms(options, pass_number - 1)
                if options.reconnect_jitter > 0 and ms > 0:
                    ms += rng.uniform(0.0, options.reconnect_jitter * ms)
                delay = ms / 1000.0
            yield Attempt(endpoint, delay, pass_number)
        pass_number += 1


def failed_last(attempts: Iterator[Attempt[T]], failed: str | None) -> Iterator[Attempt[T]]:
    """``attempts`` with the endpoint whose address is ``failed`` last in each pass (see
    the module docstring); unchanged when ``failed`` is None or not in the list."""
    if failed is None:
        yield from attempts
        return
    wanted = _normalise(failed)
    for _, group in groupby(attempts, key=lambda attempt: attempt.pass_number):
        items = list(group)
        ordered = [a for a in items if _key(a.endpoint) != wanted] + [a for a in items if _key(a.endpoint) == wanted]
        for index, attempt in enumerate(ordered):
            yield Attempt(attempt.endpoint, items[0].delay if index == 0 else 0.0, attempt.pass_number)


def static_delay_ms(options: StaticOptions, failures: int) -> float:
    """Delay in ms before re-adding a service after ``failures`` (>= 1) failures in a row."""
    return _backoff_ms(
        options.use_exponential_backoff,
        options.initial_reconnect_delay,
        options.max_reconnect_delay,
        options.backoff_multiplier,
        failures,
    )


def static_delays(options: StaticOptions) -> Iterator[float]:
    """Seconds to wait before each re-add of a failed service (``static:`` backoff)."""
    n = 1
    while options.max_reconnect_attempts == 0 or n <= options.max_reconnect_attempts:
        yield static_delay_ms(options, n) / 1000.0
        n += 1


# ---------------------------------------------------------------------- descriptions
def _ms(value: float) -> str:
    return f"{value:g} ms" if value != int(value) else f"{int(value)} ms"


def describe_failover(options: FailoverOptions, *, count: int = 5) -> str:
    """One line: ``reconnect delays: 0 (pass 1), 10 ms, 20 ms, ... capped at 30000 ms; attempts: unlimited``."""
    delays = [_ms(failover_delay_ms(options, n)) for n in range(1, count + 1)]
    limit = pass_limit(options, startup=False)
    startup = pass_limit(options, startup=True)
    if limit == 1:
        text = "reconnect delays: none (a failure goes up after one pass over the list)"
    else:
        shown = delays if limit is None else delays[: max(0, limit - 1)]
        text = "reconnect delays: 0 (pass 1), " + ", ".join(shown)
        if options.use_exponential_backoff and (limit is None or limit - 1 > count):
            text += f", ... capped at {_ms(float(options.max_reconnect_delay))}"
        elif not options.use_exponential_backoff and (limit is None or limit - 1 > count):
            text += ", ... (constant)"
    if options.reconnect_jitter:
        text += f" (+ up to {options.reconnect_jitter:g} x delay of jitter)"
    text += "; attempts: " + _passes(limit)
    if startup != limit:
        text += f" (before the first connection: {_passes(startup)})"
    if limit != 1:
        text += (f"; a TCP probe every {options.probe_interval} ms cuts a wait or an unanswered CONNECT short (probeInterval)"
                 if options.probe_interval else "; no probe while waiting (probeInterval=0)")
    return text


def _passes(limit: int | None) -> str:
    if limit is None:
        return "unlimited"
    return "1 pass" if limit == 1 else f"{limit} passes"


def describe_static(options: StaticOptions, *, count: int = 5) -> str:
    """One line describing the ``static:`` re-add backoff."""
    limit = options.max_reconnect_attempts
    n = count if limit == 0 else min(count, limit)
    delays = [_ms(static_delay_ms(options, i)) for i in range(1, n + 1)]
    text = "re-add delays after a failure: " + ", ".join(delays)
    if limit == 0 or limit > count:
        if options.use_exponential_backoff:
            text += f", ... capped at {_ms(float(options.max_reconnect_delay))}"
        else:
            text += ", ... (constant)"
    text += "; attempts: " + ("unlimited" if limit == 0 else str(limit))
    text += f"; a connection that lived {options.min_connect_time} ms resets the delay"
    return text
