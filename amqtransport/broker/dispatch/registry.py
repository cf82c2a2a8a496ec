"""What exists in the broker core: its destinations, subscriptions and counters.

:class:`Registry` holds the queues, topics and subscription lists, the durable
subscriptions' records, the memory gauge and the store, and the small operations on
them that every story of the core shares (create a queue, make a message, ack in the
store, drop an expired message, the stats).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from amqtransport.selector import Selector, SelectorError, compile_selector

from ..config import BrokerConfig
from ..store import MessageStore, Sub
from ..store.journal import Callback
from .errors import CoreError
from .memory import MemoryGauge
from .message import Message
from .model import Subscription, Topic
from .priority import DEFAULT_PRIORITY, parse_priority, priority_of
from .queues import Queue
from .virtual import VIRTUAL_CONSUMER_PREFIX, virtual_subscription

__all__ = ["Registry", "EXPIRY_SWEEP_S"]

log = logging.getLogger(__name__)

EXPIRY_SWEEP_S = 1.0  # while producers are parked: how often expired queued messages are dropped
#: paged in at least, when paged messages outrank a full window's front (priority.py)
OUTRANKING_BATCH = 1000


class Registry:
    """What exists: the queues, topics and subscriptions, the durable-subscription
    records, the counters, the memory gauge and the glue to the store. The stories
    (:class:`~.topics.FanOut`, :class:`~.advisories.Advisories`,
    :class:`~.wildcards.WildcardQueues`, :class:`~.acks.Acks`,
    :class:`~.transactions.Transactions`) each hold the registry and change it."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore | None,
        *,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self.config = config
        self.store = store
        #: wall-clock seconds (message timestamps, expiry); ``monotonic`` goes to the memory
        #: gauge (how long flow control has held, which readiness compares with its own)
        self.clock = clock
        self.queues: dict[str, Queue] = {}
        self.topics: dict[str, Topic] = {}
        self.wildcard_subs: list[Subscription] = []
        self.wildcard_queue_subs: list[Subscription] = []
        self.durable_subs: dict[str, Sub] = {}  # queue key -> record
        self.durable_active: dict[str, Subscription] = {}
        self.durable_selectors: dict[str, Selector] = {}  # queue key -> its record's selector
        self.durable_version = 0  # changes with any durable subscription (topics.py's plans)
        self._ids = itertools.count(1)
        self._prefix = f"ID:{config.name}-{secrets.token_hex(4)}-"
        self.sent = 0
        self.duplicates = 0
        self.dead_lettered = 0
        self.expired = 0
        self.shutting_down = False  # set by the server: no dead-lettering while it closes
        self.prioritized = config.prioritized_messages  # queues deliver by priority (priority.py)
        self.memory = MemoryGauge(config.memory_limit, config.destination_memory_limit, config.memory_low_water,
                                  clock=monotonic)
        if store is not None:
            store.on_space = self.memory.wake_waiters  # store flow control parks in the same list
        #: called with each queue created while wildcard queue consumers exist (they attach to it)
        self.queue_created: Callable[[Queue], None] | None = None
        self._sweeping = False  # an expiry sweep timer is scheduled

    # ------------------------------------------------------------------ startup
    def load_from_store(self) -> int:
        """Create destinations for every live message and durable subscription. The
        messages stay paged (recovery pages them) until consumers need them."""
        if self.store is None:
            return 0
        for sub in self.store.subs.values():
            self.register_durable(sub)
        for dest in list(self.store.paged):
            q = self.queue(dest)
            q.enqueued += self.store.paged_count(dest)
        return self.store.count

    # ------------------------------------------------------------------ paging (QueueOwner)
    def page_out(self, queue: Queue, msg: Message) -> bool:
        """Page ``msg`` when its queue already has paged messages (it must queue behind
        them, whatever it is -- unless it outranks every paged one and the queue has room
        in memory), or when it is persistent and the queue holds ``page_window`` messages
        in memory or memory is past its low-water mark (globally or for this destination):
        then it waits on disk, and persistent producers never wait for memory. See
        queues.py and priority.py."""
        store = self.store
        if store is None:
            return False
        room = len(queue.messages) < self.config.page_window and not self.memory.paging(queue.name)
        if store.paged_count(queue.name):
            if queue.prioritized and room and priority_of(msg) > store.paged_top(queue.name):
                return False  # it outranks every paged message: it waits in memory, ahead of them
        else:
            if not msg.persistent:
                return False
            if queue.ready and not queue.messages:
                return False  # a consumer takes it now: no round trip through the disk
            if room and not self.offline_durable(queue):
                return False
        if not store.page_out(msg):
            return False
        if msg.persistent:
            self.memory.release(msg)
        else:
            self.memory.charge(msg)  # it waits in memory, in its place among the paged ones
        return True

    def offline_durable(self, queue: Queue) -> bool:
        """True for the queue of a durable subscription nobody is subscribed to: its
        persistent messages wait on disk from the first (:meth:`page_out`), so an offline
        subscription holds no message in memory and, for a topic message, costs its
        publisher no copy (store/fanout.py) until its subscriber is back."""
        return not queue.consumers and queue.name in self.durable_subs

    def pages_at_once(self, names: Sequence[str], msg: Message) -> set[str]:
        """Those of queues ``names`` where a persistent copy of ``msg`` would be paged at
        once by :meth:`page_out`: the queue already has paged messages (and ``msg`` does
        not outrank them) or is an offline durable subscription's (:meth:`offline_durable`).
        A topic's fan-out then stores it as a position only (:meth:`paged_arrivals`;
        store/fanout.py)."""
        store = self.store
        out: set[str] = set()
        if store is None:
            return out
        paged, queues, durable = store.paged, self.queues, self.durable_subs
        prio = -1
        for name in names:
            queue = queues.get(name)
            pl = paged.get(name)
            if queue is None:
                continue
            if not pl:
                if queue.consumers or name not in durable:
                    continue
            elif queue.prioritized:
                if prio < 0:
                    prio = priority_of(msg)
                if prio > pl.top_priority() and len(queue.messages) < self.config.page_window \
                        and not self.memory.paging(name):
                    continue  # it outranks every paged message: it waits in memory (page_out)
            out.add(name)
        return out

    def paged_arrivals(self, names: Iterable[str], msg: Message) -> None:
        """A copy of ``msg`` arrived on each of queues ``names`` straight into its paged list
        (the store put it there; :meth:`pages_at_once` chose them, so it does not outrank
        their paged messages): what :meth:`Queue.enqueue` and :meth:`page_out` do for a
        paged message, without the message."""
        queues = self.queues
        for name in names:  # (each list knows its paged priorities: pages.py)
            queue = queues[name]
            queue.enqueued += 1
            if queue.ready and not queue.messages:
                queue.dispatch()

    def page_in(self, queue: Queue) -> list[Message]:
        """The next paged messages of ``queue`` (a prioritized queue's: highest priority
        first, FIFO within one): up to a window -- at least :data:`OUTRANKING_BATCH` when
        the window is full of messages that paged ones outrank -- or, while memory is past
        its low-water mark, only as many as its ready consumers can take now (so paged
        messages come back into memory only to be delivered)."""
        if self.store is None or not self.store.paged_count(queue.name):
            return []
        window = self.config.page_window
        n = window - len(queue.messages)
        if self.memory.paging(queue.name):
            n = min(n, len(queue.ready))
        elif queue.prioritized:
            n = max(n, min(window, OUTRANKING_BATCH))
        msgs = self.store.take(queue.name, max(1, n), by_priority=queue.prioritized)
        for m in msgs:
            self.memory.charge(m)
        return msgs

    def paged(self, queue: Queue) -> int:
        return self.store.paged_count(queue.name) if self.store is not None else 0

    def paged_top(self, queue: Queue) -> int:
        """The highest priority among ``queue``'s paged messages, -1 when none is paged."""
        return self.store.paged_top(queue.name) if self.store is not None else -1

    def scan_top(self, queue: Queue) -> int:
        """``paged_top`` of what the scan of ``queue``'s paged messages has not passed (scan.py)."""
        return self.store.scan_top(queue.name) if self.store is not None else -1

    def rescan(self, queue: Queue) -> None:
        if self.store is not None:
            self.store.rescan(queue.name)

    def scanner(self) -> MessageStore | None:
        return self.store

    def register_durable(self, sub: Sub) -> None:
        self.durable_version += 1
        self.durable_subs[sub.queue] = sub
        if sub.selector:
            try:
                self.durable_selectors[sub.queue] = compile_selector(sub.selector)
            except SelectorError as exc:  # checked when subscribed: only a foreign record can fail
                log.error("durable subscription %s: %s; it receives nothing", sub.queue, exc)
                self.durable_selectors[sub.queue] = compile_selector("FALSE")
        else:
            self.durable_selectors.pop(sub.queue, None)
        self.topic(sub.topic).durable[sub.queue] = sub.topic
        self.queue(sub.queue)

    # ------------------------------------------------------------------ lookup
    def queue(self, key: str) -> Queue:
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = Queue(self, key)
            if key.startswith(VIRTUAL_CONSUMER_PREFIX) and key not in self.durable_subs:
                self._virtual_queue_created(key)
            if self.wildcard_queue_subs and self.queue_created is not None:
                self.queue_created(q)
        return q

    def _virtual_queue_created(self, key: str) -> None:
        """A virtual topic's consumer queue came to be: from now on it receives the
        topic's messages, across restarts (virtual.py)."""
        record = virtual_subscription(key)
        if record is None:
            return
        if self.store is not None:
            self.store.add_subscription(record)
        self.register_durable(record)

    def forget_idle(self, keys: Sequence[str]) -> None:
        for key in keys:
            q = self.queues.get(key)
            if q is not None and not q.consumers and not q.depth:
                del self.queues[key]

    def topic(self, key: str) -> Topic:
        t = self.topics.get(key)
        if t is None:
            t = self.topics[key] = Topic(key)
        return t

    def new_id(self) -> str:
        return f"{self._prefix}{next(self._ids)}"

    def make_message(
        self,
        destination: str,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        persistent: bool,
        key: str,
    ) -> Message:
        expires = 0.0
        priority = -1
        timed = False
        for k, v in headers:  # the first of a repeated header counts (STOMP 1.2)
            if k == "priority" and priority < 0:
                priority = parse_priority(v)
            elif k == "expires" and not timed:
                timed = True
                try:
                    ms = int(v)
                except ValueError:
                    raise CoreError(f"expires header must be milliseconds since the epoch, got {v!r}") from None
                expires = ms / 1000.0 if ms > 0 else 0.0
        return Message(
            id=self.new_id(),
            destination=destination,
            headers=headers,
            body=body,
            key=key,
            timestamp=self.clock(),
            persistent=persistent and self.store is not None,
            expires=expires,
            priority=priority if priority >= 0 else DEFAULT_PRIORITY,
        )

    # ------------------------------------------------------------------ store glue
    def store_ack(self, ids: Sequence[str], callback: Callback | None = None) -> None:
        if self.store is not None:
            self.store.ack(ids, callback)
        elif callback is not None:
            callback(None)

    def done(self, callback: Callback | None) -> None:
        """Run ``callback`` once everything written so far is durable (at once without a store).

        It goes through the journal's completion path, so on a replicated master it also
        waits for the slave's ack of every record so far and for the stall check (see
        :mod:`..ha.replication`): every RECEIPT that has no record of its own takes this path."""
        if callback is None:
            return
        if self.store is not None:
            self.store.journal.on_durable(callback)
        else:
            callback(None)

    def drop_expired(self, msg: Message) -> None:
        self.expired += 1
        q = self.queues.get(msg.destination)
        if q is not None:
            q.expired += 1
        self.memory.release(msg)
        if msg.persistent:
            self.store_ack([msg.id])

    def sweep_expired(self) -> int:
        """Drop expired messages still waiting in queues (run while flow control holds
        producers: a queue nobody consumes would otherwise keep them, and the memory)."""
        now = self.clock()
        dropped = 0
        for q in list(self.queues.values()):
            for attr in ("messages", "unmatched"):  # and those set aside by selective dispatch
                msgs: deque[Message] = getattr(q, attr)
                if not any(m.expires and m.expires <= now for m in msgs):
                    continue
                keep: deque[Message] = deque()
                for m in msgs:
                    if m.expires and m.expires <= now:
                        self.drop_expired(m)
                        dropped += 1
                    else:
                        keep.append(m)
                setattr(q, attr, keep)
        return dropped

    def start_expiry_sweep(self, call_later: Callable[[float, Callable[[], None]], object]) -> None:
        """Producers are parked (flow control): every :data:`EXPIRY_SWEEP_S` seconds, until
        none is, drop the expired messages nobody consumes, so that their memory is freed.
        ``call_later`` is the event loop's; a sweep already running is left alone."""
        if self._sweeping:
            return
        self._sweeping = True

        def sweep() -> None:
            if not self.memory.blocked_count():
                self._sweeping = False
                return
            try:
                n = self.sweep_expired()
                if n:
                    log.info("dropped %d expired messages while producers were flow-controlled", n)
            except Exception:  # noqa: BLE001 - the timer must keep running
                log.exception("expiry sweep failed")
            call_later(EXPIRY_SWEEP_S, sweep)

        call_later(EXPIRY_SWEEP_S, sweep)

    # ------------------------------------------------------------------ stats
    def _backlog_stats(self) -> dict[str, int]:
        subs = [*self.wildcard_subs, *(s for t in self.topics.values() for s in t.subs)]
        return {
            "messages": sum(len(s.backlog) for s in subs),
            "bytes": sum(s.backlog.bytes for s in subs),
            "dropped": sum(s.backlog.dropped for s in subs),
        }

    def stats(self) -> dict[str, object]:
        return {
            "queues": {
                k: {
                    "depth": q.depth,
                    "paged": self.paged(q),
                    "consumers": len(q.consumers),
                    "enqueued": q.enqueued,
                    "dequeued": q.dequeued,
                    "memory": self.memory.by_destination.get(k, 0),
                }
                for k, q in self.queues.items()
            },
            "topics": {k: len(t.subs) for k, t in self.topics.items()},
            "topic_backlog": self._backlog_stats(),
            "sent": self.sent,
            "duplicates": self.duplicates,
            "dead_lettered": self.dead_lettered,
            "expired": self.expired,
            "memory": self.memory.stats(),
        }
