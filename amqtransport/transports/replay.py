"""What the failover transport writes on a new link, and its ``trackMessages`` cache.

Pure bookkeeping: no sockets, threads or clocks here. The failover transport holds its
lock around every call and does the I/O itself (a sans-IO driver can call the same
functions).

Theory of operation
-------------------
*The replay plan* (:func:`plan_replay`). After a reconnect the new link gets, in
order: a SUBSCRIBE for every live subscription (same ids and headers), every request
still waiting for its receipt (in the order it was first sent, same receipt id, same
idempotency key), then the cached fire-and-forget sends (``trackMessages``). Some
requests are settled instead of replayed:

- a transaction the broker had acknowledged on a dead link is gone with that link: its
  requests fail with :class:`TransactionRolledBack` (with the keys of its sends);
- a COMMIT written on a dead link whose receipt never came is *in doubt*: the broker
  may have committed it. Every request of that transaction fails with
  :class:`TransactionInDoubt`, which offers the keys so the caller can send them again;
- an UNSUBSCRIBE of a subscription that died with the link is answered locally (the
  broker forgot the subscription with the link), unless it deletes a durable
  subscription (``durable_unsubscribe``): that is broker state and is replayed;
- a SUBSCRIBE then UNSUBSCRIBE issued while disconnected cancel out.

*Stepwise replay.* When the previous link ended right after an ERROR that named no
request (no ``receipt-id``), the broker refused *something* we wrote and we cannot
tell what. Writing everything again would be refused again, forever (a SEND the broker
cannot store, a frame over its size limit). So the plan then writes the live
subscriptions at once but lists the pending requests as ``stepwise``: the transport
writes them one at a time and waits for each outcome. A request whose link dies with
an unmatched ERROR while it is the only one outstanding is the one the broker refuses:
it fails with that :class:`BrokerError` and is never replayed again. The cached sends
(``tail``) go out after the last stepwise request.

*The send cache* (:class:`SendCache`). Fire-and-forget sends (``receipt=False``) are
kept by idempotency key, bounded by ``maxCacheSize`` bytes, and replayed on a new link.
A broker processes a connection's frames in order, so a RECEIPT for a frame proves
that every frame written before it on that link was processed: each receipt trims the
cache. Positions come from one counter (the failover core's ``_write_positions``): a
receipted write takes its position *before* it is written (its ``receipt_position``: what
a RECEIPT for it proves), a cached send *after* its write returned (its
``written_position``); a receipt for ``receipt_position`` on link ``g`` then proves
exactly the entries of link ``g`` with ``written_position < receipt_position``, however
threads interleave their writes (the writer keeps call order). To keep the cache small
without any receipted traffic the transport asks for a receipt on one tracked send every
:data:`TRACK_RECEIPT_EVERY` sends, and writes a barrier (a BEGIN and a receipted ABORT of
an empty transaction) when tracked sends stop for a while.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from amqtransport.errors import BrokerError, TransactionInDoubt, TransactionRolledBack
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.stomp.session import error_from_frame, error_text
from amqtransport.transports.base import Receipt, with_receipt

__all__ = [
    "TRACK_RECEIPT_EVERY",
    "TRACK_IDLE_SECONDS",
    "Transactions",
    "TxState",
    "ReplayPlan",
    "plan_replay",
    "SendCache",
    "Tracking",
    "refusal_error",
    "deletes_durable",
]

log = logging.getLogger("amqtransport.transports.failover")

#: a tracked fire-and-forget send asks for a receipt every this many sends
TRACK_RECEIPT_EVERY = 64
#: ... and a barrier is written this long after the last tracked send
TRACK_IDLE_SECONDS = 1.0


@dataclass
class TxState:
    """A transaction as the transport sees it."""

    #: link generation on which the broker first acknowledged it (BEGIN's receipt)
    acked_gen: int | None = None
    rolled_back: bool = False
    #: idempotency keys of its sends, in order
    keys: list[str] = field(default_factory=list)


class Transactions:
    """The open transactions of one failover connection and whether the broker still
    has each: one it acknowledged on a link that has died since was rolled back by the
    broker with that link (*stale*)."""

    def __init__(self) -> None:
        self.open: dict[str, TxState] = {}

    def begin(self, tx_id: str) -> None:
        self.open[tx_id] = TxState()

    def request(self, rec: Receipt) -> None:
        """A request of transaction ``rec.tx`` is made: raises ``TransactionRolledBack``
        if a failover rolled it back; notes a SEND's key."""
        tx = self.open.get(rec.tx or "")
        if tx is not None and tx.rolled_back:
            raise TransactionRolledBack(f"transaction {rec.tx} was rolled back by a failover",
                                        transaction=rec.tx, keys=tx.keys)
        if tx is not None and rec.frame.command == "SEND":
            tx.keys.append(rec.frame.get(IDEMPOTENCY_HEADER) or "")

    def acked(self, tx_id: str, generation: int) -> None:
        """A request of ``tx_id`` was receipted on link ``generation``."""
        tx = self.open.get(tx_id)
        if tx is not None and tx.acked_gen is None:
            tx.acked_gen = generation

    def rolled_back(self, tx_ids: Iterable[str]) -> None:
        """A new link's replay found these gone with the previous link."""
        for tx_id in tx_ids:
            if (tx := self.open.get(tx_id)) is not None:
                tx.rolled_back = True

    @staticmethod
    def _stale(tx: TxState | None, generation: int) -> bool:
        return tx is not None and (tx.rolled_back or (tx.acked_gen is not None and tx.acked_gen != generation))

    def commit(self, tx_id: str, generation: int) -> None:
        """Raise ``TransactionRolledBack`` when the broker lost the transaction."""
        tx = self.open.get(tx_id)
        if tx is not None and self._stale(tx, generation):
            self.open.pop(tx_id, None)
            raise TransactionRolledBack(
                f"transaction {tx_id} was open across a failover: the broker rolled it back",
                transaction=tx_id, keys=tx.keys)

    def done(self, tx_id: str) -> None:
        self.open.pop(tx_id, None)

    def abort(self, tx_id: str, generation: int) -> bool:
        """Forget ``tx_id``; True when the broker still has it (write the ABORT)."""
        return not self._stale(self.open.pop(tx_id, None), generation)


