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

A bridge is two connections (``local_uri`` with its own failover — normally
reconnecting forever — and the service), one :class:`DestinationForwarder` per
forwarded destination and direction, and, for dynamic includes, a consumer-advisory
watcher per pattern on the side that would receive the messages.

Dynamic includes. The watcher subscribes to
``/topic/ActiveMQ.Advisory.Consumer.Queue.<pattern>`` (``Topic`` for topics) on the
receiving broker; each advisory carries ``consumerCount``. Demand is that count minus
the bridge's own subscriptions on that broker for that destination (a duplex bridge's
reverse forwarder is a consumer there too); a forwarder runs while demand > 0. Our
embedded broker publishes these advisories. ActiveMQ 5.17 delivered none over STOMP in
our checks (docs/bridge.md, "Dynamic includes"), so ``advisories = "auto"``
treats dynamic includes as static ones when the remote announces itself as ActiveMQ in
its CONNECTED ``server`` header (and ``"off"`` always does): against ActiveMQ every
dynamically included destination is forwarded all the time.

Status. A bridge that is up registers probes reading ``connected_uri`` of its
connections, so ``/status`` reports the address actually connected at the time of the
request, never the configured URI nor the one the bridge was built for.

Errors in user-visible callbacks never kill a loop: every thread catches, logs and
reports. ``connect`` and the agent factory are injectable for tests.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from amqtransport.destinations import (
    Destination,
    Pattern,
    advisory_topic,
    overlaps,
    parse_pattern,
    watched_destination,
)
from amqtransport.errors import ConnectionClosed

from .config import NetworkConnectorConfig, leaf_addresses, services_and_options
from .forwarder import DestinationForwarder, NodeId
from .status import BridgeStatus, StatusRegistry

__all__ = ["Bridge", "NetworkConnector", "ConnectFn"]

log = logging.getLogger(__name__)

ConnectFn = Callable[..., Any]


def _default_connect(uri: str, **kwargs: Any) -> Any:
    import amqtransport

    return amqtransport.connect(uri, **kwargs)


def _default_agent_factory(services: Sequence[str], options: Any, listener: Any) -> Any:
    from amqtransport.transports.discovery import StaticDiscoveryAgent

    # the connector's sleep wakes up when it is stopped: stopping never waits out a back-off
    sleep = getattr(listener, "sleep", None)
    if sleep is not None:
        return StaticDiscoveryAgent(services, options, listener, sleep=sleep)
    return StaticDiscoveryAgent(services, options, listener)


def server_of(conn: Any) -> str:
    """The ``server`` header of the CONNECTED frame (e.g. ``ActiveMQ/5.17.2``), or ""."""
    value = getattr(conn, "server", None)  # Connection.server; None while the link is down
    return value if isinstance(value, str) else ""  # unknown: assume a broker with advisories


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - teardown is best effort
        log.debug("ignored during teardown: %r", exc)


class _Listener:
    """Connection listener: turns on_failed into a bridge failure (wrapped: never raises)."""

    def __init__(self, side: str, fail: Callable[[BaseException], None], bridge_name: str,
                 resumed: Callable[[str | None], None] | None = None) -> None:
        self._side = side
        self._fail = fail
        self._name = bridge_name
        self._resumed = resumed

    def on_interrupted(self, error: BaseException | None = None) -> None:
        log.info("bridge %s: %s connection interrupted: %s", self._name, self._side, error)

    def on_resumed(self, address: str | None = None) -> None:
        log.info("bridge %s: %s connection resumed on %s", self._name, self._side, address)
        if self._resumed is not None:
            self._resumed(address)

    def on_failed(self, error: BaseException | None = None) -> None:
        self._fail(error if error is not None else ConnectionClosed(f"{self._side} connection failed"))


class _Direction:
    """One direction of a bridge: forwarders from ``src`` to ``dst``."""

    def __init__(self, bridge: Bridge, *, src: Any, dst: Any, here: NodeId, there: NodeId, label: str) -> None:
        self.bridge = bridge
        self.src = src
        self.dst = dst
        self.here = here
        self.there = there
        self.label = label
        self.forwarders: dict[str, DestinationForwarder] = {}
        self.lock = threading.Lock()

    def active(self, destination: str) -> bool:
        with self.lock:
            f = self.forwarders.get(destination)
            return f is not None and f.alive

    def ensure(self, destination: str) -> None:
        cfg = self.bridge.config
        with self.lock:
            if destination in self.forwarders or self.bridge.stopping:
                return
            fwd = DestinationForwarder(
                src=self.src, dst=self.dst, destination=destination, here=self.here, there=self.there,
                ttl=cfg.network_ttl, prefetch=cfg.prefetch, status=self.bridge.status,
                on_failure=self.bridge.fail, loop_pause=cfg.loop_pause_ms / 1000.0,
                label=f"{self.bridge.name} {self.label} {destination}", excluded=self.bridge.excluded,
                ack_mode=cfg.ack_mode,
                receipt_timeout=cfg.receipt_timeout_ms / 1000.0 if cfg.receipt_timeout_ms else None,
                tracer=self.bridge.tracer,
            )
            self.forwarders[destination] = fwd
            fwd.start()
        self.bridge.status.set_destination(f"{self.label} {destination}", True)
        log.info("bridge %s: forwarding %s %s", self.bridge.name, destination, self.label)

    def drop(self, destination: str) -> None:
        with self.lock:
            fwd = self.forwarders.pop(destination, None)
        if fwd is not None:
            fwd.stop()
            fwd.join(5)
            self.bridge.status.set_destination(f"{self.label} {destination}", False)
            log.info("bridge %s: no longer forwarding %s %s (no demand)", self.bridge.name, destination, self.label)

    def stop_all(self) -> None:
        with self.lock:
            fwds = list(self.forwarders.values())
            self.forwarders.clear()
        for f in fwds:
            f.stop()
        for f in fwds:
            f.join(5)


