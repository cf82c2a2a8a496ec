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

Resident and paged. A live message is either *resident* (its
:class:`~..message.Message` is in :attr:`resident`, as the dispatch core holds it) or
*paged*: only its position in the journal, its id hash and its acceptance time, in
its destination's :class:`~.pages.PageList` (:attr:`paged`); :meth:`take` reads paged
messages back, in order, and makes them resident. A message added by the core stays
resident (:meth:`add`); a message the store learns of from its records -- recovery,
a replica's stream -- is paged. :attr:`count` counts both; :attr:`live` is a read-only
mapping over both (reading paged ones from disk: for tests and small stores).

State is a pure function of the record stream: :meth:`apply` folds one record into
the in-memory state, and recovery (records read back from segments), a replica
(records received from a master, :meth:`import_payloads`) and the public mutations
all use it, so a store can always be rebuilt from a stream of records. Every mutation
made through the public methods is (1) encoded as a record, (2) appended to the
journal, (3) applied, and (4) announced to :class:`StoreListener` objects in that
order. Records find the messages they name by id: a resident one in a dict, a paged
one by its id hash in the list of the destination the record names (``Ack`` and
``Move`` carry it; records of older versions do not, and then every list is searched).

Recovery and checkpoints (:mod:`.checkpoint`). Recovery loads the newest checkpoint
(the state as of a journal position) and replays only the records after that
position; a checkpoint that is torn, from another journal, or older than what the
journal still holds makes recovery replay everything instead. Recovered messages are
paged; each destination is ordered by acceptance time.

Compaction accounting. For every segment the store keeps the number of live
messages whose ``Enq`` record it holds, and the set of *older* segments that its
``Ack``/``Move``/``Unsub`` records refer to -- and that its ``Enq`` records refer to
when they supersede an older copy of the same message (relocation): the ack of the
new copy may sit in the same segment, and the old copy must not outlive it. A segment (never the head) can be
deleted when it holds no live message and every segment it refers to is deleted
too -- otherwise deleting the ack would resurrect the acked message on the next
recovery. State that must outlive its segment (durable subscriptions, idempotency
keys still inside the window) is re-appended to the head segment first; the
journal deletes the files only after that batch is durable -- and, when the store
writes checkpoints, only after a checkpoint that no longer needs them.

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

