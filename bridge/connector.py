"""Network connectors and the bridges they build (ActiveMQ's DiscoveryNetworkConnector).

Theory of operation
-------------------
A :class:`NetworkConnector` turns its ``uri`` into *services* with
``services_of`` (amqtransport.transports.discovery):

- ``static:(u1,u2)``             -> services ``u1`` and ``u2``: one bridge to each;
- ``masterslave:(a,b)`` and
  ``static:failover:(a,b)?randomize=false&maxReconnectAttempts=0``
                                 -> one service, a failover over ``a,b`` that makes
                                    exactly one pass and then raises.

It hands the services to a ``StaticDiscoveryAgent`` and *is* that agent's listener: on
``on_service_added(service)`` it starts a thread that builds a :class:`Bridge` to that
service and runs it until it fails. When it fails (the remote failover gave up, a send
or a receive raised, the local side gave up) the bridge is torn down completely — its
forwarders stopped, both connections closed, so every unacknowledged message goes back
to its source queue — and the connector calls ``agent.service_failed(service, error)``.
The agent re-adds the service after the ``static:`` backoff (``initialReconnectDelay``,
growing by ``backOffMultiplier`` up to ``maxReconnectDelay`` while failures come sooner
than ``minConnectTime`` after the add), and a brand-new bridge is built on whichever
node is master by then. This is the seed's fix (AMQ-3542/AMQ-3564): the failover under
a bridge must not reconnect by itself, or the layer that owns the bridge never learns
that the remote changed.

Going beyond ActiveMQ: while the back-off runs, a silent prober tries a bare TCP
connect to the service's brokers every ``probe_interval_ms`` (100 ms by default; 0
turns it off). A slave binds its client port only when it takes over, so as soon as
one accepts, the service is added at once — the bridge forwards again about one probe
interval after the new master is up, however far the exponential back-off has grown.
One early attempt per back-off: if it fails, the agent's schedule decides again.

The bridge itself (two connections, its forwarders, its teardown) is
:mod:`bridge.network_bridge`; its forwarders per direction and the consumer advisories
that start and stop them, :mod:`bridge.demand`. ``connect`` and the agent factory are
injectable for tests.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from amqtransport.errors import ConnectionClosed

from .config import NetworkConnectorConfig, leaf_addresses, services_and_options
from .demand import quietly
from .forwarder import NodeId
from .network_bridge import Bridge, ConnectFn, _default_connect
from .status import StatusRegistry

__all__ = ["Bridge", "NetworkConnector", "ConnectFn"]

log = logging.getLogger(__name__)


def _default_agent_factory(services: Sequence[str], options: Any, listener: Any) -> Any:
    from amqtransport.transports.discovery import StaticDiscoveryAgent

    # the connector's sleep wakes up when it is stopped: stopping never waits out a back-off
    sleep = getattr(listener, "sleep", None)
    if sleep is not None:
        return StaticDiscoveryAgent(services, options, listener, sleep=sleep)
    return StaticDiscoveryAgent(services, options, listener)


def _host_ports(service: str) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for addr in leaf_addresses(service):
        hostport = addr.split("://", 1)[-1]
        host, _, port = hostport.rpartition(":")
        try:
            out.append((host.strip("[]"), int(port)))
        except ValueError:
            continue
    return out


def _reconnects_by_itself(service: str) -> bool:
    try:
        from amqtransport.uri import CompositeUri, parse_uri

        node = parse_uri(service)
    except Exception:  # noqa: BLE001 - validated elsewhere
        return False
    if not isinstance(node, CompositeUri) or node.scheme != "failover":
        return False
    return getattr(node.options, "max_reconnect_attempts", 0) != 0


class NetworkConnector:
    """A ``[[network_connector]]``: a discovery agent and a bridge per discovered service."""

    def __init__(
        self,
        config: NetworkConnectorConfig,
        *,
        local_uri: str,
        here: NodeId,
        registry: StatusRegistry,
        connect: ConnectFn = _default_connect,
        agent_factory: Callable[[Sequence[str], Any, Any], Any] = _default_agent_factory,
        tracer: Any = None,
    ) -> None:
        self.config = config
        self.tracer = tracer  # the agent's forward-span exporter, or None
        self.local_uri = local_uri
        self.here = here
        self.registry = registry
        self._connect = connect
        self._agent_factory = agent_factory
        self.services, self.options = services_and_options(config.uri)
        self.names: dict[str, str] = {}
        for service in self.services:
            if _reconnects_by_itself(service):
                log.warning(
                    "network connector %s: service %s is a failover that reconnects by itself "
                    "(maxReconnectAttempts is not 0): when the remote master changes, the bridge will not be "
                    "rebuilt (the seed's stale bridge); use masterslave:(...) or add maxReconnectAttempts=0",
                    config.name, service)
        for i, service in enumerate(self.services):
            name = config.name if len(self.services) == 1 else f"{config.name}#{i + 1}"
            self.names[service] = name
            registry.register(name, connector=config.name, service=service)
        self._lock = threading.Lock()
        self._bridges: dict[str, Bridge] = {}
        self._threads: list[threading.Thread] = []
        self._active: set[str] = set()
        self._probe_added: dict[str, bool] = {}
        self._last_remote: dict[str, str] = {}
        self.probe_interval = config.probe_interval_ms / 1000.0
        self._failures: dict[str, int] = {}
        self._stopped = threading.Event()
        self.agent: Any = None

    def start(self) -> NetworkConnector:
        self.agent = self._agent_factory(self.services, self.options, self)
        self.agent.start()
        return self

    def bridge(self, service: str | None = None) -> Bridge | None:
        """The bridge currently running for ``service`` (the only one when None)."""
        with self._lock:
            if service is None:
                service = self.services[0]
            return self._bridges.get(service)

    def sleep(self, seconds: float) -> None:
        """The discovery agent's sleep: returns early when the connector stops."""
        self._stopped.wait(seconds)

    # DiscoveryListener
    def on_service_added(self, service: str) -> None:
        self._add(service, via_probe=False)

    def _add(self, service: str, *, via_probe: bool) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            if service in self._active:
                log.debug("connector %s: %s already has a bridge", self.config.name, service)
                return
            self._active.add(service)
            self._probe_added[service] = via_probe
            name = self.names.get(service, self.config.name)
            bridge = Bridge(name=name, config=self.config, service=service, local_uri=self.local_uri,
                            here=self.here, status=self.registry.get(name), connect=self._connect,
                            previous_failures=self._failures.get(service, 0),
                            previous_remote=self._last_remote.get(service), tracer=self.tracer)
            self._bridges[service] = bridge
            t = threading.Thread(target=self._run_bridge, args=(service, bridge), daemon=True, name=f"bridge {name}")
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
            t.start()

    def _run_bridge(self, service: str, bridge: Bridge) -> None:
        try:
            error = bridge.run()
        except BaseException as exc:  # noqa: BLE001 - never let a bridge thread die silently
            log.exception("bridge %s crashed", bridge.name)
            error = exc
        with self._lock:
            self._failures[service] = 0 if bridge.was_up else self._failures.get(service, 0) + 1
            if bridge.last_remote:
                self._last_remote[service] = bridge.last_remote
            self._active.discard(service)  # before service_failed: the re-add may come at once
            # a probe-triggered attempt that failed waits for the agent's own re-add
            probe = self.probe_interval > 0 and (bridge.was_up or not self._probe_added.get(service, False))
        if self._stopped.is_set():
            return
        if error is None:
            error = ConnectionClosed("bridge stopped")
        try:
            self.agent.service_failed(service, error)
        except Exception:  # noqa: BLE001
            log.exception("connector %s: discovery agent refused service_failed", self.config.name)
        if probe:
            threading.Thread(target=self._probe, args=(service,), daemon=True, name=f"probe {service}").start()

    def _probe(self, service: str) -> None:
        """Beyond ActiveMQ: while the static back-off runs, try a bare TCP connect to the
        service's brokers every ``probe_interval_ms``; as soon as one accepts (a slave
        binds its port only when it takes over), add the service at once instead of at
        the end of a back-off that may have grown to seconds. Silent, and at most one
        early attempt per back-off: if it fails, the agent's schedule decides again."""
        addresses = _host_ports(service)
        while not self._stopped.is_set():
            with self._lock:
                if service in self._active:
                    return  # the agent re-added it meanwhile
            for host, port in addresses:
                try:
                    with socket.create_connection((host, port), timeout=max(self.probe_interval, 0.05)):
                        pass
                except OSError:
                    continue
                log.info("connector %s: %s:%d accepts connections: adding %s now", self.config.name, host, port,
                         service)
                self._add(service, via_probe=True)
                return
            self._stopped.wait(self.probe_interval)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopped.set()
        if self.agent is not None:
            quietly(self.agent.stop)
        with self._lock:
            bridges = list(self._bridges.values())
            threads = list(self._threads)
        for b in bridges:
            b.stop()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
