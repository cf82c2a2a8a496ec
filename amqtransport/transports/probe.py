"""Cut a reconnect back-off short when a broker starts accepting connections.

Theory of operation
-------------------
Between two connect passes the failover transport sleeps its back-off (exponential:
up to ``maxReconnectDelay``). After a master dies, the slave binds its client port
only when it has taken over, so the wait, not the takeover, decided how long a client
stayed disconnected. While it waits, the transport now tries a bare TCP connect to
each endpoint every ``probeInterval`` ms (100 by default, ``probeInterval=0`` turns
it off): the first endpoint that accepts ends the wait and is tried at once. The
client reconnects about one probe after the takeover.

A probe proves that a port accepts, not that the STOMP handshake will succeed (a
broker that refuses our login accepts TCP). So a probe-cut attempt that fails
disables the probe for the wait that follows: the back-off then runs whole, and a
broker that accepts and refuses cannot turn the back-off into a loop of 100 ms
reconnects.

:class:`ProbingWait` is the rule, pure (the clock is injected): it says how long to
sleep next and which endpoints to probe then. :func:`wait_probing` runs it with an
injected blocking sleep and probe (the thread driver sleeps on an event that
``close()`` sets); the asyncio driver runs the same rule with ``await``.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from amqtransport.uri import LeafUri

__all__ = ["DEFAULT_PROBE_INTERVAL", "Probe", "ProbingWait", "tcp_probe", "wait_probing"]

T = TypeVar("T")

#: seconds between two probes of the endpoints (the URI's ``probeInterval``, ms)
DEFAULT_PROBE_INTERVAL = 0.1

#: ``probe(endpoint, timeout)``: True when a TCP connect to it succeeds in time
Probe = Callable[[LeafUri, float], bool]


class ProbingWait(Generic[T]):
    """The rule of a probing wait, for any driver: sleep :meth:`next_sleep` seconds, then
    probe :meth:`slept`'s endpoints in order; the first that accepts ends the wait."""

    def __init__(self, delay: float, endpoints: Sequence[T], *, probing: bool, every: float,
                 clock: Callable[[], float]) -> None:
        self._delay = delay
        self._endpoints = list(endpoints) if probing and every > 0 else []
        self._every = every
        self._clock = clock
        self._deadline = clock() + delay
        self._slept = 0.0
        self._plain = not self._endpoints
        self._plain_done = False

    def _left(self) -> float:
        # over when the clock says so or the sleeps add up to it (an injected sleep
        # that returns at once must not make this a busy loop on a real clock)
        return min(self._deadline - self._clock(), self._delay - self._slept)

    def next_sleep(self) -> float | None:
        """Seconds to sleep next, or None when the wait is over. Without probing: the
        whole delay, once."""
        if self._plain:
            return None if self._plain_done else self._delay
        left = self._left()
        return None if left <= 0 else min(self._every, left)

    def slept(self, seconds: float) -> Sequence[T]:
        """``seconds`` were slept: the endpoints to probe now (none once the wait is over)."""
        self._slept += seconds
        self._plain_done = self._plain
        if self._plain or self._left() <= 0:
            return ()
        return self._endpoints


def wait_probing(
    delay: float,
    endpoints: Sequence[T],
    probe: Callable[[T, float], bool] | None,
    *,
    every: float,
    sleep: Callable[[float], object],
    clock: Callable[[], float],
    stop: Callable[[], bool] = lambda: False,
) -> T | None:
    """Sleep ``delay`` seconds, probing ``endpoints`` every ``every`` seconds; the first
    endpoint that accepts, at once, else None when the delay is over (or ``stop()``).
    No probe (None, or ``every`` <= 0): one plain ``sleep(delay)``. The blocking driver
    of :class:`ProbingWait`."""
    wait = ProbingWait(delay, endpoints, probing=probe is not None, every=every, clock=clock)
    while (step := wait.next_sleep()) is not None:
        if stop():
            return None
        sleep(step)
        if stop():
            return None
        for endpoint in wait.slept(step):
            assert probe is not None
            if probe(endpoint, every):
                return endpoint
    return None


def tcp_probe(leaf: LeafUri, timeout: float) -> bool:
    """True when a bare TCP connect to ``leaf`` succeeds within ``timeout`` (vm:// and
    ssl:// leaves are probed on their TCP port; nothing is written)."""
    if leaf.scheme == "vm":
        return False
    try:
        with socket.create_connection((leaf.host, leaf.port), timeout=max(timeout, 0.05)):
            return True
    except OSError:
        return False