import itertools
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..message import Message
from . import checkpoint as ckpt
from .dedupe import DedupeWindow
from .journal import MAX_RECORD, Callback, Journal, JournalError
from .pages import INNER, MOVED, PageList, id_hash, pack, segment_of, unpack
from .pages import SEG_SHIFT as _SEG_SHIFT
from .records import (
    Ack,
    Enq,
    Keys,
    Move,
    Record,
    RecordError,
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
_FRAME_HEAD = 8  # the journal's u32 length + u32 crc before each payload
_U32 = struct.Struct("<I")


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


def tx_inner_offsets(payload: bytes | memoryview) -> list[int]:
    """Offsets, within a ``Tx`` record's payload, of each sub-record's u32 length."""
    out: list[int] = []
    n = _U32.unpack_from(payload, 1)[0]
    at = 5
    for _ in range(n):
        out.append(at)
        at += 4 + _U32.unpack_from(payload, at)[0]
    return out


def materialize(payload: bytes, pos: int, destination: str) -> Message:
    """The message of an ``Enq`` payload read back at ``pos`` for ``destination``'s list
    (a ``MOVED`` position: as :meth:`MessageStore.apply` left it after the move)."""
    rec = decode(payload)
    if not isinstance(rec, Enq):
        raise RecordError(f"expected an Enq record at position {pos:#x}, found {type(rec).__name__}")
    m = rec.message
    if pos & MOVED:  # moved at least once since this record: as apply(Move) left it
        m.key = ""
        if not any(k == ORIGINAL_DESTINATION for k, _ in m.headers):
            m.headers = m.headers + ((ORIGINAL_DESTINATION, m.destination),)
        m.destination = destination
    m.segment = segment_of(pos)
    m.pos = pos
    return m


class LiveView(Mapping[str, Message]):
    """Every live message by id, resident or paged (paged ones are read from disk on
    each access: for tests, status pages and small stores)."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store

    def __len__(self) -> int:
        return self._store.count

    def __iter__(self) -> Iterator[str]:
        for m in self._store.iter_messages():
            yield m.id

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._store.find(key) is not None

    def __getitem__(self, key: str) -> Message:
        m = self._store.get(key)
        if m is None:
            raise KeyError(key)
        return m


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
        self.on_space: Callable[[], None] | None = None  # called when ``full`` clears
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
        self._undurable: dict[tuple[str, str], list[Callback]] = {}
        self._listeners: list[StoreListener] = []
        self._compact_due = False
        self._replay_seen: set[int] | None = None  # id hashes of live messages during a full replay
        # non-persistent messages queued among paged ones (page_out), by their key in the list
        self._transient: dict[int, Message] = {}
        self._transient_keys = itertools.count(1)
        self.deleted_segments = 0
        self._opened = False
        self.checkpoints = ckpt.Checkpointer(self, interval=checkpoint_interval, enabled=checkpoints)

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Recover state (from the checkpoint when it is good), truncate a torn tail, start writing."""
        started = time.monotonic()
        how = self.checkpoints.recover()
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
        self.count = 0
        self.subs.clear()
        self._sub_seg.clear()
        self._seg_live.clear()
        self._enqs.clear()
        self._refs.clear()

    def close(self) -> None:
        """Flush everything to disk, write a checkpoint and stop the writer."""
        if self._opened and self.journal.failed is None and self.journal.flush(timeout=30):
            self.checkpoints.at_close()
        self.checkpoints.stop()
        self.journal.close()
        self._opened = False

    def flush(self, timeout: float | None = None) -> bool:
        return self.journal.flush(timeout)

    def add_listener(self, listener: StoreListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: StoreListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # ------------------------------------------------------------------ finding messages
    def find(self, mid: str, destination: str = "") -> Message | tuple[PageList, int] | None:
        """Where live message ``mid`` is: its resident Message, ``(page list, index)``,
        or None. ``destination`` (when known) is searched first, then every list."""
        m = self.resident.get(mid)
        if m is not None:
            return m
        if not self.paged:
            return None
        h = id_hash(mid)
        if self._replay_seen is not None and h not in self._replay_seen:
            return None
        pl = self.paged.get(destination) if destination else None
        if pl is not None:
            i = pl.find(h)
            if i >= 0 and pl.pos[i] >> _SEG_SHIFT:
                return pl, i
        for other in self.paged.values():
            if other is not pl:
                i = other.find(h)
                if i >= 0 and other.pos[i] >> _SEG_SHIFT:
                    return other, i
        return None

    def get(self, mid: str) -> Message | None:
        """Live message ``mid`` (a paged one read back, left paged), or None."""
        where = self.find(mid)
        if where is None or isinstance(where, Message):
            return where
        pl, i = where
        dest = next(d for d, p in self.paged.items() if p is pl)
        pos = pl.pos[i]
        return materialize(self.journal.read([pos])[0], pos, dest)

    def iter_messages(self) -> Iterator[Message]:
        """Every live message: resident ones, then each destination's paged ones in order
        (read back in batches, left paged)."""
        yield from list(self.resident.values())
        for dest, pl in list(self.paged.items()):
            batch: list[int] = []
            for _i, pos, _h, _t in pl.entries():
                if not pos >> _SEG_SHIFT:
                    continue  # a non-persistent message queued in order: not the store's
                batch.append(pos)
                if len(batch) >= 1000:
                    yield from self._read(batch, dest)
                    batch = []
            if batch:
                yield from self._read(batch, dest)

    def _read(self, positions: list[int], destination: str) -> list[Message]:
        """The paged messages at ``positions``; one that cannot be read back (a corrupt
        record: the disk changed under the journal) is logged and left out."""
        try:
            payloads = self.journal.read(positions)
            return [materialize(p, pos, destination) for p, pos in zip(payloads, positions, strict=True)]
        except (JournalError, RecordError):
            if len(positions) == 1:
                raise
        out: list[Message] = []
        for pos in positions:
            try:
                out.append(self._read([pos], destination)[0])
            except (JournalError, RecordError) as exc:
                seg, off, _flags = unpack(pos)
                log.error("store %s: a message of %s at segment %d offset %d cannot be read back (%s): it is lost",
                          self.directory, destination, seg, off, exc)
        return out

    def take(self, destination: str, n: int) -> list[Message]:
        """Make up to ``n`` paged messages of ``destination`` resident, from the front of its
        list; returns them in order (with the non-persistent ones queued among them)."""
        pl = self.paged.get(destination)
        if not pl:
            return []
        entries = pl.popleft(n)
        if not pl:
            del self.paged[destination]
        persisted = [p for p, _h, _t in entries if p >> _SEG_SHIFT]
        read = {m.pos: m for m in self._read(persisted, destination)} if persisted else {}
        out: list[Message] = []
        for pos, _h, _t in entries:
            if not pos >> _SEG_SHIFT:
                out.append(self._transient.pop(unpack(pos)[1]))
                continue
            m = read.get(pos)
            if m is None:  # unreadable: gone (logged)
                self.count -= 1
                self._dec(segment_of(pos))
                continue
            self.resident[m.id] = m
            out.append(m)
        return out

    def page_out(self, message: Message) -> bool:
        """A waiting message leaves memory for the back of its destination's list: a
        persistent one as its journal position; a non-persistent one (not in the journal)
        stays in memory but takes its place in the list, so the queue keeps its order.
        False (nothing done) for a persistent message the store does not hold resident:
        only what the journal holds may wait as a position."""
        if message.persistent:
            if self.resident.get(message.id) is not message:
                return False
            del self.resident[message.id]
            self.page_list(message.destination).append(message.pos, id_hash(message.id), message.timestamp)
            return True
        key = next(self._transient_keys)
        self._transient[key] = message
        self.page_list(message.destination).append(pack(0, key), id_hash(message.id), message.timestamp)
        return True

    def take_ids(self, destination: str, ids: Iterable[str]) -> list[Message]:
        """The paged messages of ``destination`` with these ids, taken out of its list and
        made resident, in list order (an operator's delete or move)."""
        pl = self.paged.get(destination)
        if pl is None:
            return []
        found: list[tuple[int, Message]] = []
        for mid in ids:
            i = pl.find(id_hash(mid))
            if i < 0:
                continue
            pos = pl.pos[i]
            if not pos >> _SEG_SHIFT:  # a non-persistent one, waiting in its place
                m = self._transient[unpack(pos)[1]]
            else:
                try:
                    (m,) = self._read([pos], destination)
                except (JournalError, RecordError):
                    continue  # unreadable: left for dispatch, which logs and drops it
            if m.id != mid:
                continue
            found.append((i, m))
        found.sort(key=lambda e: e[0])
        for i, m in found:
            pos = pl.pos[i]
            pl.remove_at(i)
            if pos >> _SEG_SHIFT:
                self.resident[m.id] = m
            else:
                del self._transient[unpack(pos)[1]]
        if not pl:
            del self.paged[destination]
        return [m for _i, m in found]

    def paged_count(self, destination: str) -> int:
        pl = self.paged.get(destination)
        return len(pl) if pl is not None else 0

    def peek(self, destination: str, start: int, n: int) -> list[Message]:
        """Paged messages ``start`` to ``start + n`` of ``destination``'s list, read back and
        left paged (a browser's page)."""
        pl = self.paged.get(destination)
        if pl is None:
            return []
        out: list[Message] = []
        for k, (_i, pos, _h, _t) in enumerate(pl.entries()):
            if k < start:
                continue
            if len(out) >= n:
                break
            if pos >> _SEG_SHIFT:
                out.extend(self._read([pos], destination))
            else:
                out.append(self._transient[unpack(pos)[1]])
        return out

    def page_list(self, destination: str) -> PageList:
        pl = self.paged.get(destination)
        if pl is None:
            pl = self.paged[destination] = PageList()
        return pl

    # ------------------------------------------------------------------ state folding
    def apply(self, rec: Record, pos: int, payload: bytes | memoryview | None = None, *, keep: bool = False) -> None:
        """Fold one record, written at journal position ``pos`` (its frame: see pages.py),
        into the in-memory state. ``keep``: a new message stays resident (the caller holds
        it) instead of being paged. ``payload`` (the record's bytes) is needed for a
        ``Tx``, to place its messages."""
        seg = segment_of(pos)
        if isinstance(rec, Enq):
            self._apply_enq(rec.message, pos, rec.relocated, keep)
        elif isinstance(rec, Ack):
            for mid in rec.ids:
                where = self.find(mid, rec.destination)
                if where is None:
                    continue
                if isinstance(where, Message):
                    del self.resident[mid]
                    gone = where.segment
                else:
                    pl, i = where
                    gone = segment_of(pl.pos[i])
                    pl.remove_at(i)
                    if self._replay_seen is not None:
                        self._replay_seen.discard(id_hash(mid))
                self.count -= 1
                self._dec(gone)
                if gone != seg:
                    self._refs.setdefault(seg, set()).add(gone)
        elif isinstance(rec, Move):
            self._apply_move(rec, seg)
        elif isinstance(rec, Tx):
            if payload is None:
                payload = encode(rec)
            base = pos & ~0x3 | INNER
            for sub, at in zip(rec.records, tx_inner_offsets(payload), strict=True):
                self.apply(sub, base + ((_FRAME_HEAD + at) << 2), keep=keep)
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

    def _apply_enq(self, m: Message, pos: int, relocated: bool, keep: bool) -> None:
        seg = segment_of(pos)
        m.persistent = True
        old = self.find(m.id, m.destination) if relocated or self._replay_seen is not None else None
        if old is not None:  # a re-written copy (relocation) supersedes the old Enq, in place
            if isinstance(old, Message):
                prev = old.segment
                old.segment, old.pos = seg, pos
            else:
                pl, i = old
                prev = segment_of(pl.pos[i])
                pl.set_pos(i, pos)
            self._dec(prev)
            if prev != seg:
                self._refs.setdefault(seg, set()).add(prev)
        else:
            self.count += 1
            if keep:
                m.segment, m.pos = seg, pos
                self.resident[m.id] = m
            else:
                h = id_hash(m.id)
                self.page_list(m.destination).append(pos, h, m.timestamp)
                if self._replay_seen is not None:
                    self._replay_seen.add(h)
        self._seg_live[seg] = self._seg_live.get(seg, 0) + 1
        self._enqs[seg] = self._enqs.get(seg, 0) + 1
        if m.key:
            self.dedupe.add(m.destination, m.key, m.timestamp, seg)

    def _apply_move(self, rec: Move, seg: int) -> None:
        """A move to another destination: the message loses its idempotency key (the window
        keeps it under the destination it was sent to) and gains the ``original-destination``
        header the first time. A move to where it is changes nothing."""
        where = self.find(rec.id, rec.source)
        if where is None:
            return
        if isinstance(where, Message):
            moved = where
            if moved.destination == rec.destination:
                return
            moved.key = ""
            if not any(k == ORIGINAL_DESTINATION for k, _ in moved.headers):
                moved.headers = moved.headers + ((ORIGINAL_DESTINATION, moved.destination),)
            moved.destination = rec.destination
            moved.wire_cache = None
            moved.pos |= MOVED
            at = moved.segment
        else:
            pl, i = where
            if self.paged.get(rec.destination) is pl:
                return
            pos, h, ts = pl.pos[i], pl.ids[i], pl.ts[i]
            pl.remove_at(i)
            self.page_list(rec.destination).append(pos | MOVED, h, ts)
            at = segment_of(pos)
        if at != seg:
            self._refs.setdefault(seg, set()).add(at)

    def _dec(self, seg: int) -> None:
        n = self._seg_live.get(seg, 0) - 1
        if n > 0:
            self._seg_live[seg] = n
        else:
            self._seg_live.pop(seg, None)
            self._compact_due = True

    def _write(self, records: Sequence[Record], callback: Callback | None, *, keep: bool = True) -> int:
        payloads = [encode(r) for r in records]
        seg, offset = self.journal.append_at(payloads, callback)
        if self.limit and not self.full:
            self._check_limit()
        for rec, payload in zip(records, payloads, strict=True):
            self.apply(rec, pack(seg, offset), payload, keep=keep)
            offset += _FRAME_HEAD + len(payload)
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
        """Persist a newly accepted message (and its idempotency key); it stays resident."""
        cb = self._track_key(message.destination, message.key, callback) if message.key else callback
        if self._listeners:
            self._write([Enq(message)], cb)
            return
        # the commonest record: _write and _apply_enq without their generality
        seg, offset = self.journal.append_at((encode_enq(message),), cb)
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
        (their messages are paged: nobody consumes from a replica)."""
        records = [decode(p) for p in payloads]
        seg, offset = self.journal.append_at(list(payloads), callback)
        for rec, payload in zip(records, payloads, strict=True):
            self.apply(rec, pack(seg, offset), payload)
            offset += _FRAME_HEAD + len(payload)
        self.checkpoints.appended()

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

    # ------------------------------------------------------------------ compaction
    def relocate(self, budget: int) -> int:
        """Re-append the few live messages that pin old segments; returns how many.

        A segment whose live messages are at most a tenth of those written into it
        (e.g. one poison message among thousands consumed) would otherwise stay
        forever -- and with it every later segment holding acks for its messages.
        Their ``Enq`` records are written again into the head segment (same id, same
        content, marked as relocated), which leaves the old segment dead for :meth:`compact`.
        """
        if budget <= 0:
            return 0
        head = self.journal.head
        chosen: set[int] = set()
        total = 0
        for seg in self.journal.segments:
            if seg == head or seg == head - 1:
                continue
            n = self._seg_live.get(seg, 0)
            if not n or n * 10 > self._enqs.get(seg, 0) or total + n > budget:
                continue
            chosen.add(seg)
            total += n
        if not chosen:
            return 0
        moved = [m for m in self.resident.values() if m.segment in chosen]
        for dest, pl in list(self.paged.items()):
            picked = [pos for _i, pos, _h, _t in pl.entries() if segment_of(pos) in chosen]
            if picked:
                moved.extend(self._read(picked, dest))
        moved.sort(key=lambda m: m.timestamp)
        for i in range(0, len(moved), 500):
            self._write([Enq(m, relocated=True) for m in moved[i : i + 500]], None)
        self.relocated += len(moved)
        log.info("store %s: relocated %d long-lived messages out of old segments", self.directory, len(moved))
        return len(moved)

    def compact(self, force: bool = False, relocate: int = 0) -> list[int]:
        """Delete segments that hold nothing still needed; returns their ids.

        ``relocate`` > 0 first moves up to that many long-lived messages out of
        mostly-dead old segments (:meth:`relocate`). With periodic checkpoints the files
        go once a checkpoint that does not need them is written.
        """
        if not self._opened or not (self._compact_due or force or relocate):
            return []
        self._compact_due = False
        if relocate:
            self.relocate(relocate)
        head = self.journal.head
        pending = self.checkpoints.pending_deletes
        candidates = [s for s in self.journal.segments if s != head and s not in pending]
        existing = set(self.journal.segments)
        dead: set[int] = set()
        for seg in candidates:
            if seg in self._seg_live:
                continue
            refs = self._refs.get(seg, ())
            if all(r in dead or r in pending or r not in existing for r in refs):
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
            self._seg_live.pop(seg, None)
            self._enqs.pop(seg, None)
        for refs in self._refs.values():
            refs -= dead
        ordered = sorted(dead)
        self.checkpoints.delete_segments(ordered)
        log.debug(
            "store %s: compaction deletes segments %s (carried %d records)",
            self.directory,
            ordered,
            len(carry),
        )
        return ordered

    def hold_deletes(self) -> None:
        """Delete no segment until :meth:`release_deletes` (a reader of old positions:
        a replica's full sync, :mod:`.sync`); compaction's dead segments wait."""
        self.checkpoints.hold()

    def release_deletes(self) -> None:
        self.checkpoints.release()

    def delete_now(self, segments: Sequence[int]) -> None:
        """Hand dead segments to the journal (after the batch queued before is durable)."""
        for seg in segments:
            self.journal.forget_reader(seg)
        self.journal.delete_segments(segments)
        self.deleted_segments += len(segments)
        self._check_space()
