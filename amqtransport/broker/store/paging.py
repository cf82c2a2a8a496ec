"""Finding live messages, and reading paged ones back: a part of the message store.

Theory of operation
-------------------
Resident and paged. A live message is either *resident* (its
:class:`~..message.Message` is in :attr:`resident`, as the dispatch core holds it) or
*paged*: only its position in the journal, its id hash and its acceptance time, in
its destination's :class:`~.pages.PageList` (:attr:`paged`); :meth:`take` reads paged
messages back, in order, and makes them resident. A message added by the core stays
resident (:meth:`add`); a message the store learns of from its records -- recovery,
a replica's stream -- is paged. :attr:`count` counts both; :attr:`live` is a read-only
mapping over both (reading paged ones from disk: for tests and small stores).

Non-persistent messages queued behind paged ones (the broker's queues page every
message that arrives while a queue has paged ones, so order holds) wait in memory, in
``_transient``, and take their place in the list as a position with no segment
(``pos >> SEG_SHIFT == 0``): :meth:`PagedMessages.take` hands them out in their turn;
records, checkpoints and the full sync skip them (they are not the journal's).

:class:`PagedMessages` is the part of :class:`~.store.MessageStore` that does this,
over the store's state (declared below, set by the store).

A selective scan (dispatch/scan.py) looks at paged messages without making them
resident: :meth:`PagedMessages.scan_batch` gives the next ones the queue's scan has not
passed (the list's :meth:`~.pages.PageList.scan_next`) as their record payloads --
only those whose bytes hold one of the selectors' needles
(:func:`~.records.header_needles`, found by searching the segment's bytes:
:meth:`~.segments.SegmentReads.candidates`) when there are needles. The scan evaluates
those on the record's headers (:func:`record_fields`), then passes them
(:meth:`~PagedMessages.scan_pass`: they stay paged, in their places) or takes one
(:meth:`~PagedMessages.scan_take`: resident, for a consumer that takes it now).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from ..dispatch.message import Message
from ..dispatch.priority import DEFAULT_PRIORITY, priority_of
from .fanout import ORIGINAL_DESTINATION, fan_copy
from .journal import Journal, JournalError
from .pages import MOVED, SEG_SHIFT, PageList, id_hash, pack, segment_of, unpack
from .records import Enq, Fan, RecordError, decode, enq_fields

__all__ = ["PagedMessages", "LiveView", "materialize", "record_fields", "ORIGINAL_DESTINATION"]

log = logging.getLogger(__name__)

_SEG_SHIFT = SEG_SHIFT


def materialize(payload: bytes, pos: int, destination: str) -> Message:
    """The message of an ``Enq`` payload read back at ``pos`` for ``destination``'s list
    (a ``MOVED`` position: as :meth:`MessageStore.apply` left it after the move); of a
    ``Fan`` payload, the copy that ``destination`` holds (:mod:`.fanout`)."""
    rec = decode(payload)
    if isinstance(rec, Fan):
        m = fan_copy(rec.message, destination)
    elif isinstance(rec, Enq):
        m = rec.message
    else:
        raise RecordError(f"expected an Enq record at position {pos:#x}, found {type(rec).__name__}")
    if pos & MOVED:  # moved at least once since this record: as apply(Move) left it
        m.key = ""
        if not any(k == ORIGINAL_DESTINATION for k, _ in m.headers):
            m.headers = m.headers + ((ORIGINAL_DESTINATION, m.destination),)
        m.destination = destination
    m.segment = segment_of(pos)
    m.pos = pos
    return m


def record_fields(payload: bytes, pos: int, destination: str) -> tuple[str, str, tuple[tuple[str, str], ...], float, int]:
    """``(id, destination, headers, timestamp, delivery count)`` of the message
    :func:`materialize` would read back, without the message (a plain ``Enq``: only its
    id, destination and headers are decoded)."""
    if not pos & MOVED:
        fields = enq_fields(payload)
        if fields is not None:
            return fields
    m = materialize(payload, pos, destination)
    return m.id, m.destination, m.headers, m.timestamp, m.delivery_count


class LiveView(Mapping[str, Message]):
    """Every live message by id, resident or paged (paged ones are read from disk on
    each access: for tests, status pages and small stores)."""

    def __init__(self, store: PagedMessages) -> None:
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


class PagedMessages:
    """Where each live message is, resident or paged; reading paged ones back."""

    # the store's state (set by MessageStore.__init__)
    directory: Path
    journal: Journal
    resident: dict[str, Message]
    paged: dict[str, PageList]
    count: int
    _transient: dict[int, Message]
    _transient_keys: Iterator[int]
    unreadable: int  # live messages found unreadable when read back (paging, a replica's full sync)
    _replay_seen: set[int] | None
    _dec: Callable[[int], None]  # a message is gone from its segment (compaction accounting)

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
            self.journal.check_soon()  # the data directory gone? that fences at once (guard.py)
            if len(positions) == 1:
                raise
        out: list[Message] = []
        for pos in positions:
            try:
                out.append(self._read([pos], destination)[0])
            except (JournalError, RecordError) as exc:
                self.unreadable_message(pos, destination, exc, "it is lost")
        return out

    def unreadable_message(self, pos: int, destination: str, error: Exception, consequence: str) -> None:
        """A live message of ``destination`` at ``pos`` cannot be read back (a corrupt
        record: the disk changed under the journal): log it at ERROR with what follows,
        count it (``amq_store_unreadable_messages_total``), have the journal check its disk."""
        seg, off, _flags = unpack(pos)
        self.unreadable += 1
        log.error("store %s: a message of %s at segment %d offset %d cannot be read back (%s): %s",
                  self.directory, destination, seg, off, error, consequence)
        self.journal.check_soon()

    def take(self, destination: str, n: int, *, by_priority: bool = False) -> list[Message]:
        """Make up to ``n`` paged messages of ``destination`` resident, from the front of its
        list (``by_priority``: highest priority first, FIFO within a priority); returns them
        in that order (with the non-persistent ones queued among them)."""
        pl = self.paged.get(destination)
        if not pl:
            return []
        if by_priority:
            if pl.unknown:
                self._learn_priorities(pl, destination)
            entries = pl.take_top(n)
        else:
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

    # ------------------------------------------------------------------ a selective scan
    def scan_batch(self, destination: str, n: int, *, by_priority: bool, needles: Sequence[bytes] | None,
                   ) -> tuple[list[tuple[int, int, int, bytes | Message | None]], tuple[int, int] | None]:
        """The next ``n`` paged messages of ``destination`` its scan has not passed, left
        paged: ``(candidates, end)``. ``end`` is ``(index, priority)`` just past the last
        one looked at (None: none left), for :meth:`scan_pass` once the batch is done.
        ``candidates`` are ``(index, pos, priority, payload)``, the payload the record's
        bytes -- or the Message of a non-persistent one waiting in its place, or None when
        the record cannot be read back (:meth:`scan_take` then logs and drops it). With
        ``needles``, only the records holding one of them are candidates (the others are
        misses, never read one by one: :meth:`~.segments.SegmentReads.candidates`)."""
        pl = self.paged.get(destination)
        if not pl:
            return [], None
        if by_priority and pl.unknown:
            self._learn_priorities(pl, destination)
        slots = pl.scan_next(n, by_priority=by_priority)
        if not slots:
            return [], None
        pri = pl.pri
        last = slots[-1][0]
        end = (last + 1, pri[last])
        if needles is not None:
            persisted = [k for k, (_i, pos) in enumerate(slots) if pos >> _SEG_SHIFT]
            keep = set(persisted[k] for k in self.journal.candidates([slots[k][1] for k in persisted], needles))
            slots = [e for k, e in enumerate(slots) if k in keep or not e[1] >> _SEG_SHIFT]
        persisted_pos = [pos for _i, pos in slots if pos >> _SEG_SHIFT]
        payloads: dict[int, bytes | None] = {}
        if persisted_pos:
            try:
                payloads = dict(zip(persisted_pos, self.journal.read(persisted_pos), strict=True))
            except JournalError:
                self.journal.check_soon()
                payloads = {pos: self._payload_or_none(pos) for pos in persisted_pos}
        transient = self._transient
        return ([(i, pos, pri[i], payloads[pos] if pos >> _SEG_SHIFT else transient[unpack(pos)[1]])
                 for i, pos in slots], end)

    def scan_pass(self, destination: str, i: int, p: int) -> None:
        """Every message :meth:`scan_batch` gave before slot ``i`` of priority ``p`` of
        ``destination``'s list stays paged (``i`` may be one past the last)."""
        self.paged[destination].passed_to(i, p)

    def scan_take(self, destination: str, i: int, payload: bytes | Message | None) -> Message | None:
        """Make slot ``i`` (the next of :meth:`scan_batch`, with what it gave) resident and
        return its message; None when its record cannot be read back (logged, gone)."""
        pos, _h, _t = self.paged[destination].take_at(i)
        if isinstance(payload, Message):  # a non-persistent one
            del self._transient[unpack(pos)[1]]
            return payload
        try:
            if payload is None:
                raise JournalError("the record could not be read")
            m = materialize(payload, pos, destination)
        except (JournalError, RecordError) as exc:
            self.unreadable_message(pos, destination, exc, "it is lost")
            self.count -= 1
            self._dec(segment_of(pos))
            return None
        self.resident[m.id] = m
        return m

    def scan_end(self, destination: str) -> None:
        """The scan of ``destination`` stopped (for now)."""
        pl = self.paged.get(destination)
        if pl is not None:
            pl.scan_end()
            if not pl:
                del self.paged[destination]

    def scan_top(self, destination: str) -> int:
        """The highest priority among ``destination``'s paged messages its by-priority scan
        has not passed (:meth:`paged_top` while no scan is on), -1 when none."""
        pl = self.paged.get(destination)
        return pl.scan_top() if pl is not None else -1

    def rescan(self, destination: str) -> None:
        """``destination``'s consumers changed: its next scan starts at the front."""
        pl = self.paged.get(destination)
        if pl is not None:
            pl.rescan()

    def paged_top(self, destination: str) -> int:
        """The highest priority among ``destination``'s paged messages (9 while some are not
        known yet), -1 when none is paged."""
        pl = self.paged.get(destination)
        return pl.top_priority() if pl is not None else -1

    def _learn_priorities(self, pl: PageList, destination: str) -> None:
        """Read back the paged messages whose priority the list does not know (it was loaded
        from a checkpoint) and note each one's: once per message, a batch at a time. One that
        cannot be read back gets the default (dispatch reads it again, logs and drops it)."""
        slots = pl.unknown_slots()
        for k in range(0, len(slots), 1000):
            batch = slots[k : k + 1000]
            positions = [pl.pos[i] for i in batch]
            try:
                payloads: list[bytes | None] = list(self.journal.read(positions))
            except JournalError:
                payloads = [self._payload_or_none(pos) for pos in positions]
            for i, pos, payload in zip(batch, positions, payloads, strict=True):
                p = DEFAULT_PRIORITY
                if payload is not None:
                    try:
                        p = priority_of(materialize(payload, pos, destination))
                    except RecordError:
                        pass
                pl.set_priority(i, p)

    def _payload_or_none(self, pos: int) -> bytes | None:
        try:
            return self.journal.read([pos])[0]
        except JournalError:
            return None

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
            self.page_list(message.destination).append(
                message.pos, id_hash(message.id), message.timestamp, priority_of(message))
            return True
        key = next(self._transient_keys)
        self._transient[key] = message
        self.page_list(message.destination).append(
            pack(0, key), id_hash(message.id), message.timestamp, priority_of(message))
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