@dataclass
class ReplayPlan:
    #: written at once, in this order, before anything else
    batch: list[Frame] = field(default_factory=list)
    #: requests of ``batch`` (their generation becomes the new link's)
    batch_requests: list[Receipt] = field(default_factory=list)
    #: then written one at a time, each awaiting its outcome (stepwise replay)
    stepwise: list[Receipt] = field(default_factory=list)
    #: cached sends written after the stepwise requests
    tail: list[Frame] = field(default_factory=list)
    #: requests settled with an error instead of replayed
    fail: list[tuple[Receipt, BaseException]] = field(default_factory=list)
    #: requests answered locally with a synthetic receipt
    complete: list[Receipt] = field(default_factory=list)
    #: transactions now known to be gone
    rolled_back: set[str] = field(default_factory=set)


def deletes_durable(frame: Frame) -> bool:
    """Does this UNSUBSCRIBE delete a durable subscription (broker state that outlives
    the link, so it is replayed)? Each broker's header: ActiveMQ's
    ``activemq.subscriptionName``, Artemis' ``durable-subscription-name``, RabbitMQ's
    ``durable:true``."""
    return (frame.command == "UNSUBSCRIBE"
            and (frame.get("durable") == "true" or "activemq.subscriptionName" in frame
                 or "durable-subscription-name" in frame))


