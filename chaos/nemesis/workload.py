"""The nemesis's workload: producers and consumers of every kind, recording into a History.

Theory of operation
-------------------
Every client is one thread with its own connection through the clients' ``failover:``
URI (the leaves are the Toxiproxy proxies in front of the pair, so client-link faults
hit them), as independent applications would be. Each message's body *is* its key
(``<client>:<n>``), which is also its idempotency key, so every copy of a message is
recognisable everywhere. What each thread records (:mod:`chaos.nemesis.history`):

* :class:`ReceiptedProducer` -- pipelined receipted sends (``Connection.producer``,
  ``window`` in flight) at ``rate``/s; one ``Send`` per message with its outcome. The
  producer reaps receipts in send order, so the outcome of the oldest outstanding
  messages is known after each call: ``producer.receipted`` grew (``ok``), or an
  exception took the oldest one (``fail`` for a broker ERROR, ``unknown`` otherwise).
* :class:`TxProducer` -- ``BEGIN``, ``size`` receipted SENDs, ``COMMIT`` to a queue or
  a topic; one ``Tx``: ``committed``, ``in-doubt`` (the COMMIT raised) or ``aborted``
  (anything before the COMMIT raised: the broker discards the transaction).
* :class:`FireAndForgetProducer` -- ``send(receipt=False)`` over a URI with
  ``trackMessages=true`` (the failover transport re-sends its cache after a
  reconnect); outcome ``none``, judged by the checker's ``ff-lost`` rule. It ends with
  one receipted send (the proof of the rest); a connection that dies for good marks
  what it wrote ``unknown``.
* :class:`InFlightCheck` -- what the ``freeze-in-flight`` fault writes into a frozen
  master's sockets (a new durable SUBSCRIBE, tracked sends and their idle barrier), and
  the deliveries that must follow.
* :class:`Consumer` -- one subscription in one ack mode (``auto``, ``client``,
  ``client-individual``; durable topic subscriptions with a ``client-id``; a JMS
  ``selector`` if given). A wire tap
  (``Connection.add_wire_tap``) records every MESSAGE as it arrives (``wire``, before the client's duplicate
  filter), the loop records what the application gets (``app``) and acks it
  (``Ack`` with the link generation the message came on). Every ``sync_s`` after an
  ack it sends one receipted persistent message to its own sync queue on the same
  connection (``Sync``: the link generation before and after; it drains that queue
  through an ``auto`` subscription): the checker's proof that the acks before it are
  durable.

A connection that dies for good (``ReconnectExhausted``, closed) is recorded in
``errors`` and replaced; a producer's outstanding messages then count as ``unknown``.
Times come from the injected ``clock`` (seconds from the run's start).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from amqtransport.client import Connection, Message
from amqtransport.errors import (
    AmqTransportError,
    BrokerError,
    ConnectionClosed,
    ReconnectExhausted,
    SendTimeout,
)
from amqtransport.stomp import Frame
from chaos.harness.clients import ClientSettings
from chaos.nemesis.history import Ack, ClientError, Delivery, History, Send, Subscriber, Sync, Tx

__all__ = ["Worker", "ReceiptedProducer", "TxProducer", "FireAndForgetProducer", "Consumer", "InFlightCheck"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class Worker(threading.Thread):
    """A client thread: connect (retrying), ``work(conn)`` until stopped, reconnect on a
    dead connection. Subclasses implement :meth:`work`."""

    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock) -> None:
        super().__init__(name=f"nemesis {name}", daemon=True)
        self.client = name
        self.settings = settings
        self.history = history
        self.clock = clock
        self.stopping = threading.Event()
        self.started_work = threading.Event()
        self.conn: Connection | None = None
        self.reconnects = 0

    def stop(self) -> None:
        self.stopping.set()

    def error(self, exc: BaseException) -> None:
        self.history.add(ClientError(self.clock(), self.client, _err(exc)))

    def work(self, conn: Connection) -> None:
        raise NotImplementedError

    def abandon(self) -> None:
        """The connection died with work outstanding: record what is now unknown."""

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.conn = self.settings.connect()
            except Exception as exc:  # a broker down for longer than the URI's patience
                self.error(exc)
                self.stopping.wait(0.5)
                continue
            try:
                self.started_work.set()
                self.work(self.conn)
            except Exception as exc:
                self.error(exc)
                self.abandon()
                self.reconnects += 1
                log.info("%s: connection lost for good (%r); reconnecting", self.client, exc)
            finally:
                try:
                    self.conn.close()
                except Exception:  # closing a broken connection: nothing more to learn
                    log.debug("%s: close failed", self.client, exc_info=True)

    def pace(self, next_at: float, interval: float) -> float:
        """Sleep until ``next_at`` (no catch-up burst after a stall); the next slot."""
        delay = next_at - self.clock()
        if delay > 0:
            self.stopping.wait(delay)
        elif delay < -1.0:
            next_at = self.clock()
        return next_at + interval


class ReceiptedProducer(Worker):
    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 dest: str, rate: float, window: int = 8, flush_timeout_s: float = 30.0) -> None:
        super().__init__(name, settings, history, clock)
        self.dest = dest
        self.rate = rate
        self.window = window
        self.flush_timeout_s = flush_timeout_s
        self.seq = 0
        self.pending: deque[tuple[str, float]] = deque()  # (key, t) in send order, not yet settled

    def _record(self, key: str, t: float, outcome: str, error: str = "") -> None:
        self.history.add(Send(t, self.client, self.dest, key, "rcpt", outcome, self.clock(), error))

    def options(self, key: str, t: float) -> dict[str, Any]:
        """Extra arguments of ``Producer.send`` for ``key`` (:mod:`chaos.nemesis.features`:
        a priority, a delay, a group); none here."""
        return {}

    def work(self, conn: Connection) -> None:
        producer = conn.producer(window=self.window)
        settled = failed = 0

        def settle() -> None:
            nonlocal settled
            while settled < producer.receipted and self.pending:
                key, t = self.pending.popleft()
                self._record(key, t, "ok")
                settled += 1

        interval = 1.0 / self.rate
        next_at = self.clock()
        while not self.stopping.is_set():
            key = f"{self.client}:{self.seq}"
            self.seq += 1
            t_key = self.clock()
            self.pending.append((key, t_key))
            before = producer.sent
            try:
                producer.send(self.dest, key, idempotency_key=key, **self.options(key, t_key))
            except (BrokerError, SendTimeout) as exc:  # one request failed; the connection lives on
                self.error(exc)
                if producer.sent == before:  # this one never went out
                    k, t = self.pending.pop()
                    self._record(k, t, "unknown", _err(exc))
                settle()
                lost = producer.sent - producer.receipted - producer.outstanding - failed
                for _ in range(max(0, lost)):
                    k, t = self.pending.popleft()
                    self._record(k, t, "fail" if isinstance(exc, BrokerError) else "unknown", _err(exc))
                    failed += 1
                next_at = self.pace(next_at, interval)
                continue
            settle()
            next_at = self.pace(next_at, interval)
        try:
            producer.flush(timeout=self.flush_timeout_s)
        finally:
            settle()
            self.abandon()

    def abandon(self) -> None:
        while self.pending:
            key, t = self.pending.popleft()
            self._record(key, t, "unknown", "connection lost or stopped before the receipt")


class TxProducer(Worker):
    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 dest: str, rate: float, size: int = 3) -> None:
        super().__init__(name, settings, history, clock)
        self.dest = dest
        self.rate = rate  # transactions per second
        self.size = size
        self.n = 0

    def work(self, conn: Connection) -> None:
        interval = 1.0 / self.rate
        next_at = self.clock()
        while not self.stopping.is_set():
            self.n += 1
            name = f"{self.client}:tx{self.n}"
            keys = tuple(f"{name}:{j}" for j in range(self.size))
            t = self.clock()
            stage = "begin"
            try:
                with conn.transaction() as tx:
                    stage = "send"
                    for key in keys:
                        tx.send(self.dest, key, idempotency_key=key)
                    stage = "commit"
            except AmqTransportError as exc:
                outcome = "in-doubt" if stage == "commit" else "aborted"
                self.history.add(Tx(t, self.client, self.dest, name, keys, outcome, self.clock(), _err(exc)))
                if isinstance(exc, ReconnectExhausted | ConnectionClosed):
                    raise  # the connection is gone: the worker reconnects
                self.error(exc)
                next_at = self.pace(next_at, interval)
                continue
            self.history.add(Tx(t, self.client, self.dest, name, keys, "committed", self.clock()))
            next_at = self.pace(next_at, interval)


class FireAndForgetProducer(Worker):
    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 dest: str, rate: float) -> None:
        sep = "&" if "?" in settings.uri else "?"
        super().__init__(name, replace(settings, uri=f"{settings.uri}{sep}trackMessages=true"), history, clock)
        self.dest = dest
        self.rate = rate
        self.seq = 0
        self.written: list[tuple[str, float]] = []  # (key, t) written on the current connection


    def work(self, conn: Connection) -> None:
        self.written = []
        interval = 1.0 / self.rate
        next_at = self.clock()
        while not self.stopping.is_set():
            key = f"{self.client}:{self.seq}"
            self.seq += 1
            t = self.clock()
            try:
                conn.send(self.dest, key, idempotency_key=key, receipt=False)
            except AmqTransportError as exc:
                self.history.add(Send(t, self.client, self.dest, key, "ff", "unknown", self.clock(), _err(exc)))
                if not isinstance(exc, SendTimeout):
                    raise
                self.error(exc)
                next_at = self.pace(next_at, interval)
                continue
            self.history.add(Send(t, self.client, self.dest, key, "ff", "none", t))
            self.written.append((key, t))
            next_at = self.pace(next_at, interval)
        # one receipted send at the end proves every tracked send before it (closing
        # the connection drops the replay cache)
        key = f"{self.client}:last"
        t = self.clock()
        try:
            conn.send(self.dest, key, idempotency_key=key)
        except AmqTransportError as exc:
            self.history.add(Send(t, self.client, self.dest, key, "rcpt", "unknown", self.clock(), _err(exc)))
            self.abandon()
            return
        self.history.add(Send(t, self.client, self.dest, key, "rcpt", "ok", self.clock()))

    def abandon(self) -> None:
        """The connection died for good (or the last proof failed): what it wrote may
        have gone with its replay cache."""
        for key, t in self.written:
            self.history.add(Send(t, self.client, self.dest, key, "ff", "unknown", self.clock(),
                                  "its connection died for good"))
        self.written = []


class InFlightCheck(threading.Thread):
    """What a ``freeze-in-flight`` fault writes into a frozen master's sockets, and the
    check of it. Its clients connect (:meth:`connect`) before the freeze, with 10 s
    heart-beats (the clients' default) so that they are still on the frozen master when
    it thaws; then (:meth:`start`, right after the SIGSTOP):

    * a new client creates a new durable subscription to its own topic; once
      ``subscribe()`` returned, ``count`` receipted messages are published to that topic;
    * a trackMessages client writes ``count`` fire-and-forget sends to its own queue and
      pauses, so that its idle barrier (BEGIN + receipted ABORT) follows them; it ends
      with one receipted send, and a consumer then drains that queue.

    Both destinations are recorded as subscribers, so the checker's ``lost`` and
    ``ff-lost`` rules judge them (the thawed master must receipt neither the SUBSCRIBE
    nor the barrier when it was replaced meanwhile). The durable subscription is
    deleted at the end."""

    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 count: int = 20, drain_s: float = 30.0) -> None:
        super().__init__(name=f"nemesis {name}", daemon=True)
        self.client = name
        self.topic = f"/topic/nemesis.fresh.{name}"
        self.queue = f"/queue/nemesis.tracked.{name}"
        self.settings = replace(settings, heartbeat_ms=10000)
        self.history = history
        self.clock = clock
        self.count = count
        self.drain_s = drain_s
        self.sub_conn: Connection | None = None
        self.ff_conn: Connection | None = None

    def connect(self) -> None:
        """Connect both clients now, or raise: the fault's thread calls this, and it alone
        heals the other faults (a cut client link must not make it wait for ever)."""
        sep = "&" if "?" in self.settings.uri else "?"
        uri = f"{self.settings.uri}{sep}startupMaxReconnectAttempts=2"
        try:
            self.sub_conn = replace(self.settings, uri=uri, client_id=f"nemesis-{self.client}").connect()
            self.ff_conn = replace(self.settings, uri=f"{uri}&trackMessages=true").connect()
        except BaseException:
            for conn in (self.sub_conn, self.ff_conn):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
            raise

    def run(self) -> None:
        assert self.sub_conn is not None and self.ff_conn is not None, "connect() first"
        self.history.add(Subscriber(self.client, self.topic, "client-individual", True))
        self.history.add(Subscriber(f"{self.client}-ff", self.queue, "client-individual"))
        result: dict[str, Any] = {}
        subscribing = threading.Thread(target=self._subscribe, args=(result,), daemon=True)
        subscribing.start()
        tracked = self._tracked()
        subscribing.join(90)
        sub = result.get("sub")
        try:
            if sub is not None:
                self._drain(self.client, sub, self._publish(self.topic))
                with contextlib.suppress(AmqTransportError):
                    sub.unsubscribe(durable=True)
            if tracked:
                with self.settings.connect() as conn:
                    self._drain(f"{self.client}-ff", conn.subscribe(self.queue, ack="client-individual"), tracked)
        except AmqTransportError as exc:
            self.history.add(ClientError(self.clock(), self.client, _err(exc)))
        finally:
            for conn in (self.sub_conn, self.ff_conn):
                with contextlib.suppress(Exception):
                    conn.close()

    def _subscribe(self, result: dict[str, Any]) -> None:
        assert self.sub_conn is not None
        try:
            result["sub"] = self.sub_conn.subscribe(self.topic, ack="client-individual", durable_name=self.client)
        except AmqTransportError as exc:
            self.history.add(ClientError(self.clock(), self.client, _err(exc)))

    def _tracked(self) -> set[str]:
        """The fire-and-forget sends, the pause for the barrier, the receipted last send:
        the keys that must arrive (none when the last send failed: not a promise)."""
        conn = self.ff_conn
        assert conn is not None
        keys = [f"{self.client}-ff:{i}" for i in range(self.count)]
        t = self.clock()
        try:
            for key in keys:
                conn.send(self.queue, key, idempotency_key=key, receipt=False)
            time.sleep(1.3)  # the transport writes its idle barrier after 1 s
            last = f"{self.client}-ff:last"
            conn.send(self.queue, last, idempotency_key=last)
        except AmqTransportError as exc:
            self.history.add(ClientError(self.clock(), self.client, _err(exc)))
            return set()
        self.history.extend([Send(t, self.client, self.queue, k, "ff", "none", t) for k in keys])
        self.history.add(Send(t, self.client, self.queue, last, "rcpt", "ok", self.clock()))
        return {*keys, last}

    def _publish(self, dest: str) -> set[str]:
        sent: set[str] = set()
        with self.settings.connect() as pub:
            for i in range(self.count):
                key = f"{self.client}:{i}"
                t = self.clock()
                try:
                    pub.send(dest, key, idempotency_key=key)
                except AmqTransportError as exc:
                    self.history.add(Send(t, self.client, dest, key, "rcpt", "unknown", self.clock(), _err(exc)))
                    continue
                self.history.add(Send(t, self.client, dest, key, "rcpt", "ok", self.clock()))
                sent.add(key)
        return sent

    def _drain(self, name: str, sub: Any, keys: set[str]) -> None:
        got: set[str] = set()
        deadline = time.monotonic() + self.drain_s
        while not keys <= got and time.monotonic() < deadline:
            msg = sub.receive(timeout=0.2)
            if msg is None:
                continue
            key = msg.body.decode("utf-8", "replace")
            self.history.add(Delivery(self.clock(), name, key, msg.message_id or "", msg.generation, "app"))
            got.add(key)
            msg.ack()


class Consumer(Worker):
    #: one of several consumers sharing a queue (a message must reach one of them): not
    #: a ``Subscriber`` of the history (:mod:`chaos.nemesis.features` judges them)
    competing = False

    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 dest: str, ack: str, durable: bool = False, sync_s: float = 0.3, selector: str = "") -> None:
        if durable:
            settings = replace(settings, client_id=f"nemesis-{name}")
        super().__init__(name, settings, history, clock)
        self.dest = dest
        self.ack = ack
        self.durable = durable
        self.selector = selector  # a JMS selector ("": none)
        self.sync_s = sync_s
        self.sync_dest = f"/queue/nemesis.sync.{name}"
        self.lock = threading.Lock()
        self.app_keys: set[str] = set()  # keys the application got (for the runner's drain)

    def has(self, key: str) -> bool:
        with self.lock:
            return key in self.app_keys

    def work(self, conn: Connection) -> None:
        state = self.tap(conn)
        headers = {"activemq.subscriptionName": self.client} if self.durable else None
        sub = conn.subscribe(self.dest, ack=self.ack, headers=headers,  # type: ignore[arg-type]
                             selector=self.selector or None)
        state["sub"] = sub.id
        sync_sub = conn.subscribe(self.sync_dest, ack="auto")
        last_sync = self.clock()
        unsynced = False
        while not self.stopping.is_set():
            msg = sub.receive(timeout=0.05)
            if msg is not None:
                self.take(msg)
                unsynced = True
            while sync_sub.receive(timeout=0) is not None:
                pass
            if unsynced and self.clock() - last_sync >= self.sync_s:
                last_sync = self.clock()
                unsynced = False
                self._sync(conn)

    def tap(self, conn: Connection, by_destination: bool = False) -> dict[str, str]:
        """Record every MESSAGE of the subscription whose id is put in the returned
        dict's ``"sub"`` as it arrives (``wire``); with ``by_destination``, every MESSAGE
        from ``dest`` (what the broker sends before ``subscribe()`` returns the id)."""
        state: dict[str, str] = {}

        def on_wire(frame: Frame, generation: int) -> None:
            if (frame.get("destination") != self.dest if by_destination
                    else frame.get("subscription") != state.get("sub")):
                return
            key = frame.body.decode("utf-8", "replace")
            self.history.add(Delivery(self.clock(), self.client, key, frame.get("message-id") or "", generation,
                                      "wire"))

        conn.add_wire_tap(on_wire)
        return state

    def take(self, msg: Message) -> str:
        """The application got ``msg``: record it, ack it (unless ``auto``); its key."""
        key: str = msg.body.decode("utf-8", "replace")
        self.history.add(Delivery(self.clock(), self.client, key, msg.message_id or "", msg.generation, "app"))
        with self.lock:
            self.app_keys.add(key)
        if self.ack != "auto":
            msg.ack()
            self.history.add(Ack(self.clock(), self.client, key, msg.generation))
        return key

    def _sync(self, conn: Connection) -> None:
        transport = conn.transport
        g0 = transport.generation
        t0 = self.clock()
        ok = True
        try:
            conn.send(self.sync_dest, "sync", idempotency_key=uuid.uuid4().hex)
        except AmqTransportError as exc:
            ok = False
            self.error(exc)
        self.history.add(Sync(t0, self.client, g0, transport.generation, self.clock(), ok))
