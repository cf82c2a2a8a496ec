"""What the sync client (``client.py``) and the asyncio client (``aio/``) share about
the messages they receive: the message's read-only view, and :class:`Inbound`, the
duplicate filter and acknowledgement rules of one connection.

Theory of operation
-------------------
A MESSAGE frame reaches a connection tagged with the generation of the link it came
on. :meth:`Inbound.arrived` passes it through the **duplicate filter**
(:mod:`amqtransport.audit`): a copy of a message the application already has is
dropped (and, in the client-acknowledged modes, acknowledged once the broker may take
that ACK). An ACK or NACK is valid only on the link its message came on, so every
acknowledgement goes out through the transport's ``write_if_current``: on a link that
has failed since, nothing is written (the broker redelivers, the filter drops or acks
the copy). Writes of ACK/NACK frames never wait, in either driver, so these rules are
written once, here, and both clients call them.

``msg.process()`` (:class:`Processing`) marks the application's handling of one
message, in the manner of aio-pika's ``message.process()``: ``with msg.process():``
(sync) or ``async with msg.process():`` (asyncio) acknowledges the message when the
block ends and rejects it (NACK: redelivered or dead-lettered) when the block raises,
in the client ack modes (``ack="auto"``: nothing to settle). It is also the seam the
OpenTelemetry instrumentation (``amqtransport.otel``) wraps to time the processing
in a ``process`` span; without it the block costs nothing more.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Protocol

from amqtransport.audit import Delivery, DuplicateFilter, message_key
from amqtransport.errors import LocalProtocolError, TransactionRolledBack
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.stomp.session import ack_frame
from amqtransport.transports.dialect import Dialect

__all__ = ["AckWriter", "Inbound", "Processing", "ReceivedMessage"]

log = logging.getLogger(__name__)


class AckWriter(Protocol):
    """What :class:`Inbound` needs of a transport (thread or asyncio driver)."""

    @property
    def version(self) -> str: ...

    @property
    def dialect(self) -> Dialect: ...

    def write_if_current(self, frame: Frame, generation: int) -> bool: ...

    def write_many_if_current(self, frames: list[Frame], generation: int) -> bool: ...


class ReceivedMessage:
    """A received message's data: the frame, the link generation it came on, the
    subscription's id and ack mode, and its duplicate-filter entry."""

    __slots__ = ("frame", "generation", "key", "sub_id", "ack_mode", "_delivery")

    def __init__(self, frame: Frame, sub_id: str, ack_mode: str, generation: int, key: str,
                 delivery: Delivery | None) -> None:
        self.frame = frame
        self.sub_id = sub_id
        self.ack_mode = ack_mode
        self.generation = generation
        self.key = key
        self._delivery = delivery

    @property
    def delivery(self) -> Delivery | None:
        """Its entry in the duplicate filter (None with ``dedupe=False``)."""
        return self._delivery

    @property
    def body(self) -> bytes:
        return self.frame.body

    @property
    def text(self) -> str:
        return self.frame.body.decode("utf-8")

    @property
    def headers(self) -> dict[str, str]:
        return self.frame.header_map

    @property
    def destination(self) -> str | None:
        return self.frame.get("destination")

    @property
    def message_id(self) -> str | None:
        return self.frame.get("message-id")

    @property
    def idempotency_key(self) -> str | None:
        return self.frame.get(IDEMPOTENCY_HEADER) or self.frame.get("_AMQ_DUPL_ID")

    @property
    def redelivered(self) -> bool:
        return (self.frame.get("redelivered") or "").lower() == "true"

    def process(self, settle: bool = True) -> Processing:
        """``with msg.process():`` / ``async with msg.process():`` around the handling
        of this message: acknowledged when the block ends, rejected (NACK) when it
        raises, in the client ack modes; ``settle=False``: neither (see :class:`Processing`)."""
        return Processing(self, settle)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(destination={self.destination!r}, message_id={self.message_id!r}, "
                f"body={self.body[:40]!r})")


class Processing:
    """The context manager of :meth:`ReceivedMessage.process` (module docstring): it
    gives the message; on exit it calls the message's ``ack()`` (the block ended) or
    ``nack()`` (the block raised, and the exception propagates), only in the client
    ack modes and with ``settle=True``. The asyncio client's messages need
    ``async with`` (their ``ack()`` is a coroutine); the sync client's either form."""

    __slots__ = ("message", "settle")

    def __init__(self, message: ReceivedMessage, settle: bool = True) -> None:
        self.message = message
        self.settle = settle

    def _settlement(self, failed: bool) -> object:
        if not self.settle or self.message.ack_mode == "auto":
            return None
        return getattr(self.message, "nack" if failed else "ack")()

    def __enter__(self) -> ReceivedMessage:
        return self.message

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        result = self._settlement(exc_type is not None)
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if close is not None:
                close()
            raise LocalProtocolError("an asyncio message is settled with `async with msg.process():`, not `with`")

    async def __aenter__(self) -> ReceivedMessage:
        return self.message

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        result = self._settlement(exc_type is not None)
        if inspect.isawaitable(result):
            await result


