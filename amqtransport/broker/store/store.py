"""The message store: durable state of persistent messages on top of the journal.

Theory of operation
-------------------
The store owns three things: the :class:`~.journal.Journal` (bytes on disk), the
set of *live* persistent messages (accepted, not yet acknowledged), and the
duplicate-suppression :class:`~.dedupe.DedupeWindow`. It knows nothing about
consumers or sockets; the dispatch core calls it and it calls back when records
are durable. All methods run on one thread (the broker's event loop); only the
journal's writer thread touches files, and completions come back through the
``notify`` function given at construction.

State is a pure function of the record stream: :meth:`apply` folds one record into
the in-memory state, and both recovery (records read back from segments) and a
replica (records received from a master, :meth:`import_payloads`) use it, so a
store can always be rebuilt from a stream of records. Every mutation made through
the public methods is (1) encoded as a record, (2) applied, (3) appended to the
journal, and (4) announced to :class:`StoreListener` objects in that order.

Compaction accounting. For every segment the store keeps the number of live
messages whose ``Enq`` record it holds, and the set of *older* segments that its
``Ack``/``Move``/``Unsub`` records refer to -- and that its ``Enq`` records refer to
when they supersede an older copy of the same message (relocation): the ack of the
new copy may sit in the same segment, and the old copy must not outlive it. A segment (never the head) can be
deleted when it holds no live message and every segment it refers to is deleted
too -- otherwise deleting the ack would resurrect the acked message on the next
recovery. State that must outlive its segment (durable subscriptions, idempotency
keys still inside the window) is re-appended to the head segment first; the
journal deletes the files only after that batch is durable.

Store limit (ActiveMQ's ``storeUsage``). With ``store_limit`` > 0 the store sets
:attr:`MessageStore.full` once the journal's segments reach that many bytes; the
connection handler then holds persistent SENDs (producer flow control) or refuses them
(``send_fail_if_no_space``). Only compaction frees space: it clears the flag when the
journal is down to ``store_low_water`` x the limit and calls ``on_space``. ACKs and
other records are still written while the store is full (they are what frees it).

Duplicate suppression. :meth:`is_duplicate` is true for an idempotency key already
accepted for the same destination within the window; if the original's record is
not yet durable the duplicate's completion waits for it, so a receipt for a repeat
never precedes the original's fsync. A key's destination is that of the ``Enq``
carrying it; the durable copies of a topic message carry no key, the topic's key
rides in a ``Keys`` record inside the same ``Tx``. A ``Move`` (to a dead-letter
queue) takes the key off the moved message: the window keeps it under the
destination it was sent to (carried by the original segment, or forward by
compaction), and a later re-write of the message cannot re-scope it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..message import Message
from .dedupe import DedupeWindow
from .journal import MAX_RECORD, Callback, Journal, JournalError
from .records import (
    Ack,
    Enq,
    Keys,
    Move,
    Record,
    Sub,
    Tx,
    TxPart,
    Unsub,
    decode,
    encode,
    encode_enq,
)

__all__ = ["MessageStore", "StoreListener", "StoreStats", "ORIGINAL_DESTINATION"]

log = logging.getLogger(__name__)

ORIGINAL_DESTINATION = "original-destination"
_KEYS_PER_RECORD = 5000


class StoreListener(Protocol):
    """Observer of the store's record stream (replication hooks in here)."""

    def on_record(self, record: Record, payload: bytes, segment: int) -> None:
        """Called on the loop thread for every record appended, before it is durable."""


@dataclass
class StoreStats:
    live_messages: int = 0
    segments: int = 0
    deleted_segments: int = 0
    duplicates: int = 0
    records: int = 0
    batches: int = 0
    relocated: int = 0


