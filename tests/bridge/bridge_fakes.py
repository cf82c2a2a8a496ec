"""An in-memory stand-in for the client and a shared-store broker pair.

Only for the connector's state-machine tests (rebuild on failover, demand, loops): it
follows the contract of amqtransport.connect closely enough (subscribe with
client-individual acks and prefetch, send with an idempotency key deduplicated by the
"broker", connected_uri, listener.on_failed when a maxReconnectAttempts=0 failover
gives up, transparent reconnect otherwise). The end-to-end tests use the real client
and real brokers.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from amqtransport.destinations import advisory_topic, parse_destination, parse_pattern
from amqtransport.errors import ConnectError, ConnectionClosed, ReconnectExhausted

_ids = itertools.count(1)


@dataclass
class Msg:
    destination: str
    body: bytes
    headers: dict[str, str]
    redelivered: bool = False


class Store:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queues: dict[str, deque[Msg]] = {}
        self.keys: set[str] = set()
        self.subs: list[FakeSub] = []
        self.sends = 0

    def publish(self, dest: str, body: bytes, headers: dict[str, str], key: str | None) -> None:
        with self.cond:
            if key is not None:
                if key in self.keys:
                    return
                self.keys.add(key)
            self.sends += 1
            h = dict(headers)
            h["destination"] = dest
            h["message-id"] = f"ID:{next(_ids)}"
            if key is not None:
                h["amq-idempotency-key"] = key
            if dest.startswith("/topic/"):
                for s in list(self.subs):
                    if s.matches(dest):
                        s.topic_buf.append(Msg(dest, body, h))
            else:
                self.queues.setdefault(dest, deque()).append(Msg(dest, body, h))
            self.cond.notify_all()

    def consumer_count(self, dest: str) -> int:
        return sum(1 for s in self.subs if s.destination == dest)

    def tell_current_demand(self, sub: FakeSub) -> None:
        """Like our broker: a new advisory subscriber is told the current consumer count
        of every queue it watches at once (otherwise a consumer that came before the
        watcher would never be seen)."""
        if not sub.pattern.is_topic or not sub.destination.startswith("/topic/ActiveMQ.Advisory."):
            return
        for dest in sorted({s.destination for s in self.subs if s is not sub and not s.pattern.is_topic}):
            topic = advisory_topic(parse_destination(dest))
            if sub.matches(topic):
                h = {"consumerCount": str(self.consumer_count(dest)), "destination": topic,
                     "message-id": f"ID:{next(_ids)}"}
                sub.topic_buf.append(Msg(topic, b"", h))
        self.cond.notify_all()

    def advise(self, dest: str) -> None:
        d = parse_destination(dest)
        if d.name.startswith("ActiveMQ.Advisory"):
            return
        self.publish(advisory_topic(d), b"", {"consumerCount": str(self.consumer_count(dest))}, None)


class FakeSub:
    def __init__(self, conn: FakeConn, destination: str, ack: str, prefetch: int | None) -> None:
        self.conn = conn
        self.destination = destination
        self.pattern = parse_pattern(destination)
        self.ack_mode = ack
        self.prefetch = prefetch or 1000
        self.inflight: list[Msg] = []
        self.topic_buf: deque[Msg] = deque()
        self.closed = False

    def matches(self, dest: str) -> bool:
        return self.pattern.matches(dest)

    def receive(self, timeout: float | None = None) -> FakeMessage | None:
        deadline = time.monotonic() + (timeout or 0)
        store = self.conn.store_or_raise()
        with store.cond:
            while True:
                self.conn.check()
                if self.closed:
                    raise ConnectionClosed("unsubscribed")
                m = self._take(store)
                if m is not None:
                    return FakeMessage(self, m)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                store.cond.wait(min(left, 0.05))

    def _take(self, store: Store) -> Msg | None:
        if len(self.inflight) >= self.prefetch:
            return None
        if self.pattern.is_topic:
            if not self.topic_buf:
                return None
            m = self.topic_buf.popleft()
        else:
            m = None
            for name, q in store.queues.items():
                if q and self.matches(name):
                    m = q.popleft()
                    break
            if m is None:
                return None
        if self.ack_mode != "auto":
            self.inflight.append(m)
        return m

    def give_back(self, store: Store) -> None:
        for m in reversed(self.inflight):
            if not self.pattern.is_topic:
                m.redelivered = True
                m.headers["redelivered"] = "true"
                store.queues.setdefault(m.destination, deque()).appendleft(m)
        self.inflight.clear()
        store.cond.notify_all()

    def unsubscribe(self) -> None:
        store = self.conn.store
        if store is None or self.closed:
            self.closed = True
            return
        with store.cond:
            self.closed = True
            self.give_back(store)
            if self in store.subs:
                store.subs.remove(self)
                store.advise(self.destination)


class FakeMessage:
    def __init__(self, sub: FakeSub, m: Msg) -> None:
        self._sub = sub
        self._m = m
        self.headers = dict(m.headers)
        self.body = m.body
        self.destination = m.destination
        self.message_id = m.headers["message-id"]
        self.idempotency_key = m.headers.get("amq-idempotency-key")
        self.redelivered = m.redelivered

    @property
    def text(self) -> str:
        return self.body.decode()

    def ack(self) -> None:
        store = self._sub.conn.store_or_raise()
        with store.cond:
            self._sub.conn.check()
            if self._m in self._sub.inflight:
                if self._sub.ack_mode == "client":  # cumulative
                    i = self._sub.inflight.index(self._m)
                    del self._sub.inflight[: i + 1]
                else:
                    self._sub.inflight.remove(self._m)


class FakePair:
    """Two addresses over one store; only the master's address accepts connections."""

    def __init__(self, net: FakeNet, a: str, b: str) -> None:
        self.net = net
        self.addresses = [a, b]
        self.master = 0
        self.alive = True
        self.store = Store()

    @property
    def master_address(self) -> str:
        return self.addresses[self.master]

    def kill_master(self, takeover_delay: float = 0.0) -> None:
        dead = self.master_address
        self.alive = False
        for conn in list(self.net.conns):
            if conn.address == dead:
                conn.lose()

        def takeover() -> None:
            self.master = 1 - self.master
            self.alive = True
            for conn in list(self.net.conns):
                conn.maybe_reconnect()

        if takeover_delay:
            threading.Timer(takeover_delay, takeover).start()
        else:
            takeover()


