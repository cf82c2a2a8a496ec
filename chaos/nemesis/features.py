"""The nemesis's ActiveMQ-feature clients: scheduled, grouped, prioritized and selected messages.

Theory of operation
-------------------
Four more kinds of client join the workload (:func:`chaos.nemesis.runner.build_workload`);
each records a :class:`~chaos.nemesis.history.MessageProps` per message beside the
usual ``Send``, so the rules of :mod:`chaos.nemesis.feature_rules` know what was asked:

* :class:`ScheduledProducer` -- a :class:`~chaos.nemesis.workload.ReceiptedProducer`
  whose every message carries ``AMQ_SCHEDULED_DELAY`` (``delay=``) drawn from 200-1500
  ms (seeded), into a queue read by one ``client-individual`` consumer. The ordinary
  ``lost`` and ``duplicate`` rules judge "delivered once"; ``scheduled-early`` and
  ``scheduled-late`` judge the time.
* :class:`GroupProducer` -- every message carries ``JMSXGroupID`` (one of
  ``groups``, in turn), into a queue shared by several :class:`GroupConsumer`\\ s
  (competing consumers: a message must reach *one* of them, so they are not
  ``Subscriber``\\ s of the history; the ``group-*`` rules judge them).
* :class:`PriorityBacklog` -- one client that builds a backlog and drains it, over and
  over: it sends ``size`` receipted messages with priorities drawn from 0-9 (one
  *batch*), one at a time, while it has no subscription; then it subscribes
  (``client-individual``), takes and acks until the batch is in (or ``drain_s``
  passed), unsubscribes and sends a sync. Every message of a batch was receipted --
  stored -- before the SUBSCRIBE that drains it was written, so the broker must hand
  the batch out highest priority first, FIFO within a priority (``priority-order``).
  It is an ordinary subscriber of its queue (``lost``, ``duplicate`` and
  ``redelivered-after-ack`` judge it too). The client's duplicate filter is per
  subscription, and this one subscribes anew for each batch: an ACK lost in a failover
  (the master died before it had it) brings the message back in the *next* session,
  past the filter. The worker drops such a copy itself, as an idempotent application
  would (acked, recorded on the wire, not handed on); ``redelivered-after-ack`` still
  fails it if that ACK had been proved durable.

* :class:`SelectorProducer` and :class:`SelectiveConsumer` -- receipted persistent
  messages (random priorities) carrying a string property ``k``: ``hit`` for about one
  in ``HIT_ONE_IN``, ``miss`` otherwise (only hits once ``max_misses`` misses were
  sent: the backlog stays bounded in a long run, and the hits keep coming through it),
  into a queue whose one consumer subscribes with ``selector="k = 'hit'"``
  (``client-individual``). Nobody takes the misses while the run goes on, so they pile
  up past the pair's ``page_window`` (:data:`chaos.nemesis.cluster.BROKER_CONFIG`)
  and the broker serves the hits by scanning its paged messages in place
  (``amqtransport/broker/dispatch/scan.py``). At the end
  (:meth:`SelectiveConsumer.hand_over`) the selective consumer waits for every
  receipted hit and leaves, and its ``drain`` -- a consumer of the same queue without
  a selector -- takes what is left: every receipted miss must still be there. Both are
  subscribers of the history (with their selectors); the ``selector-*`` rules judge
  them, ``duplicate`` and ``redelivered-after-ack`` too.

The runner's final drain calls :meth:`PriorityBacklog.stop_sending` with the producers'
stop: from then on it only receives; then :meth:`SelectiveConsumer.hand_over`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from amqtransport.client import Connection
from amqtransport.errors import AmqTransportError, BrokerError, ConnectionClosed, ReconnectExhausted
from chaos.harness.clients import ClientSettings
from chaos.nemesis.history import Ack, History, MessageProps, Send
from chaos.nemesis.workload import Clock, Consumer, ReceiptedProducer

__all__ = ["ScheduledProducer", "GroupProducer", "GroupConsumer", "PriorityBacklog", "SelectorProducer",
           "SelectiveConsumer", "DELAY_MS", "SELECTOR", "HIT_ONE_IN"]

DELAY_MS = (200, 1500)  # the range of AMQ_SCHEDULED_DELAY drawn per message
SELECTOR = "k = 'hit'"  # the selective consumer's selector
HIT_ONE_IN = 10  # about one message in this many is a hit


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class ScheduledProducer(ReceiptedProducer):
    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 dest: str, rate: float, seed: int = 0) -> None:
        super().__init__(name, settings, history, clock, dest=dest, rate=rate)
        self.rng = random.Random(f"{seed}:{name}")

    def options(self, key: str, t: float) -> dict[str, Any]:
        delay = self.rng.randint(*DELAY_MS)
        self.history.add(MessageProps(t, key, delay_ms=delay))
        return {"delay": delay}


class GroupProducer(ReceiptedProducer):
    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 dest: str, rate: float, groups: int = 4) -> None:
        super().__init__(name, settings, history, clock, dest=dest, rate=rate)
        self.groups = groups

    def options(self, key: str, t: float) -> dict[str, Any]:
        group = f"{self.client}-g{self.seq % self.groups}"
        self.history.add(MessageProps(t, key, group=group))
        return {"headers": {"JMSXGroupID": group}}


class GroupConsumer(Consumer):
    """One of the consumers sharing a grouped queue."""

    competing = True


class PriorityBacklog(Consumer):
    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 dest: str, size: int = 10, pause_s: float = 1.0, drain_s: float = 10.0, seed: int = 0) -> None:
        super().__init__(name, settings, history, clock, dest=dest, ack="client-individual")
        self.size = size
        self.pause_s = pause_s
        self.drain_s = drain_s
        self.rng = random.Random(f"{seed}:{name}")
        self.batch = 0
        self.sending = threading.Event()
        self.sending.set()

    def stop_sending(self) -> None:
        self.sending.clear()

    def work(self, conn: Connection) -> None:
        self.tap(conn, by_destination=True)  # the batch comes before subscribe() returns
        sync_sub = conn.subscribe(self.sync_dest, ack="auto")
        while not self.stopping.is_set():
            batch = self._send_batch(conn) if self.sending.is_set() else set()
            sub = conn.subscribe(self.dest, ack="client-individual")
            deadline = self.clock() + self.drain_s
            got: set[str] = set()
            while not self.stopping.is_set():
                if self.sending.is_set() and (batch <= got or self.clock() > deadline):
                    break
                msg = sub.receive(timeout=0.05)
                if msg is None:
                    continue
                key = msg.body.decode("utf-8", "replace")
                if self.has(key):  # a copy from an earlier session (see the class docstring)
                    msg.ack()
                    self.history.add(Ack(self.clock(), self.client, key, msg.generation))
                    continue
                got.add(self.take(msg))
            if self.stopping.is_set():
                return
            sub.unsubscribe()
            while sync_sub.receive(timeout=0) is not None:
                pass
            self._sync(conn)
            self.stopping.wait(self.pause_s)

    def _send_batch(self, conn: Connection) -> set[str]:
        """One batch, one receipted SEND at a time; the keys the broker receipted."""
        self.batch += 1
        ok: set[str] = set()
        for i in range(self.size):
            key = f"{self.client}:b{self.batch}:{i}"
            priority = self.rng.randrange(10)
            t = self.clock()
            self.history.add(MessageProps(t, key, priority=priority, batch=self.batch))
            try:
                conn.send(self.dest, key, idempotency_key=key, priority=priority)
            except AmqTransportError as exc:
                outcome = "fail" if isinstance(exc, BrokerError) else "unknown"
                self.history.add(Send(t, self.client, self.dest, key, "rcpt", outcome, self.clock(), _err(exc)))
                if isinstance(exc, ReconnectExhausted | ConnectionClosed):
                    raise
                self.error(exc)
                continue
            self.history.add(Send(t, self.client, self.dest, key, "rcpt", "ok", self.clock()))
            ok.add(key)
        return ok


class SelectorProducer(ReceiptedProducer):
    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 dest: str, rate: float, seed: int = 0, max_misses: int = 2000) -> None:
        super().__init__(name, settings, history, clock, dest=dest, rate=rate)
        self.rng = random.Random(f"{seed}:{name}")
        self.max_misses = max_misses
        self.misses = 0
        self.k: dict[str, str] = {}  # key -> its k, until its outcome is known
        self.lock = threading.Lock()
        self.receipted: dict[str, str] = {}  # key -> its k, for the receipted ones

    def options(self, key: str, t: float) -> dict[str, Any]:
        hit = self.misses >= self.max_misses or self.rng.randrange(HIT_ONE_IN) == 0
        self.misses += not hit
        k = "hit" if hit else "miss"
        priority = self.rng.randrange(10)
        self.k[key] = k
        self.history.add(MessageProps(t, key, priority=priority, k=k))
        return {"headers": {"k": k}, "priority": priority}

    def _record(self, key: str, t: float, outcome: str, error: str = "") -> None:
        super()._record(key, t, outcome, error)
        k = self.k.pop(key, "")
        if outcome == "ok" and k:
            with self.lock:
                self.receipted[key] = k

    def keys(self, k: str) -> set[str]:
        """The receipted keys whose ``k`` is ``k``."""
        with self.lock:
            return {key for key, v in self.receipted.items() if v == k}


class SelectiveConsumer(Consumer):
    """The selector feature's consumer (``selector``, ``client-individual``) of
    ``producer``'s queue, and the ``drain`` that takes the rest at the end."""

    def __init__(self, name: str, settings: ClientSettings, history: History, clock: Clock, *,
                 producer: SelectorProducer, selector: str = SELECTOR) -> None:
        super().__init__(name, settings, history, clock, dest=producer.dest, ack="client-individual",
                         selector=selector)
        self.producer = producer
        self.drain = Consumer(f"{name}-drain", settings, history, clock, dest=producer.dest, ack="client-individual")

    def hand_over(self, timeout: float) -> int:
        """After the producer stopped: wait (up to ``timeout``) for every receipted hit,
        leave, start the drain, wait (as long again) for every receipted miss; how many
        of them are still missing."""
        hits = self.producer.keys("hit")
        _wait_until(lambda: all(self.has(k) for k in hits), timeout)
        self.stop()
        self.join(timeout)
        self.drain.start()
        misses = self.producer.keys("miss")
        _wait_until(lambda: all(self.drain.has(k) for k in misses), timeout)
        return sum(not self.has(k) for k in hits) + sum(not self.drain.has(k) for k in misses)


def _wait_until(done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)
