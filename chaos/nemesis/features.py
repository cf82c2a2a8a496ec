"""The nemesis's ActiveMQ-feature clients: scheduled, grouped and prioritized messages.

Theory of operation
-------------------
Three more kinds of client join the workload (:func:`chaos.nemesis.runner.build_workload`);
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

The runner's final drain calls :meth:`PriorityBacklog.stop_sending` with the producers'
stop: from then on it only receives.
"""

from __future__ import annotations

import random
import threading
from typing import Any

from amqtransport.client import Connection
from amqtransport.errors import AmqTransportError, BrokerError, ConnectionClosed, ReconnectExhausted
from chaos.harness.clients import ClientSettings
from chaos.nemesis.history import Ack, History, MessageProps, Send
from chaos.nemesis.workload import Clock, Consumer, ReceiptedProducer

__all__ = ["ScheduledProducer", "GroupProducer", "GroupConsumer", "PriorityBacklog", "DELAY_MS"]

DELAY_MS = (200, 1500)  # the range of AMQ_SCHEDULED_DELAY drawn per message


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