class FakeNet:
    def __init__(self) -> None:
        self.pairs: dict[str, FakePair] = {}
        self.conns: list[FakeConn] = []
        self.lock = threading.Lock()
        self.connect_calls: list[str] = []

    def pair(self, a: str, b: str) -> FakePair:
        p = FakePair(self, a, b)
        self.pairs[a] = self.pairs[b] = p
        return p

    def connect(self, uri: str, *, login: Any = None, passcode: Any = None, heartbeat: Any = None,
                listener: Any = None, **kw: Any) -> FakeConn:
        self.connect_calls.append(uri)
        leaves = re.findall(r"tcp://[^,()?&]+", uri)
        reconnect = uri.startswith("failover:") and "maxReconnectAttempts=0" not in uri
        conn = FakeConn(self, leaves, reconnect, listener)
        conn.connect_once()
        with self.lock:
            self.conns.append(conn)
        return conn


class FakeConn:
    def __init__(self, net: FakeNet, leaves: list[str], reconnect: bool, listener: Any) -> None:
        self.net = net
        self.leaves = leaves
        self.reconnect = reconnect
        self.listener = listener
        self.address: str | None = None
        self.store: Store | None = None
        self.failed: BaseException | None = None
        self.closed = False
        self.subs: list[FakeSub] = []

    def connect_once(self) -> None:
        for leaf in self.leaves:
            p = self.net.pairs.get(leaf)
            if p is not None and p.alive and p.master_address == leaf:
                self.address, self.store = leaf, p.store
                return
        raise ReconnectExhausted(f"no broker of {self.leaves} accepts connections")

    @property
    def connected_uri(self) -> str | None:
        return self.address

    @property
    def is_connected(self) -> bool:
        return self.address is not None and not self.closed

    def check(self) -> None:
        if self.closed:
            raise ConnectionClosed("closed")
        if self.failed is not None:
            raise self.failed

    def store_or_raise(self) -> Store:
        self.check()
        if self.store is None:
            if self.reconnect:
                # failover in progress: behave as a blocking client would, briefly
                for _ in range(100):
                    time.sleep(0.02)
                    if self.store is not None:
                        return self.store
            raise ConnectionClosed("not connected")
        return self.store

    def _detach_subs(self, store: Store) -> None:
        """Take this connection's subscriptions off ``store`` (its cond held): unacked go back."""
        for s in self.subs:
            if s in store.subs:
                s.give_back(store)
                store.subs.remove(s)
                store.advise(s.destination)

    def lose(self) -> None:
        store = self.store
        if store is not None:
            with store.cond:
                self._detach_subs(store)
                store.cond.notify_all()
        self.address, self.store = None, None
        if not self.reconnect:
            self.failed = ReconnectExhausted("failover: maxReconnectAttempts=0, connection lost")
            if self.listener is not None and hasattr(self.listener, "on_failed"):
                self.listener.on_failed(self.failed)

    def maybe_reconnect(self) -> None:
        if not self.reconnect or self.closed or self.store is not None:
            return
        try:
            self.connect_once()
        except ReconnectExhausted:
            return
        store = self.store
        assert store is not None
        with store.cond:
            for s in self.subs:
                if not s.closed:
                    store.subs.append(s)
                    store.advise(s.destination)
        if self.listener is not None and hasattr(self.listener, "on_resumed"):
            self.listener.on_resumed(self.address)

    def subscribe(self, destination: str, *, ack: str = "auto", headers: Any = None, prefetch: int | None = None) -> FakeSub:
        store = self.store_or_raise()
        sub = FakeSub(self, destination, ack, prefetch)
        with store.cond:
            self.subs.append(sub)
            store.subs.append(sub)
            store.advise(destination)
            store.tell_current_demand(sub)
        return sub

    def send(self, destination: str, body: bytes | str, headers: dict[str, str] | None = None, *,
             persistent: bool = True, idempotency_key: str | None = None) -> None:
        store = self.store_or_raise()
        self.check()
        if isinstance(body, str):
            body = body.encode()
        store.publish(destination, body, dict(headers or {}), idempotency_key or f"k{next(_ids)}")

    def producer(self, window: int = 100) -> FakeProducer:
        return FakeProducer(self)

    def close(self) -> None:
        if self.closed:
            return
        store = self.store
        if store is not None:
            with store.cond:
                self._detach_subs(store)
        self.closed = True
        with self.net.lock:
            if self in self.net.conns:
                self.net.conns.remove(self)