def plan_replay(
    *,
    subs: Mapping[str, Frame],
    pending: Iterable[Receipt],
    txs: Mapping[str, TxState],
    cache_frames: Sequence[Frame],
    gen: int,
    stepwise: bool = False,
    durable_unsubscribe: Callable[[Frame], bool] = deletes_durable,
) -> ReplayPlan:
    """The replay for link ``gen`` (see the module docstring)."""
    plan = ReplayPlan()
    pending = list(pending)
    for tx_id, tx in txs.items():
        if tx.rolled_back or (tx.acked_gen is not None and tx.acked_gen < gen):
            plan.rolled_back.add(tx_id)
    in_doubt = {rec.tx for rec in pending
                if rec.frame.command == "COMMIT" and rec.tx is not None and 0 < rec.generation < gen}
    plan.rolled_back |= {tx_id for tx_id in in_doubt if tx_id is not None}
    live: list[Receipt] = []
    pending_sub: dict[str | None, Receipt] = {}
    for rec in pending:
        if rec.tx is not None and (rec.tx in in_doubt or rec.tx in plan.rolled_back):
            keys = txs[rec.tx].keys if rec.tx in txs else []
            if rec.tx in in_doubt:
                err: BaseException = TransactionInDoubt(
                    f"link lost while committing transaction {rec.tx}: the broker may or may not have "
                    f"committed it; send its {len(keys)} message(s) again with the same idempotency keys "
                    "(exception.keys)", transaction=rec.tx, keys=keys)
            else:
                err = TransactionRolledBack(
                    f"transaction {rec.tx} was open across a failover: rolled back by the broker",
                    transaction=rec.tx, keys=keys)
            plan.fail.append((rec, err))
            continue
        command = rec.frame.command
        if command == "SUBSCRIBE":
            pending_sub[rec.frame.get("id")] = rec
            continue
        if command == "UNSUBSCRIBE" and not durable_unsubscribe(rec.frame):
            plan.complete.append(rec)
            continue
        live.append(rec)
    for sub_id, sub_frame in subs.items():
        sub_rec = pending_sub.pop(sub_id, None)
        if sub_rec is None:
            plan.batch.append(sub_frame)
        elif stepwise:
            plan.stepwise.append(sub_rec)
        else:
            plan.batch.append(sub_rec.frame)
            plan.batch_requests.append(sub_rec)
    plan.complete.extend(pending_sub.values())  # subscribed and unsubscribed while down
    if stepwise:
        plan.stepwise.extend(live)
    else:
        for rec in live:
            plan.batch.append(rec.frame)
            plan.batch_requests.append(rec)
    if plan.stepwise:
        plan.tail.extend(cache_frames)
    else:
        plan.batch.extend(cache_frames)
    return plan


def refusal_error(frame: Frame, what: str) -> BrokerError:
    """The error for a request the broker refused with an ERROR that named no request."""
    err = error_from_frame(frame)
    return type(err)(f"{err} (the broker answered {what} with this ERROR twice, the second time while it was "
                     "the only request outstanding)", frame=frame)


def _size(frame: Frame) -> int:
    return len(frame.body) + sum(len(k) + len(v) for k, v in frame.headers)


@dataclass
class _Entry:
    frame: Frame
    size: int
    gen: int = 0
    written_position: int | None = None  # position once written on link ``gen`` (after the write)
    receipt_position: int | None = None  # position taken before that write (sends asking for a receipt)
    rid: str | None = None   # its receipt id when it asks for one


class SendCache:
    """``trackMessages``: recent fire-and-forget SENDs by idempotency key (see the
    module docstring). Not thread-safe: the caller holds its lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._by_rid: dict[str, str] = {}
        self.bytes = 0
        self.trimmed = 0   # entries proven processed by a receipt
        self.evicted = 0   # entries dropped by the size bound

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    @staticmethod
    def key_of(frame: Frame) -> str:
        return frame.get(IDEMPOTENCY_HEADER) or f"anon-{id(frame)}"

    def put(self, key: str, frame: Frame) -> bool:
        """Add a send about to be written; False when the key is already cached."""
        if key in self._entries:
            return False
        entry = _Entry(frame, _size(frame), rid=frame.get("receipt"))
        self._entries[key] = entry
        if entry.rid is not None:
            self._by_rid[entry.rid] = key
        self.bytes += entry.size
        while self._entries and self.bytes > self.limit:
            self._drop(next(iter(self._entries)))
            self.evicted += 1
        return True

    def written(self, key: str, gen: int, written_position: int, receipt_position: int | None = None) -> None:
        """The send ``key`` is on the wire of link ``gen``: position ``receipt_position`` taken
        before its write, ``written_position`` after it."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.gen, entry.written_position, entry.receipt_position = gen, written_position, receipt_position

    def frames(self) -> list[Frame]:
        return [e.frame for e in self._entries.values()]

    def replayed(self, gen: int, positions: Iterable[int]) -> None:
        """Every entry was written again on link ``gen``, in order, at ``positions``."""
        for entry, pos in zip(self._entries.values(), positions, strict=False):
            entry.gen, entry.written_position, entry.receipt_position = gen, pos, pos

    def on_receipt(self, gen: int, receipt_position: int | None) -> None:
        """A receipt arrived on link ``gen`` for a write made at position ``receipt_position``: drop
        every entry written before it on that link."""
        if receipt_position is None:
            return
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.gen != gen or entry.written_position is None or entry.written_position >= receipt_position:
                return
            self._drop(key)
            self.trimmed += 1

    def own_receipt(self, rid: str) -> tuple[str, int, int | None] | None:
        """If ``rid`` is the receipt of a cached send: (key, gen, receipt_position) of its last write."""
        key = self._by_rid.get(rid)
        if key is None:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        return key, entry.gen, entry.receipt_position

    def discard(self, key: str) -> bool:
        if key not in self._entries:
            return False
        self._drop(key)
        return True

    def clear(self) -> int:
        n = len(self._entries)
        self._entries.clear()
        self._by_rid.clear()
        self.bytes = 0
        return n

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.size
        if entry.rid is not None:
            self._by_rid.pop(entry.rid, None)


