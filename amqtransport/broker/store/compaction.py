"""Compaction: deleting the journal's segments that hold nothing still needed, and the
store limit that waits for it -- a part of the message store.

Theory of operation
-------------------
Compaction accounting. For every segment the store keeps the number of live
messages whose ``Enq`` record it holds (a topic message's ``Fan`` record counts once
per live copy, so it stays until the last subscription has acked its copy:
:mod:`.fanout`), and the set of *older* segments that its
``Ack``/``Move``/``Unsub`` records refer to -- and that its ``Enq`` records refer to
when they supersede an older copy of the same message (relocation): the ack of the
new copy may sit in the same segment, and the old copy must not outlive it. A segment (never the head) can be
deleted when it holds no live message and every segment it refers to is deleted
too -- otherwise deleting the ack would resurrect the acked message on the next
recovery. State that must outlive its segment (durable subscriptions, idempotency
keys still inside the window) is re-appended to the head segment first; the
journal deletes the files only after that batch is durable -- and, when the store
writes checkpoints, only after a checkpoint that no longer needs them.

Carried keys. The keys still in the window of the segments compaction deletes are
re-written in a segment of their own (``Journal.append_at(alone=True)``): no message
is in it, so no ack refers to it, and keeping it until most of its keys left the
window (:meth:`Compaction._kept_for_keys`) holds back nothing else. Carried into the head
among the traffic, as before, they made that segment mostly keys, kept for the whole
window (600 s in the nemesis), and the acks of its messages kept every segment after it.

Relocation. The refs rule chains: a segment with live messages keeps the next one (its
acks refer back), which keeps the one after, and so on, so one backlog nobody consumes
would keep every later segment, however dead (a shared store grew 0.37 MiB a nemesis
round until its disk was full). :meth:`Compaction.relocate` re-writes live messages into
the head so their old segments die: those of a segment at most a tenth live (a poison
message among thousands consumed), and those of every segment with live messages once
the dead segments kept behind them reach :data:`HOLD_BACK` times their bytes -- so the
journal stays within a few times its live data, and the rewriting costs at most a
:data:`HOLD_BACK`-th of the bytes it frees.

Store limit (ActiveMQ's ``storeUsage``). With ``store_limit`` > 0 the store sets
:attr:`MessageStore.full` once the journal's segments reach that many bytes; the
connection handler then holds persistent SENDs (producer flow control) or refuses them
(``send_fail_if_no_space``). Only compaction frees space: it clears the flag when the
journal is down to ``store_low_water`` x the limit and calls ``on_space``. ACKs and
other records are still written while the store is full (they are what frees it).

:class:`Compaction` is the part of :class:`~.store.MessageStore` that does this, over
the store's state (declared below, set by the store).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Protocol

from ..dispatch.message import Message
from .dedupe import DedupeWindow
from .journal import Journal
from .pages import PageList, segment_of
from .records import Enq, Keys, Sub

__all__ = ["Compaction", "KEYS_PER_RECORD", "SegmentDeletes"]

log = logging.getLogger(__name__)

KEYS_PER_RECORD = 5000
#: relocate every segment that still holds live messages once the dead segments kept
#: behind them (by acks that refer back) are this many times the bytes of those messages
HOLD_BACK = 4


class SegmentDeletes(Protocol):
    """Who deletes dead segments, and when (the store's :class:`~.checkpoint.Checkpointer`)."""

    @property
    def pending_deletes(self) -> Collection[int]: ...

    def delete_segments(self, segments: Sequence[int]) -> None: ...

    def hold(self) -> None: ...

    def release(self) -> None: ...

    def retry_due(self) -> None: ...


class Compaction:
    """Segment accounting, relocation, compaction, the store limit."""

    # the store's state (set by MessageStore.__init__)
    directory: Path
    journal: Journal
    checkpoints: SegmentDeletes
    dedupe: DedupeWindow
    resident: dict[str, Message]
    paged: dict[str, PageList]
    subs: dict[str, Sub]
    limit: int
    low_water: float
    full: bool
    full_since: float | None
    on_space: Callable[[], None] | None
    relocated: int
    deleted_segments: int
    _sub_seg: dict[str, int]
    _seg_live: dict[int, int]
    _enqs: dict[int, int]
    _refs: dict[int, set[int]]
    _named: dict[int, set[int]]
    _compact_due: bool
    _holdback_next: int  # journal.appended_bytes at which _holding_back looks again (0: at once)
    _opened: bool
    diverged: BaseException | None  # an apply failed after its append (store.py): the counts may be short
    _read: Callable[[list[int], str], list[Message]]
    _write: Callable[..., int]

    def _dec(self, seg: int) -> None:
        n = self._seg_live.get(seg, 0) - 1
        if n > 0:
            self._seg_live[seg] = n
        else:
            self._seg_live.pop(seg, None)
            self._compact_due = True

    # ------------------------------------------------------------------ store limit
    def _check_limit(self) -> None:
        if self.journal.size >= self.limit:
            self.full = True
            self.full_since = time.monotonic()
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
            self.full_since = None
            log.warning(
                "store %s: journal down to %d bytes: producer flow control released", self.directory, self.journal.size
            )
            if self.on_space is not None:
                self.on_space()

    # ------------------------------------------------------------------ compaction
    def relocate(self, budget: int) -> int:
        """Re-append the few live messages that pin old segments; returns how many.

        A segment whose live messages are at most a tenth of those written into it
        (e.g. one poison message among thousands consumed) would otherwise stay
        forever -- and with it every later segment holding acks for its messages.
        So would segments with more of them (a backlog nobody takes yet, spread over
        the small segments a shared store starts at each takeover) with every dead
        segment behind them: those go too once what they hold back is :data:`HOLD_BACK`
        times their live bytes (:meth:`_holding_back`), so the journal stays within a
        few times its live data. Their ``Enq`` records are written again into the head
        segment (same id, same content, marked as relocated), which leaves the old
        segment dead for :meth:`compact`.
        """
        if budget <= 0:
            return 0
        head = self.journal.head
        holding = self._holding_back(head)
        chosen: set[int] = set()
        total = 0
        for seg in self.journal.segments:
            if seg == head or seg == head - 1:
                continue
            n = self._seg_live.get(seg, 0)
            if not n or (n * 10 > self._enqs.get(seg, 0) and seg not in holding) or total + n > budget:
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

    def _holding_back(self, head: int) -> set[int]:
        """The segments with live messages, when the dead segments that cannot be deleted
        (acks in them refer back to live ones) are at least :data:`HOLD_BACK` times the
        live messages' bytes (estimated: a segment's bytes x its live share); else none.
        Evaluated once a segment's worth was appended since the last time (counted in
        bytes appended, not in the journal's size: after a big free the size stays below
        a mark set at its old peak, and the next look waited until it was back there)."""
        appended = self.journal.appended_bytes
        if appended < self._holdback_next:
            return set()
        self._holdback_next = appended + self.journal.segment_size
        pending = self.checkpoints.pending_deletes
        candidates = [s for s in self.journal.segments if s != head and s not in pending]
        keys_bytes = self._keys_bytes(candidates)
        sizes = self.journal.segment_sizes()
        dead = self._dead(candidates, set(self.journal.segments), pending, keys_bytes, sizes)
        live: set[int] = set()
        live_bytes = kept = 0
        for seg in candidates:
            n = self._seg_live.get(seg, 0)
            if n:
                if seg != head - 1:
                    live.add(seg)
                    live_bytes += sizes.get(seg, 0) * n // max(self._enqs.get(seg, 0), n)
            elif seg not in dead and not self._kept_for_keys(seg, keys_bytes, sizes):
                kept += sizes.get(seg, 0)
        return live if live and kept >= HOLD_BACK * max(live_bytes, 1) else set()

    def _dead(self, candidates: Sequence[int], existing: set[int], pending: Collection[int],
              keys_bytes: dict[int, int], sizes: dict[int, int]) -> set[int]:
        """Of ``candidates`` (in order), those compaction may delete: no live message, not
        carried keys still mostly in the window, and every segment it refers to goes too."""
        dead: set[int] = set()
        for seg in candidates:
            if seg in self._seg_live:
                continue
            if self._kept_for_keys(seg, keys_bytes, sizes):
                continue
            refs = self._refs.get(seg, ())
            if all(r in dead or r in pending or r not in existing for r in refs):
                dead.add(seg)
        return dead

    def compact(self, force: bool = False, relocate: int = 0) -> list[int]:
        """Delete segments that hold nothing still needed; returns their ids.

        ``relocate`` > 0 first moves up to that many long-lived messages out of
        mostly-dead old segments (:meth:`relocate`). With periodic checkpoints the files
        go once a checkpoint that does not need them is written.
        """
        if not self._opened or self.diverged is not None:  # dead by a state behind the journal: maybe not
            return []
        self.checkpoints.retry_due()  # a failed checkpoint's deletes, once its back-off is over
        if not (self._compact_due or force or relocate):
            return []
        self._compact_due = False
        if relocate:
            self.relocate(relocate)
        head = self.journal.head
        pending = self.checkpoints.pending_deletes
        candidates = [s for s in self.journal.segments if s != head and s not in pending]
        existing = set(self.journal.segments)
        dead = self._dead(candidates, existing, pending, self._keys_bytes(candidates), self.journal.segment_sizes())
        if not dead:
            return []
        keys = self.dedupe.in_segments(dead)
        carried = [Keys(tuple(keys[i : i + KEYS_PER_RECORD])) for i in range(0, len(keys), KEYS_PER_RECORD)]
        if carried:  # a segment of their own: no message there, so no ack ever refers to it
            self._write(carried, None, alone=True)
        subs = [sub for q, sub in self.subs.items() if self._sub_seg.get(q) in dead]
        if subs:
            self._write(subs, None)
        for seg in dead:
            self._refs.pop(seg, None)
            self._seg_live.pop(seg, None)
            self._enqs.pop(seg, None)
            self._named.pop(seg, None)
        for refs in self._refs.values():
            refs -= dead
        ordered = sorted(dead)
        self.checkpoints.delete_segments(ordered)
        log.debug(
            "store %s: compaction deletes segments %s (carried %d keys records, %d subscriptions)",
            self.directory,
            ordered,
            len(carried),
            len(subs),
        )
        return ordered

    def _keys_bytes(self, segments: Collection[int]) -> dict[int, int]:
        """About how many bytes the idempotency keys still in the window that ``segments``
        carry would take when re-written (at least what a ``Keys`` record of them takes)."""
        return self.dedupe.bytes_in_segments(segments)

    def _kept_for_keys(self, seg: int, keys_bytes: dict[int, int], sizes: dict[int, int]) -> bool:
        """A segment of carried keys (no ``Enq`` in it) whose keys still in the window are
        more than half its bytes stays: carrying them again would re-write most of it,
        and a fresh one would be carried again at once -- the whole window re-written
        on every pass, megabytes a second with no traffic at all (a 64 MiB data disk
        filled in 17 s). Kept, it holds back no other segment (nothing refers to it);
        once half its keys have left the window the rest is carried, at most half of it."""
        return not self._enqs.get(seg) and keys_bytes.get(seg, 0) * 2 > sizes.get(seg, 0)

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