class FakeProducer:
    """Sends at once (the fake broker "receipts" synchronously); flush checks the link."""

    def __init__(self, conn: FakeConn) -> None:
        self.conn = conn

    def send(self, destination: str, body: bytes | str, headers: dict[str, str] | None = None, *,
             persistent: bool = True, idempotency_key: str | None = None) -> None:
        self.conn.send(destination, body, headers, persistent=persistent, idempotency_key=idempotency_key)

    def flush(self, timeout: float | None = None) -> None:
        self.conn.check()
        if self.conn.store is None:
            raise ConnectionClosed("not connected")


@dataclass
class FakeAgent:
    """A StaticDiscoveryAgent stand-in with a fixed, short delay."""

    services: list[str]
    options: Any
    listener: Any
    delay: float = 0.05
    failures: list[tuple[str, str]] = field(default_factory=list)
    running: bool = False

    def start(self) -> None:
        self.running = True
        for s in self.services:
            threading.Thread(target=self.listener.on_service_added, args=(s,), daemon=True).start()

    def service_failed(self, service: str, error: BaseException | None = None) -> None:
        self.failures.append((service, repr(error)))

        def readd() -> None:
            time.sleep(self.delay)
            if self.running:
                self.listener.on_service_added(service)

        threading.Thread(target=readd, daemon=True).start()

    def stop(self) -> None:
        self.running = False


def drain(conn: FakeConn, dest: str, *, expect: int, timeout: float = 10.0) -> list[FakeMessage]:
    sub = conn.subscribe(dest, ack="auto")
    got: list[FakeMessage] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(got) < expect:
        m = sub.receive(timeout=0.1)
        if m is not None:
            got.append(m)
    # anything extra (duplicates) shows up within a short grace period
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        m = sub.receive(timeout=0.05)
        if m is not None:
            got.append(m)
    sub.unsubscribe()
    return got


__all__ = ["FakeNet", "FakePair", "FakeAgent", "drain", "ConnectError"]
