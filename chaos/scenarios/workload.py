"""The traffic of a chaos round: one receipted producer thread, one consumer thread.

Theory of operation
-------------------
Both threads talk to the brokers through the same ``failover:`` URI, whose leaves are
the Toxiproxy proxies in front of the brokers, on two separate connections (so a
fault hits both, as it would hit two applications).

*Producer.* Sends ``round-id:seq`` bodies (seq = 0, 1, 2, ...) through the public
:class:`amqtransport.client.Producer`, which keeps up to ``window`` receipts in
flight, at a steady ``rate`` (messages/s; 0 = as fast as the window allows). The
producer reaps receipts in send order, so after each call the first
``producer.receipted`` messages are known to be receipted: the thread stamps each of
them with the time it learned of it (at worst one send interval late; while the
window is full, ``send`` returns as soon as the oldest receipt arrives). The
idempotency key is derived from the body, so a replayed send is recognisably the same
message everywhere.

*Consumer.* Subscribes with ``ack="client-individual"`` and acks each message after
recording it: at-least-once. With the client's duplicate filter on (the default), a
copy of a message the application already has is dropped inside the client and
counted in ``Connection.duplicates`` ("deduped"); a copy that reaches the application
anyway is a **duplicate** (an invariant breach). A message whose body does not belong
to this round is counted as ``foreign``.

Times are ``clock()`` seconds (``time.monotonic`` unless injected); the round runner
turns them into offsets from the round's start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from amqtransport.client import Connection
from amqtransport.errors import AmqTransportError
from amqtransport.stomp import Frame
from chaos.harness.clients import ClientSettings

__all__ = ["ConnectionEvents", "ProducerThread", "ConsumerThread"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass
class ConnectionEvents:
    """A failover listener that timestamps interruptions and resumptions."""

    clock: Clock = time.monotonic
    interrupted: list[float] = field(default_factory=list)
    resumed: list[tuple[float, str]] = field(default_factory=list)
    failed: list[tuple[float, str]] = field(default_factory=list)

    def on_interrupted(self, error: BaseException) -> None:
        self.interrupted.append(self.clock())

    def on_resumed(self, address: str) -> None:
        self.resumed.append((self.clock(), str(address)))

    def on_failed(self, error: BaseException) -> None:
        self.failed.append((self.clock(), repr(error)))

    def first_interruption_after(self, t: float) -> float | None:
        return next((x for x in self.interrupted if x >= t), None)


def body_of(round_id: str, seq: int) -> str:
    return f"{round_id}:{seq}"


def seq_of(round_id: str, body: str) -> int | None:
    prefix, _, number = body.rpartition(":")
    if prefix != round_id or not number.isdigit():
        return None
    return int(number)


class ProducerThread(threading.Thread):
    """Receipted sends at a steady rate until :meth:`stop` (see the module docstring)."""

    def __init__(
        self,
        settings: ClientSettings,
        destination: str,
        round_id: str,
        *,
        rate: float = 200.0,
        window: int = 16,
        clock: Clock = time.monotonic,
        flush_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(name=f"chaos-producer {round_id}", daemon=True)
        self.settings = settings
        self.destination = destination
        self.round_id = round_id
        self.rate = rate
        self.window = window
        self.clock = clock
        self.flush_timeout_s = flush_timeout_s
        self.events = ConnectionEvents(clock)
        self.send_times: list[float] = []  # index = seq: when send() was called
        self.receipt_times: list[float] = []  # index = seq: when its receipt was known
        self.error: BaseException | None = None
        self.connected = threading.Event()
        self._stop_event = threading.Event()
        self._conn: Connection | None = None

    @property
    def sent(self) -> int:
        return len(self.send_times)

    @property
    def receipted(self) -> int:
        return len(self.receipt_times)

    def stop(self) -> None:
        self._stop_event.set()

    def abort(self) -> None:
        """Close the connection under a producer stuck waiting (ends the thread)."""
        self._stop_event.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection: nothing more to learn
                log.debug("abort: close failed", exc_info=True)

    def _stamp(self, receipted: int) -> None:
        now = self.clock()
        while len(self.receipt_times) < receipted:
            self.receipt_times.append(now)

    def run(self) -> None:
        try:
            self._conn = self.settings.connect(self.events)
        except BaseException as exc:
            self.error = exc
            self.connected.set()
            return
        self.connected.set()
        conn = self._conn
        interval = 1.0 / self.rate if self.rate > 0 else 0.0
        try:
            producer = conn.producer(window=self.window)
            next_at = self.clock()
            seq = 0
            while not self._stop_event.is_set():
                body = body_of(self.round_id, seq)
                self.send_times.append(self.clock())
                producer.send(self.destination, body, idempotency_key=body)
                self._stamp(producer.receipted)
                seq += 1
                if interval:
                    next_at += interval
                    delay = next_at - self.clock()
                    if delay > 0:
                        self._stop_event.wait(delay)
                    elif delay < -1.0:
                        next_at = self.clock()  # after a stall, do not burst to catch up
            producer.flush(timeout=self.flush_timeout_s)
            self._stamp(producer.receipted)
        except BaseException as exc:  # recorded, judged by the invariants
            self.error = exc
            log.info("producer %s stopped by %r", self.round_id, exc)
        finally:
            try:
                conn.close()
            except Exception:
                log.debug("producer close failed", exc_info=True)


class ConsumerThread(threading.Thread):
    """Receives, records and acks every message of the round's queue."""

    def __init__(
        self,
        settings: ClientSettings,
        destination: str,
        round_id: str,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(name=f"chaos-consumer {round_id}", daemon=True)
        self.settings = settings
        self.destination = destination
        self.round_id = round_id
        self.clock = clock
        self.events = ConnectionEvents(clock)
        self.received: dict[int, float] = {}  # seq -> first arrival
        self.duplicates = 0  # copies that reached the application
        # every MESSAGE frame as it arrived, before the client's duplicate filter:
        # seq -> message-ids seen (one per copy), to tell redeliveries (same id) from
        # sends the broker stored twice (a new id for the same message)
        self.wire_ids: dict[int, list[str]] = {}
        self.foreign = 0
        self.error: BaseException | None = None
        self.subscribed = threading.Event()
        self._stop_event = threading.Event()
        self.lock = threading.Lock()
        self._conn: Connection | None = None

    @property
    def deduped(self) -> int:
        """Copies dropped by the client's duplicate filter."""
        return self._conn.duplicates if self._conn is not None else 0

    def count(self) -> int:
        with self.lock:
            return len(self.received)

    def has_all(self, seqs: range) -> bool:
        with self.lock:
            return all(s in self.received for s in seqs)

    def stop(self) -> None:
        self._stop_event.set()

    def _tap(self, conn: Connection) -> None:
        """Look at each MESSAGE before the duplicate filter (the client's wire tap)."""

        def tap(frame: Frame, generation: int) -> None:
            seq = seq_of(self.round_id, frame.body.decode("utf-8", "replace"))
            if seq is not None:
                with self.lock:
                    self.wire_ids.setdefault(seq, []).append(frame.get("message-id") or "")

        conn.add_wire_tap(tap)

    def wire_counts(self) -> tuple[int, dict[int, list[str]]]:
        """(copies the broker delivered again under the same message-id,
        {seq: its distinct message-ids} for every message that came under more than one
        id, i.e. a send the broker stored twice)."""
        with self.lock:
            redelivered = 0
            twice: dict[int, list[str]] = {}
            for seq, ids in sorted(self.wire_ids.items()):
                distinct = list(dict.fromkeys(ids))
                redelivered += len(ids) - len(distinct)
                if len(distinct) > 1:
                    twice[seq] = distinct
            return redelivered, twice

    def run(self) -> None:
        try:
            self._conn = self.settings.connect(self.events)
            self._tap(self._conn)
            sub = self._conn.subscribe(self.destination, ack="client-individual")
        except BaseException as exc:
            self.error = exc
            self.subscribed.set()
            if self._conn is not None:
                self._conn.close()
            return
        self.subscribed.set()
        conn = self._conn
        try:
            while not self._stop_event.is_set():
                msg = sub.receive(timeout=0.1)
                if msg is None:
                    continue
                now = self.clock()
                seq = seq_of(self.round_id, msg.body.decode("utf-8", "replace"))
                with self.lock:
                    if seq is None:
                        self.foreign += 1
                    elif seq in self.received:
                        self.duplicates += 1
                    else:
                        self.received[seq] = now
                try:
                    msg.ack()
                except AmqTransportError as exc:  # the broker redelivers; dedupe copes
                    log.debug("ack failed: %r", exc)
        except BaseException as exc:
            self.error = exc
            log.info("consumer %s stopped by %r", self.round_id, exc)
        finally:
            try:
                conn.close()
            except Exception:
                log.debug("consumer close failed", exc_info=True)
