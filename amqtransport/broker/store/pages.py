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

A selective scan. A queue whose consumers all have selectors looks at its paged
messages without taking them (:meth:`scan_next`, in take order: front to back, or by
priority), and for each either *passes* it (:meth:`passed_to`: no consumer's selector
matches it; it stays here, in its place) or takes that one slot (:meth:`take_at`: a
consumer takes it now), leaving a hole. The scan's cursors (one, or one per priority,
like ``_cur``) remember how far it has passed, so a miss is looked at once per set of
consumers, not once per dispatch; :attr:`scan_top` is the highest priority not yet
passed. Nothing is reordered: a passed message is still in its place, so whatever takes
from the front next (:meth:`popleft`, :meth:`take_top`: a consumer without a selector)
or a scan started again (:meth:`rescan`: a consumer arrived) meets it first, before
everything behind it.

Messages are taken from the front (``head`` moves on; the arrays are shifted down
only once the dead front is large) and appended at the back; a removal in the middle
(an ack out of order, a move) leaves a *hole* (``pos`` and ``ids`` set to 0) that
the front skips. :meth:`find` is ``array.index`` from the front, at C speed: acks
come for the messages a consumer was given first, so the search is short. A topic
message's copies for several offline durable subscriptions are appended once, to a
:class:`SharedTail` the lists of those queues are *attached* to: a list's length counts
the tail's entries from its ``cursor`` on; anything else asked of it first copies them
into its arrays (:meth:`PageList.catch_up`, the copy's id hashed from the entry's
message id and the list's queue name) and detaches it (see store/fanout.py). A 64-bit
hash of the id is not the id: two live ids with the same hash would make one ack
remove the other, a chance of about ``n / 2**64`` per ack with ``n`` messages paged
(below the journal's CRC32 letting a corrupt frame through).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator
from hashlib import blake2b

__all__ = ["PageList", "SharedTail", "id_hash", "copy_hash", "pack", "unpack", "segment_of", "INNER", "MOVED",
           "FLAGS", "SEG_SHIFT", "UNKNOWN", "HOLE"]

INNER = 1  # the Enq is inside a Tx record: a u32 length before it, no frame, no own CRC
MOVED = 2  # a Move came after the Enq record (see the module docstring)
FLAGS = INNER | MOVED
_OFFSET_BITS = 36  # offsets below 64 GiB
_SEG_SHIFT = _OFFSET_BITS + 2
SEG_SHIFT = _SEG_SHIFT  # pos >> SEG_SHIFT is the segment (0: no segment, see MessageStore.page_out)
UNKNOWN = 10  # ``pri`` of a slot whose priority is not known yet (loaded from a checkpoint)
HOLE = 11  # ``pri`` of a removed slot
_HOLES_MIN = 4096  # holes behind the front tolerated before the arrays are rebuilt
_NO_SCAN, _SCAN_FIFO, _SCAN_PRIORITY = 0, 1, 2


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


def copy_hash(prefix: bytes, queue: bytes) -> int:
    """:func:`id_hash` of the id ``prefix + queue`` given encoded (a topic message's copy:
    ``prefix`` is the message id and ``:``, ``queue`` the copy's queue)."""
    h = int.from_bytes(blake2b(prefix + queue, digest_size=8).digest(), "little")
    return h or 1


class SharedTail:
    """Positions appended once for a group of page lists (see the module docstring):
    each list attached to it reads the entries from its ``cursor`` on as its own last
    messages, and copies them into its arrays (hashing its copy's id) the first time
    anything but its length is asked of it."""

    __slots__ = ("pos", "prefixes", "ts", "pri", "top", "gone", "ordered", "last_ts", "attached", "key")

    def __init__(self) -> None:
        self.pos = array("Q")
        self.prefixes: list[bytes] = []  # the encoded message id and ':' of each entry
        self.ts = array("d")
        self.pri = bytearray()  # each entry's JMS priority (PageList's ``pri``)
        self.top = -1  # the highest priority of any entry since the tail was last emptied
        self.gone: list[PageList] = []  # members that copied their entries and left
        self.ordered = True  # entries added in non-decreasing time
        self.last_ts = float("-inf")
        self.attached = 0  # lists reading it: at 0 every entry was copied, and it is emptied
        self.key: tuple[str, ...] = ()  # the queues it is the tail of (store/fanout.py)

    def release(self) -> None:
        """A list left (it copied its entries)."""
        self.attached -= 1
        if not self.attached:  # every list copied what it had: nothing here is needed
            del self.pos[:]
            del self.prefixes[:]
            del self.ts[:]
            del self.pri[:]
            self.top = -1
            self.ordered = True
            self.last_ts = float("-inf")

    def __len__(self) -> int:
        return len(self.pos)

    def add(self, pos: int, prefix: bytes, ts: float, pri: int) -> None:
        if ts < self.last_ts:
            self.ordered = False
        else:
            self.last_ts = ts
        self.pos.append(pos)
        self.prefixes.append(prefix)
        self.ts.append(ts)
        self.pri.append(pri)
        if pri > self.top:
            self.top = pri


class PageList:
    """One destination's paged messages in order. See the module docstring."""

    __slots__ = ("pos", "ids", "ts", "pri", "head", "live", "ordered", "_last_ts", "counts", "top", "_cur",
                 "tail", "cursor", "qname", "_smode", "_sfifo", "_scur")

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
        self.tail: SharedTail | None = None  # entries from tail[cursor:] are this list's too
        self.cursor = 0
        self.qname = b""  # this list's destination, encoded (the copies' id suffix)
        self._smode = _NO_SCAN  # a selective scan: none, front to back, by priority
        self._sfifo = 0  # front to back: every live slot before this index was passed
        self._scur = [0] * 10  # by priority: every live slot of it before this index was passed

    def __len__(self) -> int:
        t = self.tail
        return self.live if t is None else self.live + len(t.pos) - self.cursor

    def __bool__(self) -> bool:
        return self.live > 0 or (self.tail is not None and len(self.tail.pos) > self.cursor)

    # ------------------------------------------------------------------ a shared tail
    def attach(self, tail: SharedTail, qname: bytes) -> None:
        """From now on ``tail``'s new entries are this list's last messages (a list
        attached elsewhere copies that tail's entries first)."""
        if self.tail is not None:
            self.catch_up()
        self.tail, self.cursor, self.qname = tail, len(tail.pos), qname
        tail.attached += 1

    def catch_up(self) -> None:
        """Copy the shared tail's entries meant for this list into its arrays and leave
        the tail (noted in its ``gone``: it may take this list back)."""
        t = self.tail
        if t is None:
            return
        self.tail = None
        q, prefixes, tpos, tts = self.qname, t.prefixes, t.pos, t.ts
        i, end = self.cursor, len(tpos)
        if i < end:
            frm = int.from_bytes
            hashes = [frm(blake2b(p + q, digest_size=8).digest(), "little") for p in prefixes[i:end]]
            if 0 in hashes:  # (id_hash's rule: never 0)
                hashes = [h or 1 for h in hashes]
            self.pos.extend(tpos[i:end])
            self.ids.extend(array("Q", hashes))
            self.ts.extend(tts[i:end])
            pris = t.pri[i:end]
            self.pri.extend(pris)
            counts = self.counts
            for p in range(10):
                if n := pris.count(p):
                    counts[p] += n
            self.live += end - i
            self._fix_top()
            if tts[i] < self._last_ts or not t.ordered:
                self.ordered = False
            self._last_ts = max(self._last_ts, t.last_ts)
        t.gone.append(self)
        t.release()

    def append(self, pos: int, idh: int, ts: float, pri: int = UNKNOWN) -> None:
        if self.tail is not None:
            self.catch_up()
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
        """Live slots whose priority is not known (:meth:`set_priority` them before :meth:`take_top`;
        a shared tail's entries have theirs)."""
        return self.counts[UNKNOWN]

    def top_priority(self) -> int:
        """:attr:`top` counting an attached tail's entries too (its highest ever: an
        upper bound, which only sends a new message of that priority to the pages)."""
        t = self.tail
        if t is not None and len(t.pos) > self.cursor and t.top > self.top:
            return t.top
        return self.top

    def unknown_slots(self) -> list[int]:
        """Indexes of the live slots of unknown priority, front to back."""
        if self.tail is not None:
            self.catch_up()
        out: list[int] = []
        pri, i = self.pri, self.head
        while (i := pri.find(UNKNOWN, i)) >= 0:
            out.append(i)
            i += 1
        return out

    def set_priority(self, i: int, p: int) -> None:
        """Slot ``i`` (of unknown priority) has priority ``p``."""
        if self.tail is not None:
            self.catch_up()
        old = self.pri[i]
        if old == HOLE or old == p:
            return
        self.counts[old] -= 1
        self.counts[p] += 1
        self.pri[i] = p
        if i < self._cur[p]:
            self._cur[p] = i
        if i < self._scur[p]:
            self._scur[p] = i  # not passed as a message of this priority
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
        if self.tail is not None:
            self.catch_up()
        try:
            return self.ids.index(idh, self.head)
        except ValueError:
            return -1

    def remove_at(self, i: int) -> None:
        """Make slot ``i`` a hole."""
        if self.tail is not None:
            self.catch_up()
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
            self._scur = [max(0, c - head) for c in self._scur]
            self._sfifo = max(0, self._sfifo - head)
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
        self._smode = _NO_SCAN

    def popleft(self, n: int) -> list[tuple[int, int, float]]:
        """Take up to ``n`` live messages from the front: ``(pos, id hash, ts)`` each."""
        if self.tail is not None:
            self.catch_up()
        self._smode = _NO_SCAN  # a taker from the front: what a scan passed comes first
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
        if self.tail is not None:
            self.catch_up()
        if self.counts[UNKNOWN]:
            raise ValueError("take_top: some paged messages' priorities are not known yet")
        self._smode = _NO_SCAN  # (as in popleft)
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

    # ------------------------------------------------------------------ a selective scan
    def rescan(self) -> None:
        """Forget what the scan passed: the next :meth:`scan_next` starts at the front."""
        self._smode = _NO_SCAN

    def scan_next(self, n: int, *, by_priority: bool) -> list[tuple[int, int]]:
        """Up to ``n`` live slots the scan has not passed, in take order (front to back,
        or highest priority first, FIFO within one), left in place: ``(index, pos)`` each.
        They are then passed (:meth:`passed_to`) or taken (:meth:`take_at`) in that order,
        up to where the scan stops; :meth:`scan_end` after the last."""
        if self.tail is not None:
            self.catch_up()
        mode = _SCAN_PRIORITY if by_priority else _SCAN_FIFO
        if self._smode != mode:
            self._smode, self._sfifo, self._scur = mode, self.head, [self.head] * 10
        out: list[tuple[int, int]] = []
        pos, head = self.pos, self.head
        if mode == _SCAN_FIFO:
            i, end = max(self._sfifo, head), len(pos)
            while i < end and len(out) < n:
                p = pos[i]
                if p:
                    out.append((i, p))
                i += 1
            return out
        if self.counts[UNKNOWN]:
            raise ValueError("scan_next: some paged messages' priorities are not known yet")
        pri, counts, cur, scur = self.pri, self.counts, self._cur, self._scur
        for p in range(9, -1, -1):
            if not counts[p]:
                continue
            i = max(cur[p], head, scur[p])
            while len(out) < n and (i := pri.find(p, i)) >= 0:
                out.append((i, pos[i]))
                i += 1
            if len(out) >= n:
                break
        return out

    def passed_to(self, i: int, p: int) -> None:
        """The scan passed every slot :meth:`scan_next` gave before slot ``i`` of priority
        ``p`` (it may be one past the last): they stay. (A batch by priority holds every
        slot not passed of each higher priority, so those are all passed.)"""
        if self._smode == _SCAN_FIFO:
            if i > self._sfifo:
                self._sfifo = i
            return
        scur = self._scur
        if i > scur[p]:
            scur[p] = i
        end = len(self.pos)
        for q in range(p + 1, 10):
            scur[q] = end

    def take_at(self, i: int) -> tuple[int, int, float]:
        """Take live slot ``i`` of :meth:`scan_next` (those before it passed): ``(pos, id hash, ts)``."""
        self.passed_to(i + 1, self.pri[i])
        out = (self.pos[i], self.ids[i], self.ts[i])
        self._drop(i)
        self.live -= 1
        self._fix_top()
        return out

    def scan_end(self) -> None:
        """A scan stopped: tidy the front (what :meth:`take_at` left)."""
        self._skip_holes()
        if self.live and len(self.pos) - self.head - self.live > max(_HOLES_MIN, self.live):
            self._rebuild()

    def scan_top(self) -> int:
        """The highest priority among the live slots a by-priority scan has not passed
        (:meth:`top_priority` when no such scan is on), -1 when there is none."""
        if self._smode != _SCAN_PRIORITY:
            return self.top_priority()
        t = self.tail
        top = t.top if t is not None and len(t.pos) > self.cursor else -1
        if self.counts[UNKNOWN]:
            return 9
        pri, counts, cur, scur, head = self.pri, self.counts, self._cur, self._scur, self.head
        for p in range(9, top, -1):
            if counts[p] and pri.find(p, max(cur[p], head, scur[p])) >= 0:
                return p
        return top

    def _rebuild(self) -> None:
        """The same live slots, in order, without the holes between them."""
        keep = [i for i in range(self.head, len(self.pos)) if self.pos[i]]
        self._scur = [bisect_left(keep, c) for c in self._scur]  # the same slots passed
        self._sfifo = bisect_left(keep, self._sfifo)
        pos, ids, ts, pri = self.pos, self.ids, self.ts, self.pri
        self.pos = array("Q", [pos[i] for i in keep])
        self.ids = array("Q", [ids[i] for i in keep])
        self.ts = array("d", [ts[i] for i in keep])
        self.pri = bytearray(pri[i] for i in keep)
        self.head = 0
        self._cur = [0] * 10

    def peek(self, n: int) -> list[tuple[int, int, float]]:
        """Up to ``n`` live messages from the front, left in place."""
        if self.tail is not None:
            self.catch_up()
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
        if self.tail is not None:
            self.catch_up()
        pos, ids, ts = self.pos, self.ids, self.ts
        for i in range(self.head, len(pos)):
            p = pos[i]
            if p:
                yield i, p, ids[i], ts[i]

    def set_pos(self, i: int, pos: int) -> None:
        if self.tail is not None:
            self.catch_up()
        self.pos[i] = pos

    def arrays(self) -> tuple[array[int], array[int], array[float]]:
        """Copies of the live region (holes included), for a checkpoint."""
        if self.tail is not None:
            self.catch_up()
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
        if self.tail is not None:
            self.catch_up()
        items = sorted(((t, i, p, h, self.pri[i]) for i, p, h, t in self.entries()), key=lambda e: e[0])
        self._reset()
        for t, _i, p, h, r in items:
            self.append(p, h, t, r)
        self.ordered = True
