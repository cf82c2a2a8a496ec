"""The ``static:`` discovery agent (ActiveMQ's SimpleDiscoveryAgent) and ``services_of``.

Theory of operation
-------------------
A discovery agent owns a fixed list of *services* (URI texts, typically
``failover:(a,b)?randomize=false&maxReconnectAttempts=0`` — what ``masterslave:``
desugars to). ``start()`` announces each one once (``listener.on_service_added``)
from a background thread. Whoever uses the service (the bridge) builds a transport
for it; when that transport gives up (with ``maxReconnectAttempts=0`` a failover
transport raises straight up on the first loss), it calls ``service_failed``. The
agent then, in its own worker thread, waits and announces the service again:

* a failure sooner than ``minConnectTime`` after the last announcement counts as a
  *connect* failure: the failure count grows and so does the delay
  (``initialReconnectDelay * backOffMultiplier ** (n-1)`` capped at
  ``maxReconnectDelay``, constant without ``useExponentialBackOff``);
* a later failure means the service had been working: the count resets to one and
  the delay to ``initialReconnectDelay``;
* with ``maxReconnectAttempts`` N > 0 the agent stops re-adding a service after N
  connect failures in a row (0 = forever, the opposite convention to failover's).

``sleep`` and ``clock`` are injected so tests never really wait. Listener calls are
wrapped: a raising listener is logged and cannot stop the agent.

:func:`static_failover_schedule` reuses the same maths for a *client* connection to
``static:(failover:(...))`` / ``masterslave:(...)``: one pass over the list (the inner
failover's single attempt), then the static back-off before each further pass.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from amqtransport.backoff import Attempt, failover_schedule, static_delay_ms
from amqtransport.errors import UriError
from amqtransport.options import FailoverOptions, StaticOptions
from amqtransport.transports.threads import ThreadSet
from amqtransport.uri import CompositeUri, LeafUri, parse_uri

__all__ = ["DiscoveryListener", "StaticDiscoveryAgent", "services_of", "static_failover_schedule"]

log = logging.getLogger(__name__)


class DiscoveryListener(Protocol):
    def on_service_added(self, service: str) -> None: ...


def services_of(uri: str) -> tuple[list[str], StaticOptions]:
    """``static:(u1,u2)`` -> ``([u1, u2], options)``; ``masterslave:(a,b)`` ->
    ``(["failover:(a,b)?randomize=false&maxReconnectAttempts=0"], options)``; any other
    URI is one service with the default static options."""
    node = parse_uri(uri)
    if isinstance(node, CompositeUri) and node.scheme == "static":
        assert isinstance(node.options, StaticOptions)
        return [str(c) for c in node.components], node.options
    return [str(node)], StaticOptions.model_validate({})


class _Service:
    __slots__ = ("uri", "added_at", "failures", "failed", "given_up")

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.added_at = 0.0
        self.failures = 0
        self.failed = False
        self.given_up = False


class StaticDiscoveryAgent:
    """See the module docstring."""

    def __init__(
        self,
        services: Sequence[str],
        options: StaticOptions,
        listener: object,
        *,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.listener = listener
        self._sleep = sleep
        self._clock = clock
        self._services = {uri: _Service(uri) for uri in services}
        self._lock = threading.Lock()
        self._running = False
        self._threads = ThreadSet()
        #: (service, delay seconds) of every scheduled re-add, for tests and status
        self.delays: list[tuple[str, float]] = []

    @property
    def services(self) -> list[str]:
        return list(self._services)

    def _call(self, method: str, *args: object) -> None:
        fn = getattr(self.listener, method, None)
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:
            log.exception("discovery listener %s(%s) raised; ignored", method, args[0] if args else "")

    def start(self) -> None:
        with self._lock:
            if self._running:
                return
            self._running = True

        def announce() -> None:
            for svc in list(self._services.values()):
                if not self._running:
                    return
                svc.added_at = self._clock()
                self._call("on_service_added", svc.uri)

        self._threads.spawn(announce, "amq-discovery-start")

    def stop(self) -> None:
        with self._lock:
            self._running = False
        self._threads.join_all()

    def next_delay(self, service: str) -> float | None:
        """Account one failure of ``service`` now; the seconds to wait before
        re-adding it, or None when ``maxReconnectAttempts`` is used up."""
        svc = self._services[service]
        min_connect = self.options.min_connect_time / 1000.0
        if self._clock() - svc.added_at < min_connect:
            svc.failures += 1
        else:
            svc.failures = 1
        limit = self.options.max_reconnect_attempts
        if limit > 0 and svc.failures > limit:
            return None
        return static_delay_ms(self.options, svc.failures) / 1000.0

    def service_failed(self, service: str, error: BaseException | None = None) -> None:
        """The user of ``service`` lost it: re-add it after the static back-off."""
        with self._lock:
            svc = self._services.get(service)
            if svc is None:
                raise KeyError(f"unknown service {service!r}; known: {list(self._services)}")
            if svc.failed or not self._running:
                return
            svc.failed = True
            delay = self.next_delay(service)
            if delay is not None:
                self.delays.append((service, delay))
        self._call("on_service_removed", service)
        if delay is None:
            svc.given_up = True
            log.warning("discovery: %s failed %d times in a row (maxReconnectAttempts=%d): giving up (%s)",
                        service, svc.failures, self.options.max_reconnect_attempts, error)
            return
        log.info("discovery: %s failed (%s); re-adding in %.3fs", service, error, delay)

        def readd() -> None:
            self._sleep(delay)
            if not self._running:
                return
            svc.added_at = self._clock()
            svc.failed = False
            self._call("on_service_added", service)

        self._threads.spawn(readd, "amq-discovery-readd")


def static_failover_schedule(static_options: StaticOptions) -> Callable[..., Iterator[Attempt[LeafUri]]]:
    """A failover schedule for ``static:(failover:(...)?maxReconnectAttempts=0)`` used
    as one client connection: one pass without delay, then the static back-off
    before every further pass (forever when the static ``maxReconnectAttempts`` is 0)."""

    def schedule(endpoints: Sequence[LeafUri], options: FailoverOptions, *, startup: bool,
                 rng: random.Random | None = None) -> Iterator[Attempt[LeafUri]]:
        one_pass = options.model_copy(update={"max_reconnect_attempts": 0, "startup_max_reconnect_attempts": -1})
        failures = 0
        pass_number = 1
        while True:
            delay = 0.0 if failures == 0 else static_delay_ms(static_options, failures) / 1000.0
            first = True
            for attempt in failover_schedule(endpoints, one_pass, startup=True, rng=rng):
                yield Attempt(attempt.endpoint, delay if first else 0.0, pass_number)
                first = False
            failures += 1
            pass_number += 1
            limit = static_options.max_reconnect_attempts
            if limit > 0 and failures > limit:
                return

    return schedule


def check_single_service(uri: str) -> None:
    """Client connections need exactly one service under ``static:``."""
    services, _ = services_of(uri)
    if len(services) != 1:
        raise UriError(
            f"static: lists {len(services)} services; a client connection talks to one broker at a time: "
            "use failover:(...) (or masterslave:(...)); several static services are for the bridge agent",
            uri=uri,
        )
