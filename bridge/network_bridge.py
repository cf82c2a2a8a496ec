"""One bridge to one service: two connections and the forwarding between them.

Theory of operation
-------------------
A :class:`Bridge` is built by its :class:`~bridge.connector.NetworkConnector` for one
service and :meth:`Bridge.run` on a thread of its own until it fails or is stopped.
It is two connections (``local_uri`` with its own failover — normally reconnecting
forever — and the service), one :class:`~bridge.demand.Direction` of forwarders per
direction (one, or two when ``duplex``) and, for dynamic includes, a consumer-advisory
watcher (:class:`~bridge.demand.DemandWatcher`) per pattern on the side that would
receive the messages (:mod:`bridge.demand`).

It fails when the remote failover gives up (a :class:`_Listener`'s ``on_failed``), a
bare-broker service stops being connected, a send or a receive raised, or the local
side gave up; then it is torn down completely — its forwarders stopped, both
connections closed, so every unacknowledged message goes back to its source queue —
and :meth:`Bridge.run` returns the failure to the connector.

Status. A bridge that is up registers probes reading ``connected_uri`` of its
connections, so ``/status`` reports the address actually connected at the time of the
request, never the configured URI nor the one the bridge was built for.

Errors in user-visible callbacks never kill a loop: every thread catches, logs and
reports. ``connect`` is injectable for tests.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from amqtransport.destinations import overlaps, parse_pattern
from amqtransport.errors import ConnectionClosed

from .config import NetworkConnectorConfig, leaf_addresses
from .demand import DemandWatcher, Direction, quietly
from .forwarder import NodeId
from .status import BridgeStatus

__all__ = ["Bridge", "ConnectFn", "server_of"]

log = logging.getLogger("bridge.connector")  # the bridge's log lines keep the name they had in one module

ConnectFn = Callable[..., Any]


def _default_connect(uri: str, **kwargs: Any) -> Any:
    import amqtransport

    return amqtransport.connect(uri, **kwargs)


def server_of(conn: Any) -> str:
    """The ``server`` header of the CONNECTED frame (e.g. ``ActiveMQ/5.17.2``), or ""."""
    value = getattr(conn, "server", None)  # Connection.server; None while the link is down
    return value if isinstance(value, str) else ""  # unknown: assume a broker with advisories


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
        self.directions: list[Direction] = []
        self.watchers: list[DemandWatcher] = []
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
        fwd = Direction(self, src=self.local, dst=self.remote, here=self.here, there=self.there, label="local->remote")
        self.directions = [fwd]
        rev: Direction | None = None
        if cfg.duplex:
            rev = Direction(self, src=self.remote, dst=self.local, here=self.there, there=self.here,
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
                    w = DemandWatcher(self, conn=watch_conn, pattern=pattern, direction=direction, reverse=other)
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
                quietly(conn.close)