class _DemandWatcher:
    """Consumer advisories for one dynamic pattern, watched on the receiving broker."""

    def __init__(self, bridge: Bridge, *, conn: Any, pattern: Pattern, direction: _Direction,
                 reverse: _Direction | None) -> None:
        self.bridge = bridge
        self.conn = conn
        self.pattern = pattern
        self.direction = direction
        self.reverse = reverse  # its forwarders subscribe on ``conn`` too: subtract them
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"advisory {pattern}")
        self.subscribed = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        sub: Any = None
        try:
            sub = self.conn.subscribe(advisory_topic(self.pattern), ack="auto")
            self.subscribed.set()
            while not self._stop.is_set():
                msg = sub.receive(timeout=0.2)
                if msg is None:
                    continue
                self.on_advisory(msg.headers)
        except BaseException as exc:  # noqa: BLE001 - reported to the bridge
            if not self._stop.is_set():
                self.bridge.fail(exc)
        finally:
            if sub is not None:
                _quietly(sub.unsubscribe)

    def on_advisory(self, headers: Any) -> None:
        watched: Destination | None = watched_destination(str(headers.get("destination", "")))
        if watched is None or not self.pattern.matches(watched):
            return
        dest = str(watched)
        if self.bridge.excluded(dest):
            return
        try:
            count = int(headers.get("consumerCount", "0"))
        except ValueError:
            return
        own = 1 if (self.reverse is not None and self.reverse.active(dest)) else 0
        demand = count - own
        log.debug("bridge %s: advisory %s consumerCount=%d own=%d", self.bridge.name, dest, count, own)
        if demand > 0:
            self.direction.ensure(dest)
        else:
            self.direction.drop(dest)


