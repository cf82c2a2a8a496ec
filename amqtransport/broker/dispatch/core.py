"""Destinations and dispatch: queues, topics, subscriptions, acks, redelivery, DLQ.

Theory of operation
-------------------
The core is the broker minus I/O: it is driven by the protocol handler (one call per
client frame), persists through the :class:`~.store.MessageStore`, and hands
messages to subscriptions through the small :class:`~.model.Sink` interface that a
connection implements (``writable`` + ``deliver``). Everything runs on the event
loop thread; nothing here blocks.

:class:`BrokerCore` is the :class:`~.registry.Registry` (what exists) wired to the
stories that change it, one module each: :mod:`.queues` (a queue's dispatch),
:mod:`.topics` (fan-out, durable subscriptions), :mod:`.wildcards` (wildcard queue
consumers), :mod:`.acks` (ACK/NACK, redelivery, DLQ), :mod:`.transactions` and
:mod:`.advisories`; the names are :mod:`.names`, the data types :mod:`.model`.
SEND, SUBSCRIBE and UNSUBSCRIBE are here, and the loop timer of scheduled delivery
(:mod:`.scheduling` decides; :meth:`BrokerCore.fire_due` writes and routes).

Persistence is concurrent with dispatch: a persistent message is handed to a consumer
as soon as its record is queued for the journal (its ack record always follows it in
the journal, so recovery never resurrects it); the *producer's* receipt waits for
durability. Advisory messages (``/topic/ActiveMQ.Advisory.Consumer.Queue.X``, header
``consumerCount``) are published whenever a queue gains or loses a consumer, and a new
advisory subscriber is told the current counts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from amqtransport.destinations import QUEUE, TEMP_TOPIC_PREFIX, advisory_name, wildcard_segments
from amqtransport.selector import Selector

from ..config import BrokerConfig
from ..store import Ack, Enq, MessageStore, RecordError, Sub
from ..store.journal import Callback
from .acks import Acks
from .advisories import Advisories
from .errors import CoreError
from .message import Message
from .model import ACK_MODES, AUTO, Sink, Subscription, TxSend
from .names import DURABLE_PREFIX, check_send_destination, send_targets, split_destination
from .queues import Queue
from .registry import Registry
from .scheduling import (
    JOB_PREFIX,
    SCHEDULE_HEADERS,
    Scheduler,
    after_fire,
    delivered_headers,
    job_headers,
    job_state,
)
from .selection import settle
from .temporary import TempDestinations
from .topics import FanOut
from .transactions import Transactions
from .wildcards import WildcardQueues

__all__ = ["BrokerCore"]

log = logging.getLogger(__name__)

_QUEUE_ADVISORIES = advisory_name(QUEUE, "")  # ActiveMQ.Advisory.Consumer.Queue.


def _scheduled(headers: tuple[tuple[str, str], ...]) -> bool:
    return any(k in SCHEDULE_HEADERS for k, _v in headers)


class BrokerCore(Registry):
    """The registry and its stories, wired together: what the protocol handler calls.

    SEND, SUBSCRIBE and UNSUBSCRIBE are here; ACK/NACK go through :attr:`acks`,
    BEGIN/COMMIT/ABORT through :attr:`transactions`."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore | None,
        *,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        super().__init__(config, store, clock=clock, monotonic=monotonic)
        self.fanout = FanOut(self)
        self.advisories = Advisories(self, self.fanout)
        self.wildcards = WildcardQueues(self, self.advisories)
        self.queue_created = self.wildcards.queue_created
        self.acks = Acks(self, self.fanout, self.wildcards)
        self.transactions = Transactions(self, self.fanout, self.acks)
        self.scheduler = Scheduler()
        self.temporaries = TempDestinations()  # temporary.py: who owns each temporary destination
        self.transactions.on_job = self._job_added
        self._call_later: Callable[[float, Callable[[], None]], object] | None = None
        self._armed: float | None = None  # when the loop timer fires next (None: not armed)

    # ------------------------------------------------------------------ scheduled delivery
    def load_from_store(self) -> int:
        """As :meth:`Registry.load_from_store`, and the scheduled jobs back to the scheduler."""
        store = self.store
        if store is not None:
            for dest in [d for d in store.paged if d.startswith(JOB_PREFIX)]:
                for job in store.take(dest, store.paged_count(dest)):
                    self.scheduler.add(job, job_state(job).due)
        return super().load_from_store()

    def start_scheduler(self, call_later: Callable[[float, Callable[[], None]], object]) -> None:
        """Fire jobs when due, on the event loop's timer ``call_later``."""
        self._call_later = call_later
        self._arm()

    def _job_added(self, job: Message, due: float) -> None:
        self.scheduler.add(job, due)
        self._arm()

    def _arm(self) -> None:
        due = self.scheduler.next_due()
        if due is None or self._call_later is None or (self._armed is not None and self._armed <= due):
            return
        self._armed = due
        self._call_later(max(0.0, due - self.clock()), self._tick)

    def _tick(self) -> None:
        self._armed = None
        try:
            self.fire_due()
        finally:
            self._arm()

    def fire_due(self) -> int:
        """Fire every job that is due: each in one atomic journal record (scheduling.py)."""
        if self.shutting_down:
            return 0
        now = self.clock()
        jobs = self.scheduler.pop_due(now)
        for i, job in enumerate(jobs):
            try:
                self._fire(job, now)
            except Exception:
                log.exception("scheduled job %s could not fire; it is retried in 1 s", job.id)
                for rest in jobs[i:]:
                    self.scheduler.add(rest, now + 1.0)
                break
        return len(jobs)

    def _fire(self, job: Message, now: float) -> None:
        state = job_state(job)
        firing = after_fire(state, job.headers, now)
        sends = []
        if firing.deliver:
            persistent = next((v.lower() == "true" for k, v in job.headers if k == "persistent"), False)
            headers = delivered_headers(job.headers, state.job, int(now * 1000), int(job.timestamp * 1000))
            sends.append(TxSend(state.destination, headers, job.body, persistent, "", 0))
        plan = self.transactions.plan(sends, job.origin)
        for _kind, _name, msg, _copies in plan.routed:
            # the firing's own id, not a fresh one: if this firing's record is lost (a
            # crash, a full disk) after the message went out, the recovered job fires
            # again with the same id, and the client's filter (key@message-id for a
            # scheduled delivery) drops the copy; each repeat has its own due time
            msg.id = f"{state.job}@{round(state.due * 1000)}"
        for due, left, headers in firing.successors:
            nxt = Message(
                id=self.new_id(), destination=job.destination,
                headers=job_headers(headers, due=due, left=left, job=state.job), body=job.body,
                timestamp=job.timestamp, persistent=job.persistent, origin=job.origin,
            )
            if nxt.persistent:
                plan.records.append(Enq(nxt))
            plan.jobs.append((nxt, due))
        if job.persistent:
            plan.records.append(Ack((job.id,)))
        if self.store is not None:
            self.store.commit(plan.records)
        self.sent += len(plan.routed)
        self.transactions.route(plan)

    def capacity_changed(self, sub: Subscription) -> None:
        """The subscription may take more (its connection is writable again)."""
        self.acks.capacity_changed(sub)

    # ------------------------------------------------------------------ sending
    def send(
        self,
        destination: str,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        *,
        persistent: bool,
        key: str = "",
        callback: Callback | None = None,
        origin: str = "",
    ) -> bool:
        """Accept a SEND. Returns False for a suppressed duplicate.

        ``callback`` runs when the message (or, for a duplicate, the original) is
        durable; for a non-persistent message, once everything written before is
        (:meth:`~.registry.Registry.done`: on the journal's order, through its gate).
        """
        if "," in destination or (self.config.scheduler_support and _scheduled(headers)):
            # a composite (each part gets a copy, all durable before the receipt) or a job
            targets = send_targets(destination, headers)
            sends = [TxSend(d, h, body, persistent, key, 0) for d, h in targets]
            return self.transactions.send_batch(sends, origin, callback) > 0
        kind, name = check_send_destination(destination)
        if key and self.store is not None and self.store.is_duplicate(destination, key, callback):
            self.duplicates += 1
            return False
        msg = self.make_message(destination, headers, body, persistent, key)
        msg.origin = origin  # the sending connection's session (activemq.noLocal)
        try:
            if kind == "queue":
                if msg.persistent:
                    assert self.store is not None
                    self.store.add(msg, callback)
                else:
                    if key and self.store is not None:
                        self.store.remember_key(destination, key)
                    self.done(callback)  # no record: once what came before is durable
                self.queue(destination).enqueue(msg)
            else:
                self.fanout.publish(name, msg, callback)
        except RecordError as exc:  # nothing was written or routed
            raise CoreError(f"message refused: {exc}") from None
        self.sent += 1
        return True

    # ------------------------------------------------------------------ subscriptions
    def subscribe(
        self,
        conn: Sink,
        sub_id: str,
        destination: str,
        *,
        ack_mode: str = AUTO,
        prefetch: int | None = None,
        durable_name: str | None = None,
        client_id: str | None = None,
        selector: Selector | None = None,
        no_local: str = "",
        owner: str = "",
        exclusive: bool = False,
        consumer_priority: int = 0,
    ) -> Subscription:
        """``selector``: only messages it matches (selection.py); for a durable
        subscription it is kept in its record. ``no_local``: the subscriber's session id
        when it asked for ``activemq.noLocal`` (its connection's messages are not for it).
        ``owner``: the subscriber's login; a durable subscription belongs to the login that
        made it, and another login may not resume or replace it."""
        if ack_mode not in ACK_MODES:
            raise CoreError(f"ack mode {ack_mode!r} is not one of {', '.join(ACK_MODES)}")
        kind, name = split_destination(destination)
        sub = Subscription(conn, sub_id, destination, ack_mode, prefetch or self.config.default_prefetch)
        sub.selector = selector
        sub.no_local = no_local
        sub.exclusive, sub.consumer_priority = exclusive, consumer_priority  # consumers.py
        if kind == "queue":
            sub.name = destination
            qpattern = wildcard_segments(name)
            if qpattern is not None:
                self.wildcards.add(sub, qpattern)
                return sub
            q = self.queue(destination)
            q.add_consumer(sub)
            self.advisories.advise(destination, len(q.consumers))
            return sub
        if durable_name:
            if destination.startswith(TEMP_TOPIC_PREFIX):
                raise CoreError(f"a durable subscription cannot be made to a temporary topic ({destination})")
            if not client_id:
                raise CoreError("a durable subscription needs a client-id header on CONNECT")
            qkey = f"{DURABLE_PREFIX}{client_id}:{durable_name}"
            if qkey in self.durable_active:
                raise CoreError(f"durable subscription {durable_name!r} of client {client_id!r} is already active")
            record = Sub(qkey, name, client_id, durable_name, selector.text if selector is not None else "", owner)
            sub.selector = None  # applied to the copies its queue receives (FanOut.durable_copies)
            existing = self.durable_subs.get(qkey)
            self._check_owner(existing, owner)
            if existing is not None and (existing.topic != name or existing.selector != record.selector):
                self._destroy_durable(qkey)  # another topic or selector: start over, as ActiveMQ does
                existing = None
            if existing is None:
                if self.store is not None:
                    self.store.add_subscription(record)
                self.register_durable(record)
            sub.durable_queue = qkey
            sub.name = qkey
            sub.kind = "queue"
            self.durable_active[qkey] = sub
            self.queue(qkey).add_consumer(sub)
            return sub
        sub.name = name
        pattern = wildcard_segments(name)
        if pattern is not None:
            sub.pattern = pattern
            self.wildcard_subs.append(sub)
        else:
            self.topic(name).subs.append(sub)
        if name.startswith(_QUEUE_ADVISORIES) or (pattern is not None and "ActiveMQ" in name):
            self.advisories.advise_current(sub)
        return sub

    def unsubscribe(self, sub: Subscription, *, destroy_durable: bool = False) -> None:
        """Detach a subscription; its unacked messages are redelivered to others."""
        if not sub.active:
            return
        sub.active = False
        if sub.kind == "queue" and sub.children is not None:
            keys = list(sub.children)
            self.wildcards.detach_all(sub)
            self.acks.return_unacked(sub, list(sub.unacked.values()), count_failure=True)
            sub.unacked.clear()
            self.forget_idle(keys)
        elif sub.kind == "queue":
            q = self.queues.get(sub.name)
            if q is not None:
                q.remove_consumer(sub)
            if sub.durable_queue is not None:
                self.durable_active.pop(sub.durable_queue, None)
            self.acks.return_unacked(sub, list(sub.unacked.values()), count_failure=True)
            sub.unacked.clear()
            if sub.durable_queue is not None and destroy_durable:
                self._destroy_durable(sub.durable_queue)
            elif q is not None and sub.durable_queue is None:
                self.advisories.advise(sub.name, len(q.consumers))
                if not q.consumers and not q.depth:
                    del self.queues[sub.name]  # nothing to keep: unique names must not leak
        else:
            if sub.pattern is not None:
                if sub in self.wildcard_subs:
                    self.wildcard_subs.remove(sub)
            else:
                t = self.topics.get(sub.name)
                if t is not None and sub in t.subs:
                    t.subs.remove(sub)
                    if not t.subs and not t.durable:
                        del self.topics[sub.name]
            sub.unacked.clear()
            sub.backlog.clear()

    @staticmethod
    def _check_owner(record: Sub | None, owner: str) -> None:
        """A durable subscription is its maker's: another login gets a CoreError."""
        if record is not None and record.owner and record.owner != owner:
            raise CoreError(f"durable subscription {record.name!r} of client {record.client_id!r} belongs to "
                            f"another user ({record.owner!r})")

    def destroy_durable(self, client_id: str, name: str, owner: str = "") -> bool:
        qkey = f"{DURABLE_PREFIX}{client_id}:{name}"
        if qkey not in self.durable_subs:
            return False
        self._check_owner(self.durable_subs[qkey], owner)
        active = self.durable_active.get(qkey)
        if active is not None:
            self.unsubscribe(active, destroy_durable=True)
        else:
            self._destroy_durable(qkey)
        return True

    def _destroy_durable(self, qkey: str) -> None:
        record = self.durable_subs.pop(qkey, None)
        if record is None:
            return
        self.durable_version += 1
        self.durable_selectors.pop(qkey, None)
        t = self.topics.get(record.topic)
        if t is not None:
            t.durable.pop(qkey, None)
        q = self.queues.pop(qkey, None)
        if q is not None:
            self._discard(q)
        if self.store is not None:
            self.store.remove_subscription(qkey)

    def _discard(self, q: Queue) -> None:
        """Drop every message of queue ``q``, which is no longer in the registry."""
        settle(q)
        msgs = list(q.messages)
        while True:  # and what is paged, a window at a time
            self.memory.release_all(msgs)
            ids = [m.id for m in msgs if m.persistent]
            if ids:
                self.store_ack(ids)
            msgs = self.page_in(q)
            if not msgs:
                break

    def drop_temporaries(self, keys: list[str]) -> None:
        """The connection that owned these temporary destinations is gone: so are they,
        with their messages (temporary.py). Its subscriptions are gone already."""
        self.temporaries.release(keys)
        for key in keys:
            q = self.queues.pop(key, None)
            if q is not None:
                for sub in list(q.consumers):
                    self.unsubscribe(sub)
                self._discard(q)
            self.topics.pop(key, None)