class MessageStore:
    def __init__(
        self,
        directory: str | Path,
        *,
        segment_size: int = 32 << 20,
        fsync: bool = True,
        dedupe_max_keys: int = 100_000,
        dedupe_max_age: float = 3600.0,
        notify: Callable[[list[tuple[Callback, BaseException | None]]], None] | None = None,
        clock: Callable[[], float] = time.time,
        max_record: int = MAX_RECORD,
        store_limit: int = 0,
        store_low_water: float = 0.7,
        on_failure: Callable[[JournalError], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.clock = clock
        self.journal = Journal(
            self.directory,
            segment_size=segment_size,
            fsync=fsync,
            notify=notify,
            max_record=max_record,
            on_failure=on_failure,
        )
        self.limit = store_limit  # bytes of journal (0: no limit); see the module docstring
        self.low_water = store_low_water
        self.full = False
        self.on_space: Callable[[], None] | None = None  # called when ``full`` clears
        self.dedupe = DedupeWindow(dedupe_max_keys, dedupe_max_age, clock)
        self.live: dict[str, Message] = {}
        self.subs: dict[str, Sub] = {}
        self._sub_seg: dict[str, int] = {}
        self._members: dict[int, set[str]] = {}  # segment -> ids of live messages whose Enq it holds
        self._enqs: dict[int, int] = {}  # segment -> Enq records written into it (relocation policy)
        self.relocated = 0
        self._refs: dict[int, set[int]] = {}
        self._undurable: dict[tuple[str, str], list[Callback]] = {}
        self._listeners: list[StoreListener] = []
        self._compact_due = False
        self.deleted_segments = 0
        self._opened = False

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Recover state from the journal (truncating a torn tail) and start writing."""
        n = 0
        for seg, rec in self.journal.recover():
            self.apply(rec, seg)
            n += 1
        log.info(
            "store %s: recovered %d records, %d live messages, %d durable subscriptions, %d idempotency keys",
            self.directory,
            n,
            len(self.live),
            len(self.subs),
            len(self.dedupe),
        )
        self.journal.start()
        self._opened = True
        self._compact_due = True

    def close(self) -> None:
        """Flush everything to disk and stop the writer."""
        self.journal.close()
        self._opened = False

    def flush(self, timeout: float | None = None) -> bool:
        return self.journal.flush(timeout)

    def add_listener(self, listener: StoreListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: StoreListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # ------------------------------------------------------------------ state folding
    def apply(self, rec: Record, seg: int) -> None:
        """Fold one record (stored in segment ``seg``) into the in-memory state."""
        if isinstance(rec, Enq):
            m = rec.message
            m.persistent = True
            old = self.live.get(m.id)
            if old is not None:  # a re-written copy (relocation) supersedes the old Enq
                self._dec(old.segment, m.id)
                if old.segment != seg:
                    self._refs.setdefault(seg, set()).add(old.segment)
            m.segment = seg
            self.live[m.id] = m
            self._add_member(seg, m.id)
            if m.key:
                self.dedupe.add(m.destination, m.key, m.timestamp, seg)
        elif isinstance(rec, Ack):
            for mid in rec.ids:
                gone = self.live.pop(mid, None)
                if gone is None:
                    continue
                self._dec(gone.segment, mid)
                if gone.segment != seg:
                    self._refs.setdefault(seg, set()).add(gone.segment)
        elif isinstance(rec, Move):
            moved = self.live.get(rec.id)
            if moved is not None:
                moved.key = ""  # the window keeps it under the destination it was sent to
                if moved.destination != rec.destination:
                    if not any(k == ORIGINAL_DESTINATION for k, _ in moved.headers):
                        moved.headers = moved.headers + ((ORIGINAL_DESTINATION, moved.destination),)
                    moved.destination = rec.destination
                    moved.wire_cache = None
                if moved.segment != seg:
                    self._refs.setdefault(seg, set()).add(moved.segment)
        elif isinstance(rec, Tx):
            for sub in rec.records:
                self.apply(sub, seg)
        elif isinstance(rec, Keys):
            for scope, key, ts in rec.keys:
                self.dedupe.add(scope, key, ts, seg)
        elif isinstance(rec, Sub):
            self.subs[rec.queue] = rec
            self._sub_seg[rec.queue] = seg
        elif isinstance(rec, Unsub):
            self.subs.pop(rec.queue, None)
            old_seg = self._sub_seg.pop(rec.queue, None)
            if old_seg is not None and old_seg != seg:
                self._refs.setdefault(seg, set()).add(old_seg)

    def _add_member(self, seg: int, mid: str) -> None:
        members = self._members.get(seg)
        if members is None:
            members = self._members[seg] = set()
        members.add(mid)
        self._enqs[seg] = self._enqs.get(seg, 0) + 1

    def _dec(self, seg: int, mid: str) -> None:
        members = self._members.get(seg)
        if members is None:
            return
        members.discard(mid)
        if not members:
            del self._members[seg]
            self._compact_due = True

    def _write(self, records: Sequence[Record], callback: Callback | None) -> int:
        payloads = [encode(r) for r in records]
        seg = self.journal.append(payloads, callback)
        if self.limit and not self.full:
            self._check_limit()
        for rec in records:
            self.apply(rec, seg)
        if self._listeners:
            for rec, payload in zip(records, payloads, strict=True):
                for listener in list(self._listeners):
                    try:
                        listener.on_record(rec, payload, seg)
                    except Exception:  # noqa: BLE001 - a listener bug must not break the store
                        log.exception("store listener %r failed", listener)
        return seg

    # ------------------------------------------------------------------ store limit
    def _check_limit(self) -> None:
        if self.journal.size >= self.limit:
            self.full = True
            log.warning(
                "store %s: store limit reached (%d bytes of journal, store_limit=%d): "
                "producer flow control engaged for persistent messages",
                self.directory,
                self.journal.size,
                self.limit,
            )

    def _check_space(self) -> None:
        """After compaction: release flow control once usage is down to the low-water mark."""
        if self.full and self.journal.size <= self.limit * self.low_water:
            self.full = False
            log.warning(
                "store %s: journal down to %d bytes: producer flow control released", self.directory, self.journal.size
            )
            if self.on_space is not None:
                self.on_space()

    # ------------------------------------------------------------------ dedupe
    def is_duplicate(self, destination: str, key: str, callback: Callback | None = None) -> bool:
        """True when ``key`` was accepted for ``destination`` within the window.

        For a duplicate, ``callback`` runs once the original is durable (at once if it
        already is, through the journal's notify path so ordering stays FIFO).
        """
        if not key or not self.dedupe.contains(destination, key):
            return False
        self.dedupe.dropped += 1
        if callback is not None:
            waiters = self._undurable.get((destination, key))
            if waiters is not None:
                waiters.append(callback)
            else:
                self.journal.on_durable(callback)
        return True

    def remember_key(self, destination: str, key: str) -> None:
        """Remember the key of a non-persistent message (memory only)."""
        if key:
            self.dedupe.add(destination, key, self.clock(), -1)

    def _track_key(self, destination: str, key: str, callback: Callback | None) -> Callback | None:
        """``callback`` wrapped so that repeats of ``key`` seen meanwhile complete after it."""
        if not key:
            return callback
        waiters: list[Callback] = []
        entry = (destination, key)
        self._undurable[entry] = waiters

        def done(err: BaseException | None) -> None:
            if self._undurable.get(entry) is waiters:
                del self._undurable[entry]
            if callback is not None:
                callback(err)
            for w in waiters:
                try:
                    w(err)
                except Exception:  # noqa: BLE001
                    log.exception("duplicate-send completion failed")

        return done

    # ------------------------------------------------------------------ mutations
    def add(self, message: Message, callback: Callback | None = None) -> None:
        """Persist a newly accepted message (and its idempotency key)."""
        if self._listeners:
            self._write([Enq(message)], self._track_key(message.destination, message.key, callback))
            return
        # fast path of _write for the commonest record
        payload = encode_enq(message)
        cb = self._track_key(message.destination, message.key, callback) if message.key else callback
        seg = self.journal.append((payload,), cb)
        if self.limit and not self.full:
            self._check_limit()
        message.persistent = True
        message.segment = seg
        self.live[message.id] = message
        self._add_member(seg, message.id)
        if message.key:
            self.dedupe.add(message.destination, message.key, message.timestamp, seg)

    def add_many(
        self,
        messages: Sequence[Message],
        callback: Callback | None = None,
        *,
        key: tuple[str, str, float] | None = None,
    ) -> None:
        """Persist several messages in one atomic record (a topic's durable copies),
        with the idempotency ``key`` ``(destination, key, accepted-at)`` they were sent under."""
        if not messages:
            if callback is not None:
                self.journal.on_durable(callback)
            return
        if len(messages) == 1 and key is None:
            self.add(messages[0], callback)
            return
        self.commit([*(Enq(m) for m in messages), *([Keys((key,))] if key else [])], callback)

    def ack(self, ids: Sequence[str], callback: Callback | None = None) -> None:
        """Remove consumed messages; ids not in the store (non-persistent) are ignored."""
        live = [i for i in ids if i in self.live]
        if not live:
            if callback is not None:
                self.journal.on_durable(callback)
            return
        self._write([Ack(tuple(live))], callback)

    def move(self, message_id: str, destination: str, callback: Callback | None = None) -> None:
        """Move a live message to another destination (e.g. the dead-letter queue)."""
        if message_id in self.live:
            self._write([Move(message_id, destination)], callback)
        elif callback is not None:
            self.journal.on_durable(callback)

    def commit(self, records: Sequence[TxPart], callback: Callback | None = None) -> None:
        """Write a transaction's records atomically (one checksum covers them all)."""
        kept: list[TxPart] = []
        cb = callback
        for rec in records:
            if isinstance(rec, Ack):
                ids = tuple(i for i in rec.ids if i in self.live)
                if ids:
                    kept.append(Ack(ids))
            elif isinstance(rec, Move):
                if rec.id in self.live:
                    kept.append(rec)
            elif isinstance(rec, Keys):
                kept.append(rec)
                for scope, key, _ts in rec.keys:
                    cb = self._track_key(scope, key, cb)
            else:
                kept.append(rec)
                if rec.message.key:
                    cb = self._track_key(rec.message.destination, rec.message.key, cb)
        if not kept:
            if cb is not None:
                self.journal.on_durable(cb)
            return
        self._write([Tx(tuple(kept))] if len(kept) > 1 else kept, cb)

    def add_subscription(self, sub: Sub, callback: Callback | None = None) -> None:
        if self.subs.get(sub.queue) == sub:
            if callback is not None:
                self.journal.on_durable(callback)
            return
        self._write([sub], callback)

    def remove_subscription(self, queue: str, callback: Callback | None = None) -> None:
        if queue in self.subs:
            self._write([Unsub(queue)], callback)
        elif callback is not None:
            self.journal.on_durable(callback)

    def import_payloads(self, payloads: Sequence[bytes], callback: Callback | None = None) -> None:
        """Append records produced by another store (a replication stream) and apply them."""
        records = [decode(p) for p in payloads]
        seg = self.journal.append(list(payloads), callback)
        for rec in records:
            self.apply(rec, seg)

    def import_records(self, records: Iterable[Record], callback: Callback | None = None) -> None:
        """Append and apply a stream of records (e.g. a snapshot from :meth:`snapshot`)."""
        batch: list[Record] = []
        for rec in records:
            batch.append(rec)
            if len(batch) >= 1000:
                self._write(batch, None)
                batch = []
        if batch:
            self._write(batch, callback)
        elif callback is not None:
            self.journal.on_durable(callback)

    # ------------------------------------------------------------------ queries
    def snapshot(self) -> Iterator[Record]:
        """A minimal record stream that rebuilds the current state from nothing."""
        yield from self.subs.values()
        keys = [(scope, k, ts) for scope, k, ts, seg in self.dedupe.items() if seg >= 0]
        for i in range(0, len(keys), _KEYS_PER_RECORD):
            yield Keys(tuple(keys[i : i + _KEYS_PER_RECORD]))
        for m in list(self.live.values()):
            yield Enq(m)

    def messages_by_destination(self) -> dict[str, list[Message]]:
        """Live messages grouped by destination, in acceptance order.

        Journal order, stably sorted by acceptance time, so that messages relocated by
        compaction come back in their original place.
        """
        out: dict[str, list[Message]] = {}
        for m in self.live.values():
            out.setdefault(m.destination, []).append(m)
        for msgs in out.values():
            msgs.sort(key=lambda m: m.timestamp)
        return out

    def stats(self) -> StoreStats:
        return StoreStats(
            live_messages=len(self.live),
            segments=len(self.journal.segments),
            deleted_segments=self.deleted_segments,
            duplicates=self.dedupe.dropped,
            records=self.journal.records_written,
            batches=self.journal.batches,
            relocated=self.relocated,
        )

    # ------------------------------------------------------------------ compaction
    def relocate(self, budget: int) -> int:
        """Re-append the few live messages that pin old segments; returns how many.

        A segment whose live messages are at most a tenth of those written into it
        (e.g. one poison message among thousands consumed) would otherwise stay
        forever -- and with it every later segment holding acks for its messages.
        Their ``Enq`` records are written again into the head segment (same id, same
        content), which leaves the old segment dead for :meth:`compact`.
        """
        if budget <= 0:
            return 0
        head = self.journal.head
        moved: list[Message] = []
        for seg in [s for s in self.journal.segments if s != head and s != head - 1]:
            members = self._members.get(seg)
            if not members:
                continue
            if len(members) * 10 > self._enqs.get(seg, 0) or len(moved) + len(members) > budget:
                continue
            moved.extend(self.live[mid] for mid in members)
        if not moved:
            return 0
        moved.sort(key=lambda m: m.timestamp)
        for i in range(0, len(moved), 500):
            self._write([Enq(m) for m in moved[i : i + 500]], None)
        self.relocated += len(moved)
        log.info("store %s: relocated %d long-lived messages out of old segments", self.directory, len(moved))
        return len(moved)

    def compact(self, force: bool = False, relocate: int = 0) -> list[int]:
        """Delete segments that hold nothing still needed; returns their ids.

        ``relocate`` > 0 first moves up to that many long-lived messages out of
        mostly-dead old segments (:meth:`relocate`).
        """
        if not self._opened or not (self._compact_due or force or relocate):
            return []
        self._compact_due = False
        if relocate:
            self.relocate(relocate)
        head = self.journal.head
        candidates = [s for s in self.journal.segments if s != head]
        existing = set(self.journal.segments)
        dead: set[int] = set()
        for seg in candidates:
            if seg in self._members:
                continue
            refs = self._refs.get(seg, ())
            if all(r in dead or r not in existing for r in refs):
                dead.add(seg)
        if not dead:
            return []
        carry: list[Record] = []
        keys = self.dedupe.in_segments(dead)
        for i in range(0, len(keys), _KEYS_PER_RECORD):
            carry.append(Keys(tuple(keys[i : i + _KEYS_PER_RECORD])))
        carry.extend(sub for q, sub in self.subs.items() if self._sub_seg.get(q) in dead)
        if carry:
            self._write(carry, None)
        for seg in dead:
            self._refs.pop(seg, None)
            self._members.pop(seg, None)
            self._enqs.pop(seg, None)
        for refs in self._refs.values():
            refs -= dead
        ordered = sorted(dead)
        self.journal.delete_segments(ordered)
        self.deleted_segments += len(ordered)
        self._check_space()
        log.debug(
            "store %s: compaction deletes segments %s (carried %d records)",
            self.directory,
            ordered,
            len(carry),
        )
        return ordered
