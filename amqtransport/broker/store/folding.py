"""The record stream folded into the store's state: :meth:`RecordFolding.apply`.

Theory of operation
-------------------
State is a pure function of the record stream: recovery (records read back from
segments), a replica (records received from a master) and the store's own mutations
(:mod:`.store`: encode, append, apply, announce) all fold each record in here, so a
store can always be rebuilt from a stream of records. A record finds the message it
names by id: a resident one in a dict, a paged one by its id hash in the list of the
destination the record names (``Ack`` and ``Move`` carry it; records of older versions
do not, and then every list is searched). Each fold also keeps the counts compaction
decides by (:mod:`.compaction`): the live messages whose ``Enq`` a segment holds, and
the older segments a segment's records cancel something in (a segment holding an
``Ack``, a ``Move`` or an ``Unsub`` is kept until the segment of what it cancels is
gone: else a replay would bring that back).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from ..dispatch.message import Message
from ..dispatch.priority import priority_of
from .dedupe import DedupeWindow
from .fanout import ref_hash
from .pages import INNER, MOVED, PageList, id_hash, segment_of
from .paging import ORIGINAL_DESTINATION
from .records import Ack, Enq, Fan, Keys, Move, Record, Sub, Tx, Unsub, encode
from .segments import FRAME_HEAD

__all__ = ["FRAME_HEAD", "RecordFolding", "tx_inner_offsets"]

_U32 = struct.Struct("<I")


def tx_inner_offsets(payload: bytes | memoryview) -> list[int]:
    """Offsets, within a ``Tx`` record's payload, of each sub-record's u32 length."""
    out: list[int] = []
    n = _U32.unpack_from(payload, 1)[0]
    at = 5
    for _ in range(n):
        out.append(at)
        at += 4 + _U32.unpack_from(payload, at)[0]
    return out


class RecordFolding:
    """The store's :meth:`apply` (the module docstring); a part of
    :class:`~.store.MessageStore`."""

    dedupe: DedupeWindow
    resident: dict[str, Message]
    paged: dict[str, PageList]
    count: int
    subs: dict[str, Sub]
    _sub_seg: dict[str, int]
    _seg_live: dict[int, int]
    _enqs: dict[int, int]
    _refs: dict[int, set[int]]
    _ref_names: dict[int, str]
    _ref_of: dict[str, int]
    _replay_seen: set[int] | None
    find: Callable[..., Message | tuple[PageList, int] | None]
    page_list: Callable[[str], PageList]
    _dec: Callable[[int], None]
    _apply_fan: Callable[[Fan, int, bool], None]

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
                self.apply(sub, base + ((FRAME_HEAD + at) << 2), keep=keep)
        elif isinstance(rec, Keys):
            for scope, key, ts in rec.keys:
                self.dedupe.add(scope, key, ts, seg)
        elif isinstance(rec, Fan):
            self._apply_fan(rec, pos, keep)
        elif isinstance(rec, Sub):
            self.subs[rec.queue] = rec
            self._sub_seg[rec.queue] = seg
            self._ref_names.setdefault(ref_hash(rec.queue), rec.queue)
        elif isinstance(rec, Unsub):
            self.subs.pop(rec.queue, None)
            self._ref_of.pop(rec.queue, None)
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
                self.page_list(m.destination).append(pos, h, m.timestamp, priority_of(m))
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
            pos, h, ts, pri = pl.pos[i], pl.ids[i], pl.ts[i], pl.pri[i]
            pl.remove_at(i)
            self.page_list(rec.destination).append(pos | MOVED, h, ts, pri)
            at = segment_of(pos)
        if at != seg:
            self._refs.setdefault(seg, set()).add(at)