class Inbound:
    """The duplicate filter and the ACK/NACK rules of one connection (module docstring)."""

    def __init__(self, writer: AckWriter, *, dedupe: bool, audit_size: int) -> None:
        self._writer = writer
        self.dedupe = dedupe
        self.filter = DuplicateFilter(audit_size)

    @property
    def duplicates(self) -> int:
        """Redelivered copies dropped so far."""
        return self.filter.duplicates

    def arrived(self, sub_id: str, ack_mode: str, frame: Frame, generation: int) -> tuple[str, Delivery | None] | None:
        """A MESSAGE for subscription ``sub_id``: its key and filter entry to hand to the
        application, or None for a copy that was dropped."""
        if not self.dedupe:
            return message_key(frame), None
        delivery, owed = self.filter.arrived(sub_id, ack_mode, frame, generation)
        self._ack_copies(owed)
        if delivery is None:
            log.debug("duplicate %s on %s dropped", message_key(frame), sub_id)
            return None
        return delivery.key, delivery

    def forget(self, sub_id: str) -> None:
        """The subscription ended."""
        self.filter.forget(sub_id)

    def _ack_copies(self, copies: list[Delivery]) -> None:
        """ACK dropped copies the broker still waits for, each on its own link (a
        stale link's copy needs nothing: the broker forgot that delivery)."""
        for copy in copies:
            self._writer.write_if_current(self._frame("ACK", copy.frame), copy.generation)

    def _frame(self, command: str, frame: Frame) -> Frame:
        return ack_frame(command, frame, self._writer.version)

    def ack(self, msg: ReceivedMessage, command: str) -> None:
        """``msg.ack()`` (``command="ACK"``) or ``msg.nack()`` in a client ack mode."""
        d = msg._delivery
        if d is not None and d.settled:
            if d.nacked:
                raise LocalProtocolError(
                    f"{command} of message {msg.message_id}: a later nack() on this ack='client' subscription "
                    "already rejected it (a NACK is cumulative in client mode); the broker redelivers it")
            return  # covered by a later cumulative ACK already
        frame = self._frame(command, msg.frame)
        if command == "NACK":
            frames = [frame]
            if d is not None:  # forget before the NACK: the redeliveries must get through
                covered = self.filter.nacked(msg.sub_id, d)
                if msg.ack_mode == "client" and not self._writer.dialect.cumulative_nack:
                    # this broker rejects only the one named: reject each, as a cumulative NACK would
                    frames = [self._frame("NACK", x.frame) for x in covered]
            self._writer.write_many_if_current(frames, msg.generation)
            return  # a dead link's delivery needs no NACK: the broker redelivers it anyway
        sent = self._writer.write_if_current(frame, msg.generation)
        if d is not None:
            self._ack_copies(self.filter.acked(msg.sub_id, d, sent=sent))

    def tx_ack(self, msg: ReceivedMessage, tx_id: str) -> None:
        """ACK ``msg`` inside transaction ``tx_id`` (settled for the filter at commit)."""
        d = msg._delivery
        if d is not None and d.nacked:
            raise LocalProtocolError(f"ACK of message {msg.message_id}: a later cumulative nack() rejected it")
        frame = self._frame("ACK", msg.frame).with_headers(transaction=tx_id)
        if not self._writer.write_if_current(frame, msg.generation):
            self.forget_acks([msg])
            raise TransactionRolledBack(
                f"transaction {tx_id}: message {msg.message_id} came on a link that has failed since; the broker "
                "redelivers it on the new one (receive it again and ack that copy in a new transaction)",
                transaction=tx_id)

    def tx_acked(self, messages: Sequence[ReceivedMessage]) -> None:
        """The transaction that acked ``messages`` committed."""
        for msg in messages:
            if msg._delivery is not None:
                self._ack_copies(self.filter.acked(msg.sub_id, msg._delivery, sent=True))

    def forget_acks(self, messages: Sequence[ReceivedMessage]) -> None:
        """Those transactional ACKs did not happen: the broker redelivers the messages,
        which must reach the application again."""
        for msg in messages:
            if msg._delivery is not None and not msg._delivery.settled:
                self.filter.forget_one(msg.sub_id, msg._delivery)

    def ack_many(self, messages: Iterable[ReceivedMessage]) -> None:
        """``ack()`` for each, in order, with the frames of one link in one write."""
        groups: dict[int, list[ReceivedMessage]] = {}
        for msg in messages:
            if msg.ack_mode != "auto" and not (msg._delivery is not None and msg._delivery.settled):
                groups.setdefault(msg.generation, []).append(msg)
        for generation, batch in groups.items():
            frames = [self._frame("ACK", msg.frame) for msg in batch]
            sent = self._writer.write_many_if_current(frames, generation)
            owed: list[Delivery] = []
            for msg in batch:
                if msg._delivery is not None:
                    owed.extend(self.filter.acked(msg.sub_id, msg._delivery, sent=sent))
            self._ack_copies(owed)