class Tracking:
    """``trackMessages``: the :class:`SendCache`, the receipt one tracked send in
    :data:`TRACK_RECEIPT_EVERY` asks for, and the idle barriers (module docstring, *The
    send cache*). ``positions`` is the failover core's one counter of write positions."""

    def __init__(self, enabled: bool, max_cache_size: int, next_id: Callable[[str], str],
                 positions: Iterator[int]) -> None:
        self.enabled = enabled
        self.cache = SendCache(max_cache_size)
        self._next_id = next_id
        self._positions = positions
        self._unreceipted = 0  # tracked sends since the last one asking for a receipt
        self._barriers: dict[str, int] = {}  # receipt id -> position, of idle barriers in flight

    def track(self, frame: Frame) -> tuple[Frame, str | None]:
        """A fire-and-forget frame about to be written: with ``trackMessages`` a SEND is
        cached (the key; None when not tracked) and now and then asks for a receipt."""
        if not (self.enabled and frame.command == "SEND"):
            return frame, None
        key = SendCache.key_of(frame)
        self._unreceipted += 1
        if self._unreceipted >= TRACK_RECEIPT_EVERY:
            # a receipt now and then proves (and trims) everything written before
            self._unreceipted = 0
            frame = with_receipt(frame, self._next_id("t"))
        if not self.cache.put(key, frame):
            return frame, None  # the same key is already cached: this copy is not tracked
        return frame, key

    def written(self, key: str, generation: int, receipt_position: int | None) -> None:
        """The tracked send ``key`` went out on link ``generation``."""
        self.cache.written(key, generation, next(self._positions), receipt_position)

    def barrier(self) -> tuple[list[Frame], str]:
        """An idle barrier's frames (an empty transaction whose ABORT asks for a receipt
        that trims the cache) and that receipt's id."""
        tx_id, rid = self._next_id("amq-barrier"), self._next_id("t")
        self._barriers[rid] = next(self._positions)
        self._unreceipted = 0
        return [Frame.make("BEGIN", {"transaction": tx_id}),
                Frame.make("ABORT", {"transaction": tx_id, "receipt": rid})], rid

    def barrier_stale(self, rid: str) -> None:
        """The barrier ``rid`` went out on a link that is no longer current."""
        self._barriers.pop(rid, None)

    def new_link(self) -> None:
        """Barriers in flight died with the previous link."""
        self._barriers.clear()

    def own_receipt(self, rid: str, gen: int) -> None:
        """A receipt the transport asked for itself, on link ``gen``: trims the cache."""
        if rid in self._barriers:
            self.cache.on_receipt(gen, self._barriers.pop(rid))
            return
        found = self.cache.own_receipt(rid)
        if found is not None:
            key, entry_gen, receipt_position = found
            if entry_gen == gen:
                self.cache.on_receipt(gen, receipt_position)
                self.cache.discard(key)

    def own_error(self, rid: str, frame: Frame) -> bool:
        """An ERROR answering receipt ``rid``: True when the transport asked for it itself
        (a barrier, or a tracked send, which is dropped from the cache)."""
        found = self.cache.own_receipt(rid)
        if rid not in self._barriers and found is None:
            return False
        self._barriers.pop(rid, None)
        if found is not None:
            self.cache.discard(found[0])
            log.error("failover: the broker refused a fire-and-forget send (%s): dropped from "
                      "the trackMessages cache", error_text(frame))
        return True
