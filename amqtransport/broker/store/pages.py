"""Paged messages: where a live message lives in the journal, in a few bytes.

Theory of operation
-------------------
A persistent message does not have to stay in memory to stay live: its ``Enq`` record
is in the journal, so its *position* there is enough to read it back. A
:class:`PageList` is one destination's sequence of such messages, in order, kept in
three parallel arrays of 8-byte numbers (24 bytes a message, where a
:class:`~..message.Message` with its strings costs a kilobyte):

* ``pos``: the record's position (:func:`pack`): segment id, byte offset in the
  segment, and two flags: ``INNER`` (the ``Enq`` sits inside a transaction's record,
  behind a 4-byte length instead of the journal's 8-byte frame) and ``MOVED`` (a
  ``Move`` record moved the message after its ``Enq`` was written: read back, it gets
  this list's destination, the ``original-destination`` header if it has none, and no
  idempotency key -- what :meth:`MessageStore.apply` does to a moved message);
* ``ids``: a 64-bit hash of the message id (:func:`id_hash`), how ``Ack`` and ``Move``
  records find the message (0 marks a removed slot);
* ``ts``: its acceptance time, which orders a destination after recovery;
* ``pri``: its JMS priority, one byte (:data:`UNKNOWN` when the list was loaded from a
  checkpoint, which does not hold it: the store reads those messages' headers back
  once, the first time the queue pages in by priority; :data:`HOLE` for a removed slot).

Priority. A prioritized queue takes its paged messages highest priority first, FIFO
within a priority (:meth:`take_top`), not from the front: ten cursors, one per
priority, each the index up to which that priority has been taken, and
``bytearray.find`` from there finds the next one at C speed, so taking a window costs
about what :meth:`popleft` costs, however the priorities are mixed. ``counts`` per
priority give :attr:`top`, the highest priority paged, which dispatch compares with its
resident front. Taking from the middle leaves holes behind the front; once they
outnumber the live slots (and 4096), the arrays are rebuilt without them.

Messages are taken from the front (``head`` moves on; the arrays are shifted down
only once the dead front is large) and appended at the back; a removal in the middle
(an ack out of order, a move) leaves a *hole* (``pos`` and ``ids`` set to 0) that
the front skips. :meth:`find` is ``array.index`` from the front, at C speed: acks
come for the messages a consumer was given first, so the search is short. A 64-bit
hash of the id is not the id: two live ids with the same hash would make one ack
remove the other, a chance of about ``n / 2**64`` per ack with ``n`` messages paged
(below the journal's CRC32 letting a corrupt frame through).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from hashlib import blake2b

__all__ = ["PageList", "id_hash", "pack", "unpack", "segment_of", "INNER", "MOVED", "FLAGS", "SEG_SHIFT",
           "UNKNOWN", "HOLE"]

INNER = 1  # the Enq is inside a Tx record: a u32 length before it, no frame, no own CRC
MOVED = 2  # a Move came after the Enq record (see the module docstring)
FLAGS = INNER | MOVED
_OFFSET_BITS = 36  # offsets below 64 GiB
_SEG_SHIFT = _OFFSET_BITS + 2
SEG_SHIFT = _SEG_SHIFT  # pos >> SEG_SHIFT is the segment (0: no segment, see MessageStore.page_out)
UNKNOWN = 10  # ``pri`` of a slot whose priority is not known yet (loaded from a checkpoint)
HOLE = 11  # ``pri`` of a removed slot
_HOLES_MIN = 4096  # holes behind the front tolerated before the arrays are rebuilt


def pack(seg: int, offset: int, flags: int = 0) -> int:
    """The 64-bit position of a record: ``seg << 38 | offset << 2 | flags``."""
    return (seg << _SEG_SHIFT) | (offset << 2) | flags


def unpack(pos: int) -> tuple[int, int, int]:
    """``(segment, offset, flags)`` of a position."""
    return pos >> _SEG_SHIFT, (pos >> 2) & ((1 << _OFFSET_BITS) - 1), pos & FLAGS


def segment_of(pos: int) -> int:
    return pos >> _SEG_SHIFT


def id_hash(message_id: str) -> int:
    """A non-zero 64-bit hash of a message id, the same in every process."""
    h = int.from_bytes(blake2b(message_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
    return h or 1


class PageList:
    """One destination's paged messages in order. See the module docstring."""

    __slots__ = ("pos", "ids", "ts", "pri", "head", "live", "ordered", "_last_ts", "counts", "top", "_cur")

    def __init__(self) -> None:
        self.pos = array("Q")
        self.ids = array("Q")
        self.ts = array("d")
        self.pri = bytearray()
        self.head = 0  # index of the first slot that may be live
        self.live = 0  # slots from head on that are not holes
        self.ordered = True  # appended in non-decreasing acceptance time
        self._last_ts = float("-inf")
        self.counts = [0] * (UNKNOWN + 1)  # live slots per priority (and UNKNOWN)
        self.top = -1  # the highest priority paged (9 while some are UNKNOWN), -1: none
        self._cur = [0] * 10  # per priority: every slot of it before this index is taken

    def __len__(self) -> int:
        return self.live

    def __bool__(self) -> bool:
        return self.live > 0

    def append(self, pos: int, idh: int, ts: float, pri: int = UNKNOWN) -> None:
        self.pos.append(pos)
        self.ids.append(idh)
        self.ts.append(ts)
        self.pri.append(pri)
        self.counts[pri] += 1
        top = 9 if pri == UNKNOWN else pri
        if top > self.top:
            self.top = top
        self.live += 1
        if ts < self._last_ts:
            self.ordered = False
        else:
            self._last_ts = ts

    @property
    def unknown(self) -> int:
        """Live slots whose priority is not known (:meth:`set_priority` them before :meth:`take_top`)."""
        return self.counts[UNKNOWN]

    def unknown_slots(self) -> list[int]:
        """Indexes of the live slots of unknown priority, front to back."""
        out: list[int] = []
        pri, i = self.pri, self.head
        while (i := pri.find(UNKNOWN, i)) >= 0:
            out.append(i)
            i += 1
        return out

    def set_priority(self, i: int, p: int) -> None:
        """Slot ``i`` (of unknown priority) has priority ``p``."""
        old = self.pri[i]
        if old == HOLE or old == p:
            return
        self.counts[old] -= 1
        self.counts[p] += 1
        self.pri[i] = p
        if i < self._cur[p]:
            self._cur[p] = i
        self._fix_top()

    def _fix_top(self) -> None:
        counts = self.counts
        if counts[UNKNOWN]:
            self.top = 9
            return
        top = 9
        while top >= 0 and not counts[top]:
            top -= 1
        self.top = top

    def _drop(self, i: int) -> None:
        """Slot ``i`` (live) becomes a hole; ``live`` and ``top`` are the caller's."""
        self.counts[self.pri[i]] -= 1
        self.pri[i] = HOLE
        self.pos[i] = 0
        self.ids[i] = 0

    def find(self, idh: int) -> int:
        """The index of the live slot holding id hash ``idh``, or -1."""
        try:
            return self.ids.index(idh, self.head)
        except ValueError:
            return -1

    def remove_at(self, i: int) -> None:
        """Make slot ``i`` a hole."""
        if self.ids[i]:
            self._drop(i)
            self.live -= 1
            self._fix_top()
            self._skip_holes()

    def _skip_holes(self) -> None:
        pos, n, head = self.pos, len(self.pos), self.head
        while head < n and not pos[head]:
            head += 1
        self.head = head
        if head == n:
            self._reset()
        elif head >= _HOLES_MIN and head * 2 >= n:
            del self.pos[:head]
            del self.ids[:head]
            del self.ts[:head]
            del self.pri[:head]
            self._cur = [max(0, c - head) for c in self._cur]
            self.head = 0

    def _reset(self) -> None:
        del self.pos[:]
        del self.ids[:]
        del self.ts[:]
        del self.pri[:]
        self.head = 0
        self.live = 0
        self.ordered = True
        self._last_ts = float("-inf")
        self.counts = [0] * (UNKNOWN + 1)
        self.top = -1
        self._cur = [0] * 10

    def popleft(self, n: int) -> list[tuple[int, int, float]]:
        """Take up to ``n`` live messages from the front: ``(pos, id hash, ts)`` each."""
        out: list[tuple[int, int, float]] = []
        pos, ids, ts, pri, counts = self.pos, self.ids, self.ts, self.pri, self.counts
        i, end = self.head, len(pos)
        while i < end and len(out) < n:
            p = pos[i]
            if p:
                out.append((p, ids[i], ts[i]))
                counts[pri[i]] -= 1
                pri[i] = HOLE
            i += 1
        self.live -= len(out)
        self.head = i
        self._fix_top()
        self._skip_holes()
        return out

    def take_top(self, n: int) -> list[tuple[int, int, float]]:
        """Take up to ``n`` live messages, highest priority first, FIFO within a priority:
        ``(pos, id hash, ts)`` each. Every slot's priority must be known (``unknown == 0``)."""
        if self.counts[UNKNOWN]:
            raise ValueError("take_top: some paged messages' priorities are not known yet")
        out: list[tuple[int, int, float]] = []
        pos, ids, ts, pri, counts, cur = self.pos, self.ids, self.ts, self.pri, self.counts, self._cur
        head = self.head
        for p in range(9, -1, -1):
            left = counts[p]
            if not left:
                continue
            i = max(cur[p], head)
            while left and len(out) < n:
                i = pri.find(p, i)
                out.append((pos[i], ids[i], ts[i]))
                pri[i] = HOLE
                pos[i] = 0
                ids[i] = 0
                left -= 1
                i += 1
            counts[p] = left
            cur[p] = i
            if len(out) >= n:
                break
        self.live -= len(out)
        self._fix_top()
        self._skip_holes()
        if self.live and len(self.pos) - self.head - self.live > max(_HOLES_MIN, self.live):
            self._rebuild()
        return out

    def _rebuild(self) -> None:
        """The same live slots, in order, without the holes between them."""
        keep = [i for i in range(self.head, len(self.pos)) if self.pos[i]]
        pos, ids, ts, pri = self.pos, self.ids, self.ts, self.pri
        self.pos = array("Q", [pos[i] for i in keep])
        self.ids = array("Q", [ids[i] for i in keep])
        self.ts = array("d", [ts[i] for i in keep])
        self.pri = bytearray(pri[i] for i in keep)
        self.head = 0
        self._cur = [0] * 10

    def peek(self, n: int) -> list[tuple[int, int, float]]:
        """Up to ``n`` live messages from the front, left in place."""
        out: list[tuple[int, int, float]] = []
        pos, ids, ts = self.pos, self.ids, self.ts
        for i in range(self.head, len(pos)):
            if len(out) >= n:
                break
            if pos[i]:
                out.append((pos[i], ids[i], ts[i]))
        return out

    def entries(self) -> Iterator[tuple[int, int, int, float]]:
        """``(index, pos, id hash, ts)`` of every live slot, front to back."""
        pos, ids, ts = self.pos, self.ids, self.ts
        for i in range(self.head, len(pos)):
            p = pos[i]
            if p:
                yield i, p, ids[i], ts[i]

    def set_pos(self, i: int, pos: int) -> None:
        self.pos[i] = pos

    def arrays(self) -> tuple[array[int], array[int], array[float]]:
        """Copies of the live region (holes included), for a checkpoint."""
        h = self.head
        return self.pos[h:], self.ids[h:], self.ts[h:]

    @classmethod
    def from_arrays(cls, pos: array[int], ids: array[int], ts: array[float], *, ordered: bool) -> PageList:
        """A list holding these slots (holes allowed), as :meth:`arrays` gave them, their
        priorities :data:`UNKNOWN`; ``ordered``: their times do not decrease."""
        pl = cls()
        pl.pos, pl.ids, pl.ts = pos, ids, ts
        pl.pri = bytearray(UNKNOWN if p else HOLE for p in pos)
        pl.live = len(pos) - pos.count(0)
        pl.counts[UNKNOWN] = pl.live
        pl.top = 9 if pl.live else -1
        pl.ordered = ordered
        pl._last_ts = max(ts) if len(ts) else float("-inf")
        pl._skip_holes()
        return pl

    def sort(self) -> None:
        """Order the live slots by acceptance time, stably (recovery's order)."""
        items = sorted(((t, i, p, h, self.pri[i]) for i, p, h, t in self.entries()), key=lambda e: e[0])
        self._reset()
        for t, _i, p, h, r in items:
            self.append(p, h, t, r)
        self.ordered = True
