"""The message store: durable state of persistent messages on top of the journal.

Theory of operation
-------------------
The store owns three things: the :class:`~.journal.Journal` (bytes on disk), the
*live* persistent messages (accepted, not yet acknowledged), and the
duplicate-suppression :class:`~.dedupe.DedupeWindow`. It knows nothing about
consumers or sockets; the dispatch core calls it and it calls back when records
are durable. All methods run on one thread (the broker's event loop); only the
journal's writer thread touches files for writing, and completions come back through
the ``notify`` function given at construction.

The store's stories, one module each: this one holds its state and the mutations;
:mod:`.folding` folds the record stream into the state (:meth:`apply`); :mod:`.paging`
finds live messages and reads paged ones back (resident and paged); :mod:`.compaction`
frees segments (and the store limit that waits for it); :mod:`.checkpoint` writes and
loads the index.

State is a pure function of the record stream: :meth:`apply` folds one record into
the in-memory state, and recovery (records read back from segments), a replica
(records received from a master, :meth:`import_payloads`) and the public mutations
all use it, so a store can always be rebuilt from a stream of records. Every mutation
made through the public methods is (1) encoded as a record, (2) appended to the
journal, (3) applied, and (4) announced to :class:`StoreListener` objects in that
order.

A failed apply. Records are appended before they are applied, so an apply that raises
partway through a batch (its own write, an import from a master, a full sync's
snapshot) leaves records on the journal whose effects the state does not hold. Such a
state must never be taken for the journal's: a checkpoint from it would claim those
records (recovery replays only what follows its position) and compaction would count
their segments dead and delete them. So the failure marks the store :attr:`diverged`
(and raises on: the caller's operation, or the replication link, fails as before);
from then on no checkpoint is started or written at close, and compaction deletes
nothing, and ``on_diverged`` is called (a serving broker fences itself: it stops serving
from a state that is not its journal's; a restart recovers). It is logged at ERROR (:data:`.checkpoint.DIVERGED`); the next start recovers
from the previous checkpoint and the journal, which hold every appended record.

Importing (a replica). A replica imports records in two steps, so that a slave can
ack a batch once it is on its disk and apply it after the ack (:mod:`..ha.slave_link`):
:meth:`append_payloads` decodes a batch (a bad record raises before anything is
written) and appends it to the journal, unapplied; :meth:`apply_appended` folds every
appended batch into the state, in append order; :meth:`import_payloads` is the two in
a row. Appended-and-unapplied records are as safe as applied ones: the journal is the
store, and recovery replays it whether or not the state before the crash had folded
them. What must never happen is a state that misses an appended record being taken for
the journal's: a checkpoint (the fold up to the journal's position) is only captured
after :meth:`apply_appended` (:meth:`close` applies first: the takeover path closes the
replica's store before the node serves it), a ``Fan`` or ``Tx`` batch (named from the
state) applies what precedes it before it is encoded, and the caller applies before it
lets anything else run on the loop. An apply that fails leaves the store
:attr:`diverged` ("A failed apply" above).

Recovery and checkpoints (:mod:`.checkpoint`). Recovery loads the newest checkpoint
(the state as of a journal position) and replays only the records after that
position; a checkpoint that is torn, from another journal, or older than what the
journal still holds makes recovery replay everything instead. Recovered messages are
paged; each destination is ordered by acceptance time.

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

import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..dispatch.message import Message
from . import checkpoint as ckpt
from .compaction import KEYS_PER_RECORD as _KEYS_PER_RECORD
from .compaction import Compaction
from .dedupe import DedupeWindow
from .fanout import FanGroup, FanOutRecords, is_copy_of
from .folding import FRAME_HEAD, RecordFolding
from .journal import MAX_RECORD, Callback, Journal, JournalError
from .pages import PageList, SharedTail, pack
from .paging import ORIGINAL_DESTINATION, LiveView, PagedMessages
from .records import (
    Ack,
    Enq,
    Fan,
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
    paged: int = 0


class MessageStore(RecordFolding, PagedMessages, Compaction, FanOutRecords):
    """The store (see the module docstring); folding records into its state is
    :class:`~.folding.RecordFolding`, finding and paging messages
    :class:`~.paging.PagedMessages`, compaction :class:`~.compaction.Compaction`, topic
    messages stored once :class:`~.fanout.FanOutRecords`."""

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
        checkpoint_interval: int = 0,
        checkpoints: bool = True,
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
        self.full_since: float | None = None  # time.monotonic() when ``full`` was set (readiness)
        self.on_space: Callable[[], None] | None = None  # called when ``full`` clears
        #: called once, on the thread of the failed apply, when the store becomes :attr:`diverged`
        self.on_diverged: Callable[[BaseException], None] | None = None
        self.dedupe = DedupeWindow(dedupe_max_keys, dedupe_max_age, clock)
        self.resident: dict[str, Message] = {}
        self.paged: dict[str, PageList] = {}
        self.count = 0  # live persistent messages, resident and paged
        self.live = LiveView(self)
        self.subs: dict[str, Sub] = {}
        self._sub_seg: dict[str, int] = {}
        self._seg_live: dict[int, int] = {}  # segment -> live messages whose Enq it holds
        self._enqs: dict[int, int] = {}  # segment -> Enq records written into it (relocation policy)
        self.relocated = 0
        self._refs: dict[int, set[int]] = {}
        self._ref_names: dict[int, str] = {}  # fanout.py
        self._ref_of: dict[str, int] = {}
        self._named: dict[int, set[int]] = {}
        self._tails: dict[tuple[str, ...], SharedTail] = {}  # fanout.py: paged copies' shared tails
        self._groups: dict[tuple[str, ...], FanGroup] = {}  # fanout.py: the groups' references
        self._by_refs: dict[int, FanGroup] = {}  # id() of a group's references -> the group
        self._undurable: dict[tuple[str, str], list[Callback]] = {}
        self.diverged: BaseException | None = None  # the first apply that failed after its append
        # batches appended by append_payloads, not applied yet: (records, payloads, segment, offset)
        self._unapplied: deque[tuple[Sequence[Record], Sequence[bytes], int, int]] = deque()
        self._listeners: list[StoreListener] = []
        self._compact_due = False
        self._holdback_next = 0
        self._replay_seen: set[int] | None = None  # id hashes of live messages during a full replay
        # non-persistent messages queued among paged ones (page_out), by their key in the list
        self._transient: dict[int, Message] = {}
        self._transient_keys = itertools.count(1)
        self.deleted_segments = 0
        self.compaction_failures = 0  # compaction runs that raised (server.py counts them; metrics)
        self.unreadable = 0  # live messages that could not be read back (paging.py)
        self._opened = False
        self.checkpoints: ckpt.Checkpointer = ckpt.Checkpointer(self, interval=checkpoint_interval, enabled=checkpoints)

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Recover state (from the checkpoint when it is good), truncate a torn tail, start writing."""
        started = time.monotonic()
        try:
            how = self.checkpoints.recover()
        except BaseException:  # e.g. SegmentsLost (chain.py): refused; let go of the directory
            self.journal.close()
            raise
        log.info(
            "store %s: %s in %.2f s: %d live messages, %d durable subscriptions, %d idempotency keys",
            self.directory,
            how,
            time.monotonic() - started,
            self.count,
            len(self.subs),
            len(self.dedupe),
        )
        self.journal.start()
        self._opened = True
        self._compact_due = True
        if not how.startswith("recovered from the checkpoint") and self.count:
            self.checkpoints.after_full_replay()

    def replay(self, start: tuple[int, int] | None) -> int:
        """Fold the journal's records from ``start`` (None: all of them) into the state;
        returns how many. Used by recovery (:mod:`.checkpoint`)."""
        n = 0
        self._replay_seen = set() if start is None else None
        try:
            for seg, offset, payload, rec in self.journal.recover_from(start):
                self.apply(rec, pack(seg, offset), payload)
                n += 1
        finally:
            self._replay_seen = None
        for pl in self.paged.values():
            if not pl.ordered:
                pl.sort()
        return n

    def reset_state(self) -> None:
        """Forget everything (before a full replay)."""
        self.dedupe = DedupeWindow(self.dedupe.max_keys, self.dedupe.max_age, self.clock)
        self.resident.clear()
        self.paged.clear()
        self._tails.clear()
        self.count = 0
        self.subs.clear()
        self._sub_seg.clear()
        self._seg_live.clear()
        self._enqs.clear()
        self._refs.clear()
        self._ref_names.clear()
        self._ref_of.clear()
        self._named.clear()
        self._groups.clear()
        self._by_refs.clear()

    def close(self) -> None:
        """Apply what is appended and not applied yet, flush everything to disk, write a
        checkpoint (none from a :attr:`diverged` state) and stop the writer."""
        if self._unapplied:  # the checkpoint below must be the fold of every appended record
            # a failure marks the store diverged (logged there): at_close then writes none
            with contextlib.suppress(Exception):
                self.apply_appended()
        if self._opened and self.journal.failed is None and self.journal.flush(timeout=30):
            self.checkpoints.at_close()
        self.checkpoints.stop()
        self.journal.close()
        self._opened = False

    def flush(self, timeout: float | None = None) -> bool:
        return self.journal.flush(timeout)

    def _diverge(self, exc: BaseException) -> None:
        """An apply raised after its records were appended: the state is behind the
        journal from now on (the module docstring, "A failed apply")."""
        first = self.diverged is None
        if first:
            self.diverged = exc
        log.error("store %s: %s (%s: %s)", self.directory, ckpt.DIVERGED, type(exc).__name__, exc)
        if first and self.on_diverged is not None:
            self.on_diverged(exc)

    def add_listener(self, listener: StoreListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: StoreListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _write(self, records: Sequence[Record], callback: Callback | None, *, keep: bool = True,
               alone: bool = False) -> int:
        if any(isinstance(r, (Fan, Tx)) for r in records):  # references named for their segment
            records, payloads = self._fan_encode(records)
        else:
            payloads = [encode(r) for r in records]
        seg, offset = self.journal.append_at(payloads, callback, alone=alone)
        try:
            if self.limit and not self.full:
                self._check_limit()
            for rec, payload in zip(records, payloads, strict=True):
                self.apply(rec, pack(seg, offset), payload, keep=keep)
                offset += FRAME_HEAD + len(payload)
        except BaseException as exc:
            self._diverge(exc)
            raise
        if self._listeners:
            for rec, payload in zip(records, payloads, strict=True):
                for listener in list(self._listeners):
                    try:
                        listener.on_record(rec, payload, seg)
                    except Exception:  # noqa: BLE001 - a listener bug must not break the store
                        log.exception("store listener %r failed", listener)
        if self.checkpoints.interval:
            self.checkpoints.appended()
        return seg

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
        """Persist a newly accepted message (and its idempotency key); it stays resident."""
        cb = self._track_key(message.destination, message.key, callback) if message.key else callback
        if self._listeners:
            self._write([Enq(message)], cb)
            return
        # the commonest record: _write and _apply_enq without their generality
        seg, offset = self.journal.append_at((encode_enq(message),), cb)
        try:
            if self.limit and not self.full:
                self._check_limit()
            message.persistent = True
            message.segment, message.pos = seg, pack(seg, offset)
            self.resident[message.id] = message
            self.count += 1
            self._seg_live[seg] = self._seg_live.get(seg, 0) + 1
            self._enqs[seg] = self._enqs.get(seg, 0) + 1
            if message.key:
                self.dedupe.add(message.destination, message.key, message.timestamp, seg)
        except BaseException as exc:
            self._diverge(exc)
            raise
        if self.checkpoints.interval:
            self.checkpoints.appended()

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

    def _acks(self, ids: Sequence[str], destination: str = "") -> list[Ack]:
        """Ack records for the live ones of ``ids``, one per destination they are in."""
        if len(ids) == 1:  # the commonest: one resident message
            m = self.resident.get(ids[0])
            if m is not None:
                return [Ack((m.id,), m.destination)]
        by_dest: dict[str, list[str]] = {}
        for mid in ids:
            where = self.find(mid, destination)
            if where is None:
                continue
            if isinstance(where, Message):
                dest = where.destination
            else:
                pl = where[0]
                dest = destination if self.paged.get(destination) is pl else self._dest_of(pl)
            by_dest.setdefault(dest, []).append(mid)
        return [Ack(tuple(v), d) for d, v in by_dest.items()]

    def _dest_of(self, pl: PageList) -> str:
        return next(d for d, p in self.paged.items() if p is pl)

    def ack(self, ids: Sequence[str], callback: Callback | None = None, *, destination: str = "") -> None:
        """Remove consumed messages; ids not in the store (non-persistent) are ignored.
        ``destination``: where paged ones among them are (searched first)."""
        acks = self._acks(ids, destination)
        if not acks:
            if callback is not None:
                self.journal.on_durable(callback)
            return
        self._write(acks, callback)

    def move(self, message_id: str, destination: str, callback: Callback | None = None) -> None:
        """Move a live message to another destination (e.g. the dead-letter queue)."""
        where = self.find(message_id)
        source = "" if where is None else where.destination if isinstance(where, Message) else self._dest_of(where[0])
        if where is None or source == destination:
            if callback is not None:
                self.journal.on_durable(callback)
            return
        if is_copy_of(message_id, source):  # a topic message's copy: it may share its record
            self._write(self._copy_move(where, source, destination), callback, keep=isinstance(where, Message))
            return
        self._write([Move(message_id, destination, source)], callback)

    def commit(self, records: Sequence[TxPart], callback: Callback | None = None) -> None:
        """Write a transaction's records atomically (one checksum covers them all)."""
        kept: list[TxPart] = []
        cb = callback
        for rec in records:
            if isinstance(rec, Ack):
                kept.extend(self._acks(rec.ids, rec.destination))
            elif isinstance(rec, Move):
                where = self.find(rec.id, rec.source)
                if where is not None:
                    source = where.destination if isinstance(where, Message) else self._dest_of(where[0])
                    kept.append(Move(rec.id, rec.destination, source))
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
        """Append records produced by another store (a replication stream) and apply them
        (their messages are paged: nobody consumes from a replica): :meth:`append_payloads`
        then :meth:`apply_appended`."""
        self.append_payloads(payloads, callback)
        self.apply_appended()

    def append_payloads(self, payloads: Sequence[bytes], callback: Callback | None = None) -> None:
        """The first step of an import (see the module docstring, "Importing"): decode
        records produced by another store and append them to the journal (durable with
        its next commit; ``callback`` then), *not* applied: :meth:`apply_appended` folds
        them into the state. A batch with ``Fan`` or ``Tx`` records is named for this
        journal's segments from the state, so what is appended before it is applied first."""
        records: Sequence[Record] = [decode(p) for p in payloads]  # a bad record raises before the append
        if any(isinstance(r, (Fan, Tx)) for r in records):  # named for this journal's segments
            self.apply_appended()
            records, payloads = self._fan_encode(records, payloads)
        # the master's carried keys: in a segment of their own here too (compaction.py)
        alone = bool(records) and all(isinstance(r, Keys) for r in records)
        seg, offset = self.journal.append_at(list(payloads), callback, alone=alone)
        self._unapplied.append((records, payloads, seg, offset))

    def apply_appended(self) -> None:
        """The second step of an import: fold every batch :meth:`append_payloads` appended
        and nothing applied yet into the state, in the order they were appended. A failure
        leaves the state short of the journal: it raises, and the store stays
        :attr:`diverged` (no checkpoint is written from it any more)."""
        if not self._unapplied:  # (a slave calls this after every read, pings included)
            return
        while self._unapplied:
            records, payloads, seg, offset = self._unapplied.popleft()
            try:
                for rec, payload in zip(records, payloads, strict=True):
                    self.apply(rec, pack(seg, offset), payload)
                    offset += FRAME_HEAD + len(payload)
            except BaseException as exc:
                self._unapplied.clear()
                self._diverge(exc)
                raise
        self.checkpoints.appended()  # (a checkpoint captures the journal's position: none applied short of it)

    @property
    def unapplied(self) -> int:
        """Records appended by :meth:`append_payloads` and not applied yet."""
        return sum(len(b[0]) for b in self._unapplied)

    def import_records(self, records: Iterable[Record], callback: Callback | None = None) -> None:
        """Append and apply a stream of records (e.g. a snapshot from :meth:`snapshot`);
        their messages are paged."""
        batch: list[Record] = []
        for rec in records:
            batch.append(rec)
            if len(batch) >= 1000:
                self._write(batch, None, keep=False)
                batch = []
        if batch:
            self._write(batch, callback, keep=False)
        elif callback is not None:
            self.journal.on_durable(callback)

    # ------------------------------------------------------------------ queries
    def snapshot(self) -> Iterator[Record]:
        """A minimal record stream that rebuilds the current state from nothing."""
        yield from self.subs.values()
        keys = [(scope, k, ts) for scope, k, ts, seg in self.dedupe.items() if seg >= 0]
        for i in range(0, len(keys), _KEYS_PER_RECORD):
            yield Keys(tuple(keys[i : i + _KEYS_PER_RECORD]))
        for m in self.iter_messages():
            yield Enq(m)

    def messages_by_destination(self) -> dict[str, list[Message]]:
        """Every live message, made resident, grouped by destination in acceptance order
        (journal order, stably sorted by acceptance time, so that messages relocated by
        compaction come back in their original place)."""
        for dest in list(self.paged):
            self.take(dest, len(self.paged[dest]))
        out: dict[str, list[Message]] = {}
        for m in self.resident.values():
            out.setdefault(m.destination, []).append(m)
        for msgs in out.values():
            msgs.sort(key=lambda m: m.timestamp)
        return out

    def stats(self) -> StoreStats:
        return StoreStats(
            live_messages=self.count,
            segments=len(self.journal.segments),
            deleted_segments=self.deleted_segments,
            duplicates=self.dedupe.dropped,
            records=self.journal.records_written,
            batches=self.journal.batches,
            relocated=self.relocated,
            paged=self.count - len(self.resident),
        )