class Bridge:
    """One bridge to one service; :meth:`run` blocks until it fails or is stopped."""

    def __init__(
        self,
        *,
        name: str,
        config: NetworkConnectorConfig,
        service: str,
        local_uri: str,
        here: NodeId,
        status: BridgeStatus,
        connect: ConnectFn = _default_connect,
        watch_interval: float = 0.25,
        previous_failures: int = 0,
        previous_remote: str | None = None,
        tracer: Any = None,
    ) -> None:
        self.name = name
        self.tracer = tracer  # forward spans (bridge.forwarder), or None
        self.previous_remote = previous_remote  # where the bridge before this one was connected
        self.last_remote: str | None = None  # where this one is (kept up to date by on_resumed)
        self.previous_failures = previous_failures  # connect failures in a row before this try
        self.was_up = False
        self.config = config
        self.service = service
        self.local_uri = local_uri
        self.here = here
        self.there = NodeId.of(config.remote_name, leaf_addresses(service))
        self.status = status
        self._connect = connect
        self._watch_interval = watch_interval
        self._failed = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._excludes = [parse_pattern(e) for e in config.exclude]
        self.remote: Any = None
        self.local: Any = None
        self.directions: list[_Direction] = []
        self.watchers: list[_DemandWatcher] = []
        self.ready = threading.Event()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set() or self._failed.is_set()

    def excluded(self, destination: str) -> bool:
        return any(p.matches(destination) for p in self._excludes)

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = error
        self._failed.set()

    def stop(self) -> None:
        self._stop.set()

    def _remote_resumed(self, address: str | None) -> None:
        self.status.failover()
        if address:
            self.last_remote = address

    # ------------------------------------------------------------------ run

    def _advisories_enabled(self, conn: Any) -> bool:
        mode = self.config.advisories
        if mode != "auto":
            return mode == "on"
        return "activemq" not in server_of(conn).lower()

    def run(self) -> BaseException | None:
        """Build, forward until failure/stop, tear down. Returns the failure (None if stopped)."""
        cfg = self.config
        self.status.connecting()
        hb = (cfg.heartbeat_ms, cfg.heartbeat_ms)
        try:
            self.remote = self._connect(self.service, login=cfg.login, passcode=cfg.passcode, heartbeat=hb,
                                        listener=_Listener("remote", self.fail, self.name, self._remote_resumed))
            self.local = self._connect(self.local_uri, login=cfg.local_login, passcode=cfg.local_passcode,
                                       heartbeat=hb, listener=_Listener("local", self.fail, self.name))
        except BaseException as exc:  # noqa: BLE001 - any failure to build goes back to the agent
            n = self.previous_failures + 1
            # like failover's warnAfterReconnectAttempts: not a warning per retry (the seed's
            # complaint about ActiveMQ's log), the first and every 10th
            level = logging.WARNING if n == 1 or n % 10 == 0 else logging.DEBUG
            log.log(level, "bridge %s: could not start a bridge to %s (attempt %d): %s", self.name, self.service,
                    n, exc)
            self._teardown()
            self.status.down(exc)
            return exc

        remote, local = self.remote, self.local
        self.was_up = True
        build = self.status.up(lambda: remote.connected_uri, lambda: local.connected_uri)
        self.last_remote = remote.connected_uri
        what = "up" if build == 1 else f"rebuilt (rebuild #{build - 1})"
        was = f", was {self.previous_remote}" if build > 1 and self.previous_remote else ""
        log.info("bridge %s %s: %s -> %s (service %s%s)", self.name, what, local.connected_uri,
                 remote.connected_uri, self.service, was)
        try:
            self._start_forwarding()
            self.ready.set()
            while not self._stop.is_set() and not self._failed.is_set():
                self._failed.wait(self._watch_interval)
                if self._leaf_service_dead():
                    self.fail(ConnectionClosed(f"connection to {self.service} lost"))
        except BaseException as exc:  # noqa: BLE001
            self.fail(exc)
        error = self._error if self._failed.is_set() else None
        self._teardown()
        if error is not None:
            log.warning("bridge %s down (was on %s): %s", self.name, self.last_remote, error)
        else:
            log.info("bridge %s stopped", self.name)
        self.status.down(error)
        return error

    def _leaf_service_dead(self) -> bool:
        """A service that is a bare broker (static:(tcp://a,tcp://b)) has no failover to
        report on_failed; its connection simply stops being connected."""
        if self.service.lstrip().startswith("failover:"):
            return False
        try:
            return not bool(self.remote.is_connected)
        except Exception:  # noqa: BLE001
            return True

    def _start_forwarding(self) -> None:
        cfg = self.config
        fwd = _Direction(self, src=self.local, dst=self.remote, here=self.here, there=self.there, label="local->remote")
        self.directions = [fwd]
        rev: _Direction | None = None
        if cfg.duplex:
            rev = _Direction(self, src=self.remote, dst=self.local, here=self.there, there=self.here,
                             label="remote->local")
            self.directions.append(rev)
        for direction, other, watch_conn in ((fwd, rev, self.remote), (rev, fwd, self.local)):
            if direction is None:
                continue
            for inc in cfg.static_include:
                # a wildcard static queue include is one wildcard queue subscription on the
                # source broker (ActiveMQ and our broker both read every matching queue,
                # existing and future); each message is sent on to its real destination
                direction.ensure(inc)
            dynamic = [parse_pattern(p) for p in cfg.dynamic_include]
            # consumer advisories exist for queues only: a topic is forwarded whatever the
            # demand (conduit: one subscription; the far broker drops what nobody reads)
            for pattern in (p for p in dynamic if p.is_topic):
                direction.ensure(str(pattern))
            dynamic = [p for p in dynamic if p.is_queue]
            if not dynamic:
                continue
            if self._advisories_enabled(watch_conn):
                for pattern in dynamic:
                    w = _DemandWatcher(self, conn=watch_conn, pattern=pattern, direction=direction, reverse=other)
                    self.watchers.append(w)
                    w.start()
            else:
                log.info("bridge %s: no consumer advisories from %s (%s): dynamic includes %s forwarded statically",
                         self.name, "remote" if direction is fwd else "local", server_of(watch_conn) or "?",
                         ", ".join(str(p) for p in dynamic))
                for pattern in dynamic:
                    if any(overlaps(pattern, e) for e in self._excludes):
                        log.warning("bridge %s: %s overlaps an exclude; not forwarded without advisories",
                                    self.name, pattern)
                        continue
                    direction.ensure(str(pattern))

    def _teardown(self) -> None:
        for w in self.watchers:
            w.stop()
        for d in self.directions:
            d.stop_all()
        for w in self.watchers:
            w.join(5)
        self.watchers = []
        for conn in (self.local, self.remote):
            if conn is not None:
                _quietly(conn.close)


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
            _quietly(self.agent.stop)
        with self._lock:
            bridges = list(self._bridges.values())
            threads = list(self._threads)
        for b in bridges:
            b.stop()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
