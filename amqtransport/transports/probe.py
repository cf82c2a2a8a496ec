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

:func:`wait_probing` is the rule, pure: the clock, the sleep and the probe are
injected (the sync driver sleeps on an event that ``close()`` sets).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import TypeVar

from amqtransport.uri import LeafUri

__all__ = ["DEFAULT_PROBE_INTERVAL", "Probe", "tcp_probe", "wait_probing"]

T = TypeVar("T")

#: seconds between two probes of the endpoints (the URI's ``probeInterval``, ms)
DEFAULT_PROBE_INTERVAL = 0.1

#: ``probe(endpoint, timeout)``: True when a TCP connect to it succeeds in time
Probe = Callable[[LeafUri, float], bool]


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
    No probe (None, or ``every`` <= 0): one plain ``sleep(delay)``."""
    if probe is None or every <= 0 or not endpoints:
        sleep(delay)
        return None
    deadline = clock() + delay
    slept = 0.0
    while True:
        # over when the clock says so or the sleeps add up to it (an injected sleep
        # that returns at once must not make this a busy loop on a real clock)
        left = min(deadline - clock(), delay - slept)
        if left <= 0 or stop():
            return None
        step = min(every, left)
        sleep(step)
        slept += step
        if stop() or min(deadline - clock(), delay - slept) <= 0:
            return None
        for endpoint in endpoints:
            if probe(endpoint, every):
                return endpoint


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
