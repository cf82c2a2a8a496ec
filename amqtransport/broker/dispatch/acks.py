"""ACK, NACK, redelivery and the dead-letter queue.

Theory of operation
-------------------
A message handed to a subscription that is not in auto-ack mode sits in the
subscription's ``unacked`` ordered dict until ACK (client-individual: that message;
client: it and every earlier one), NACK, or the subscription/connection going away --
then it goes back to the *front* of the queue with its delivery count raised, and,
once it has been delivered ``1 + max_redeliveries`` times, to ``/queue/DLQ.X``
instead (a journalled ``Move``). Settling a message gives its subscription credit
back (:meth:`Acks.capacity_changed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from amqtransport.destinations import QUEUE_PREFIX

from ..store.journal import Callback
from .message import Message
from .model import AUTO, CLIENT, Subscription, TxState
from .names import dead_letter_name
from .registry import Registry
from .topics import FanOut
from .wildcards import WildcardQueues

__all__ = ["Acks"]

log = logging.getLogger(__name__)


class Acks:
    """ACK and NACK, the credit they give back, redelivery and the dead-letter queue."""

    def __init__(self, reg: Registry, fanout: FanOut, wildcards: WildcardQueues) -> None:
        self.reg = reg
        self.fanout = fanout
        self.wildcards = wildcards

    def capacity_changed(self, sub: Subscription) -> None:
        """The subscription may take more (ack, nack, connection writable again)."""
        if not sub.active:
            return
        if sub.children is not None:
            self.wildcards.ready(sub)
        elif sub.kind == "queue":
            q = self.reg.queues.get(sub.name)
            if q is not None:
                q.make_ready(sub)
        else:
            self.fanout.drain(sub)

    def count_dequeued(self, sub: Subscription, msgs: Sequence[Message]) -> None:
        queues = self.reg.queues
        if sub.children is not None:  # a wildcard: each message counts for its own queue
            for m in msgs:
                q = queues.get(m.destination)
                if q is not None:
                    q.dequeued += 1
            return
        q = queues.get(sub.name)
        if q is not None:
            q.dequeued += len(msgs)

    def _take(self, sub: Subscription, msg_id: str, cumulative: bool) -> list[Message]:
        """Remove and return the messages an ACK/NACK of ``msg_id`` covers."""
        unacked = sub.unacked
        if msg_id not in unacked:
            return []
        if not cumulative:
            return [unacked.pop(msg_id)]
        out: list[Message] = []
        while unacked:
            mid, m = unacked.popitem(last=False)
            out.append(m)
            if mid == msg_id:
                break
        return out

    def ack(
        self,
        sub: Subscription,
        msg_id: str,
        *,
        tx: TxState | None = None,
        callback: Callback | None = None,
    ) -> bool:
        """ACK; False when the id was not awaiting an ack on this subscription."""

        def settle(msgs: list[Message]) -> None:
            if tx is not None:
                tx.acked.extend((sub, m) for m in msgs)
                self.reg.done(callback)
            else:
                self._consumed(sub, msgs, callback)

        return self._settle(sub, msg_id, callback, settle)

    def _settle(
        self,
        sub: Subscription,
        msg_id: str,
        callback: Callback | None,
        settle: Callable[[list[Message]], None],
    ) -> bool:
        """What ACK and NACK share: nothing to do in auto mode, False for an id not
        awaiting an ack, else ``settle`` the message(s) (``callback`` is its to call)
        and give the subscription its credit back."""
        if sub.ack_mode == AUTO:
            self.reg.done(callback)
            return True
        msgs = self._take(sub, msg_id, cumulative=sub.ack_mode == CLIENT)
        if not msgs:
            self.reg.done(callback)
            return False
        settle(msgs)
        self.capacity_changed(sub)
        return True

    def _consumed(self, sub: Subscription, msgs: Sequence[Message], callback: Callback | None) -> None:
        reg = self.reg
        for m in msgs:
            reg.memory.release(m)
        if sub.kind == "queue":
            self.count_dequeued(sub, msgs)
        ids = [m.id for m in msgs if m.persistent and sub.kind == "queue"]
        if ids:
            reg.store_ack(ids, callback)
        else:
            reg.done(callback)

    def nack(
        self,
        sub: Subscription,
        msg_id: str,
        *,
        tx: TxState | None = None,
        callback: Callback | None = None,
    ) -> bool:
        """NACK: redeliver (or DLQ) now, or at COMMIT inside a transaction."""

        def settle(msgs: list[Message]) -> None:
            if tx is not None:
                tx.nacked.extend((sub, m) for m in msgs)
            else:
                self.return_unacked(sub, msgs, count_failure=True)
            self.reg.done(callback)

        return self._settle(sub, msg_id, callback, settle)

    def return_unacked(self, sub: Subscription, msgs: Sequence[Message], *, count_failure: bool) -> None:
        """Messages a consumer did not take: redeliver (front of the queue) or DLQ."""
        if not msgs:
            return
        if sub.kind != "queue":
            if sub.active:  # a NACK on a live topic subscription: offer it again
                for m in msgs:
                    sub.backlog.appendleft(m)
                self.fanout.drain(sub)
            return
        reg = self.reg
        limit = reg.config.max_redeliveries
        back: list[Message] = []
        for m in msgs:
            if limit >= 0 and m.delivery_count > limit and count_failure and not reg.shutting_down:
                self._dead_letter(m)
            else:
                back.append(m)
        if back:
            if sub.durable_queue is not None and sub.durable_queue not in reg.durable_subs:
                for m in back:
                    reg.memory.release(m)
                reg.store_ack([m.id for m in back if m.persistent])  # its subscription is gone
                return
            if sub.children is not None:  # a wildcard: each message to its own queue
                by_queue: dict[str, list[Message]] = {}
                for m in back:
                    by_queue.setdefault(m.destination, []).append(m)
                for key, ms in by_queue.items():
                    reg.queue(key).requeue(ms)
                return
            reg.queue(sub.name).requeue(back)  # re-created if it was forgotten meanwhile

    def _dead_letter(self, m: Message) -> None:
        reg = self.reg
        src = m.destination
        name = dead_letter_name(src)
        reg.dead_lettered += 1
        reg.memory.release(m)  # charged again to the DLQ by enqueue (or gone)
        if name.startswith(reg.config.dlq_prefix):
            log.warning("message %s exceeded redeliveries in dead-letter queue %s; discarded", m.id, src)
            if m.persistent:
                reg.store_ack([m.id])
            return
        dlq = f"{QUEUE_PREFIX}{reg.config.dlq_prefix}{name}"
        log.info("message %s delivered %d times: moved to %s", m.id, m.delivery_count, dlq)
        self.move_message(m, dlq)

    def move_message(self, m: Message, target: str) -> None:
        """Put message ``m``, which the caller took off its queue (or out of a consumer's
        hands), on queue ``target``: a journalled ``Move`` for a persistent message; it
        keeps (or gains) its ``original-destination`` header and its delivery count
        starts again. Used by dead-lettering and by the operator's move/retry."""
        reg = self.reg
        src = m.destination
        reg.memory.release(m)  # charged again to the target by enqueue
        if m.persistent and reg.store is not None:
            reg.store.move(m.id, target)  # sets m.destination, adds original-destination
        if m.destination != target:  # not in the store (non-persistent)
            if not any(k == "original-destination" for k, _ in m.headers):
                m.headers = (*m.headers, ("original-destination", src))
            m.destination = target
        m.wire_cache = None
        m.delivery_count = 0
        reg.queue(target).enqueue(m)
