"""The forwarders of a bridge, one set per direction, and the demand that starts them.

Theory of operation
-------------------
A bridge (:mod:`bridge.network_bridge`) forwards in one :class:`Direction` from the
local broker to the remote one and, when ``duplex``, in a second one back. A direction
holds one :class:`~bridge.forwarder.DestinationForwarder` per forwarded destination:
:meth:`Direction.ensure` starts one (static includes at once), :meth:`Direction.drop`
stops it when demand goes.

Dynamic includes. A :class:`DemandWatcher` subscribes to
``/topic/ActiveMQ.Advisory.Consumer.Queue.<pattern>`` (``Topic`` for topics) on the
receiving broker; each advisory carries ``consumerCount``. Demand is that count minus
the bridge's own subscriptions on that broker for that destination (a duplex bridge's
reverse forwarder is a consumer there too); a forwarder runs while demand > 0. Our
embedded broker publishes these advisories. ActiveMQ 5.17 delivered none over STOMP in
our checks (docs/bridge.md, "Dynamic includes"), so ``advisories = "auto"``
treats dynamic includes as static ones when the remote announces itself as ActiveMQ in
its CONNECTED ``server`` header (and ``"off"`` always does): against ActiveMQ every
dynamically included destination is forwarded all the time.

Both see their bridge only as a :class:`DirectionOwner`: its config, its status, its
name, whether it is stopping, its excludes, and :meth:`DirectionOwner.fail`, which a
failure of any forwarder or watcher thread is reported to (it tears the whole bridge
down).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from amqtransport.destinations import Destination, Pattern, advisory_topic, watched_destination

from .config import NetworkConnectorConfig
from .forwarder import DestinationForwarder, NodeId
from .status import BridgeStatus

__all__ = ["DemandWatcher", "Direction", "DirectionOwner", "quietly"]

log = logging.getLogger("bridge.connector")  # the bridge's log lines keep the name they had in one module


class DirectionOwner(Protocol):
    """What a :class:`Direction` and a :class:`DemandWatcher` use of their bridge."""

    name: str
    config: NetworkConnectorConfig
    status: BridgeStatus
    tracer: Any

    @property
    def stopping(self) -> bool: ...

    def excluded(self, destination: str) -> bool: ...

    def fail(self, error: BaseException) -> None: ...


def quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - teardown is best effort
        log.debug("ignored during teardown: %r", exc)


class Direction:
    """One direction of a bridge: forwarders from ``src`` to ``dst``."""

    def __init__(self, bridge: DirectionOwner, *, src: Any, dst: Any, here: NodeId, there: NodeId, label: str) -> None:
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


class DemandWatcher:
    """Consumer advisories for one dynamic pattern, watched on the receiving broker."""

    def __init__(self, bridge: DirectionOwner, *, conn: Any, pattern: Pattern, direction: Direction,
                 reverse: Direction | None) -> None:
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
                quietly(sub.unsubscribe)

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
