"""Durable topic messages stored once: the ``Fan`` record -- a part of the message store.

Theory of operation
-------------------
A persistent message published to a topic with N durable subscriptions (and virtual
topic consumer queues, :mod:`..dispatch.virtual`) is N live messages: each subscription's
queue holds its own *copy* (id ``<message id>:<queue>``, the queue as destination, the
topic in a header: :func:`fan_copy`, the one rule both the dispatch core and the store
use), delivered, acked, redelivered, dead-lettered and expired on its own. Format
version 1 wrote every copy whole (an ``Enq`` each); the journal grew N-fold. A
:class:`~.records.Fan` record (format version 2) holds the message once and one
*reference* per copy: the 64-bit hash of the copy's queue name (:func:`ref_hash`).

Per-copy state, one record. Applying a ``Fan`` makes N live copies that all point at
the same journal position: resident ones (the writer's, which the dispatch core holds)
or paged entries in each queue's :class:`~.pages.PageList` (recovery, a replica), read
back by deriving the queue's copy from the one stored message
(:func:`~.paging.materialize`). Each copy counts once in its segment's live messages,
so compaction (:mod:`.compaction`) keeps the record until the *last* subscription has
acked its copy -- an ``Ack`` of one copy (it names the copy's id and queue) removes
only that copy. A subscription that falls behind pages its references: 24 bytes a copy
(:mod:`.pages`), never a body.

Naming references. A hash alone cannot be turned back into a queue name after
compaction has carried the ``Sub`` record of that queue forward, past the ``Fan``
records that refer to it. So a ``Fan`` also writes the *name* of every queue the
segment it goes into does not name yet (:attr:`_named`, per segment, rebuilt by
applying the records): every segment is self-describing, a full replay resolves every
reference from the segment itself, and a replay from a checkpoint resolves the rest
from the subscriptions the checkpoint holds (a ``Fan`` after the checkpoint refers only
to subscriptions that existed when it was written). The journal tells which segment a
batch goes into before it is appended (:meth:`~.journal.Journal.segment_for`), so the
names are decided for the right one; a replica (:meth:`MessageStore.import_payloads`)
re-decides them for its own segments, whose boundaries are not the master's.

Offline subscriptions cost nothing per publish. The queue of a durable subscription
nobody is subscribed to pages from its first message (``Registry.offline_durable``),
so its copy of a topic message is a position only. Those positions are not appended to
each queue's :class:`~.pages.PageList`: :meth:`_share` adds one entry (position,
encoded message id, time) to the :class:`~.pages.SharedTail` of that group of queues
(:attr:`_tails`, keyed by the queues), which each list reads from its own cursor on as
its last messages; a list copies its entries into its arrays (hashing its copies' ids)
the first time anything but its length is asked of it -- a read, an ack, a checkpoint,
compaction -- and leaves the tail (``gone``); the group's next message attaches it
again (:meth:`_tail_for`), at the tail's end. A group that changes (a subscriber came
back and read: its queue leaves the group; a new subscription) keeps its tail when the
lists of the new group attached anywhere are all attached to it and nothing else reads
it, so a subscriber's return does not make the others copy their entries. The dispatch core's plan
(``FanOut.publish``, ``dispatch/topics.py``) sends a topic whose every durable
subscription shares one tail (:meth:`shares`) through :meth:`add_shared`: the group's
references are made once (:class:`FanGroup`), named for a segment once, encoded once;
so with its subscriptions offline a publish does the same work for 50 as for 1, and
the per-copy work (the hash, 24 bytes in a list) is done when the subscriber reads.
Counting stays per copy: ``count``, each segment's live copies (compaction) and the
checkpoint's lists are what they would be with every copy appended at once. A full
replay appends each copy at once (its id hash is needed to match later acks).

What stays per copy. A move of a copy (dead-lettering, an operator's move) is written
as an ``Ack`` of the copy and an ``Enq`` of the moved message, in one ``Tx``: the moved
copy gets a record of its own (a ``Move`` keeps the old position, which a ``Fan``
shares). Compaction's relocation of a long-lived copy writes an ``Enq`` of that copy.
The full sync to a replica (:mod:`.sync`) sends each live copy as an ``Enq``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence

from ..dispatch.message import Message
from ..dispatch.names import DURABLE_PREFIX
from ..dispatch.priority import priority_of
from .dedupe import DedupeWindow
from .journal import Callback, Journal
from .pages import PageList, SharedTail, copy_hash, id_hash, segment_of
from .records import Ack, Enq, Fan, Record, Sub, Tx, TxPart, encode
from .segments import FRAME_HEAD

__all__ = ["FanGroup", "FanOutRecords", "fan_copy", "ref_hash", "is_copy_of", "ORIGINAL_DESTINATION"]

log = logging.getLogger(__name__)

ORIGINAL_DESTINATION = "original-destination"


def fan_copy(msg: Message, queue: str) -> Message:
    """The copy of topic message ``msg`` that subscription queue ``queue`` holds: a durable
    subscription's copy names the topic in ``destination``; a virtual topic consumer
    queue's keeps its queue there and names the topic in ``original-destination``."""
    if queue.startswith(DURABLE_PREFIX):
        headers = (("destination", msg.destination), *msg.headers)
    else:
        kept = tuple(h for h in msg.headers if h[0] != ORIGINAL_DESTINATION)
        headers = (*kept, (ORIGINAL_DESTINATION, msg.destination))
    return Message(
        id=f"{msg.id}:{queue}",
        destination=queue,
        headers=headers,
        body=msg.body,
        key="",
        timestamp=msg.timestamp,
        persistent=msg.persistent,
        expires=msg.expires,
        origin=msg.origin,
    )


def ref_hash(queue: str) -> int:
    """The reference a ``Fan`` record writes for subscription queue ``queue``."""
    return id_hash(queue)


def is_copy_of(message_id: str, queue: str) -> bool:
    """True for the id of a topic message's copy in subscription queue ``queue``."""
    return message_id.endswith(":" + queue)


class FanGroup:
    """The references of a ``Fan`` for one group of queues, made once: ``refs`` with
    the names, ``bare`` without (a segment that names them all), ``seg`` the last head
    segment seen to name them all."""

    __slots__ = ("names", "refs", "bare", "hs", "seg")

    def __init__(self, names: tuple[str, ...], refs: tuple[tuple[int, str], ...]) -> None:
        self.names = names
        self.refs = refs
        self.bare = tuple((h, "") for h, _q in refs)
        self.hs = frozenset(h for h, _q in refs)
        self.seg = -1


_MAX_GROUPS = 256  # groups remembered (each distinct set of queues a topic message went to)


class FanOutRecords:
    """Writing and applying ``Fan`` records (see the module docstring)."""

    # the store's state (set by MessageStore.__init__)
    journal: Journal
    subs: dict[str, Sub]
    resident: dict[str, Message]
    paged: dict[str, PageList]
    dedupe: DedupeWindow
    _ref_names: dict[int, str]  # reference -> queue name, as seen in Sub and Fan records
    _ref_of: dict[str, int]  # queue name -> its reference, for the writer (a cache)
    count: int
    _seg_live: dict[int, int]
    _enqs: dict[int, int]
    _replay_seen: set[int] | None
    page_list: Callable[[str], PageList]
    _named: dict[int, set[int]]  # segment -> references its records name
    _tails: dict[tuple[str, ...], SharedTail]  # queues -> the tail their lists share
    _groups: dict[tuple[str, ...], FanGroup]
    _by_refs: dict[int, FanGroup]  # id() of a group's refs or bare -> the group
    _write: Callable[..., int]
    _apply_enq: Callable[[Message, int, bool, bool], None]
    _read: Callable[[list[int], str], list[Message]]
    _track_key: Callable[[str, str, Callback | None], Callback | None]
    add: Callable[[Message, Callback | None], None]

    def fan_record(self, message: Message, copies: Sequence[Message | str]) -> Fan | None:
        """The ``Fan`` record of topic message ``message`` for ``copies``: each the copy the
        dispatch core holds (from :func:`fan_copy`), or the name of a queue whose copy goes
        straight to its paged list; None when a queue is no subscription the store knows
        (or two queues share a reference): then the copies are written whole."""
        refs: list[tuple[int, str]] = []
        ref_of = self._ref_of
        for c in copies:
            q = c if isinstance(c, str) else c.destination
            h = ref_of.get(q)
            if h is None:
                if q not in self.subs:
                    return None
                h = ref_hash(q)
                if self._ref_names.setdefault(h, q) != q:
                    return None
                ref_of[q] = h
            refs.append((h, q))
        return Fan(message, tuple(refs), tuple(copies))

    def add_fan(self, message: Message, copies: Sequence[Message | str], callback: Callback | None = None) -> bool:
        """Persist topic message ``message`` once for its durable ``copies`` (see
        :meth:`fan_record`; the Message ones stay resident), with its idempotency key;
        False (nothing written) when it cannot be (:meth:`fan_record`)."""
        if len(copies) == 1 and not message.key and not isinstance(copies[0], str):
            self.add(copies[0], callback)  # one subscriber: its copy is the message (the fast path)
            return True
        rec = self.fan_record(message, copies) if copies else None
        if rec is None:
            return False
        cb = self._track_key(message.destination, message.key, callback) if message.key else callback
        self._write([rec], cb)
        return True

    def shares(self, names: tuple[str, ...]) -> bool:
        """True when each of queues ``names`` already pages and the last topic message
        stored for exactly these queues left every one's list attached to their shared
        tail (none was read since): one for all of them, :meth:`add_shared`, is then
        what :meth:`add_fan` would make of the message."""
        tail = self._tails.get(names)
        return tail is not None and not tail.gone

    def add_shared(self, message: Message, names: tuple[str, ...], callback: Callback | None = None) -> bool:
        """:meth:`add_fan` of ``message`` with every copy a position only (``names``: the
        queues), its references made once for the group: the cost does not grow with
        the queues while :meth:`shares` holds. False (nothing written) as add_fan."""
        g = self._groups.get(names)
        if g is None:
            rec = self.fan_record(message, names)
            if rec is None:
                return False
            if len(self._groups) >= _MAX_GROUPS:
                self._groups.clear()
                self._by_refs.clear()
            g = self._groups[names] = FanGroup(names, rec.refs)
            self._by_refs[id(g.refs)] = self._by_refs[id(g.bare)] = g
        cb = self._track_key(message.destination, message.key, callback) if message.key else callback
        self._write([Fan(message, g.refs, g.names)], cb)
        return True

    # ------------------------------------------------------------------ applying
    def _ref_name(self, h: int) -> str | None:
        name = self._ref_names.get(h)
        if name is None:  # after a checkpoint's restore: the subscriptions name them
            for q in self.subs:
                self._ref_names.setdefault(ref_hash(q), q)
            name = self._ref_names.get(h)
        return name

    def _apply_fan(self, rec: Fan, pos: int, keep: bool) -> None:
        seg = segment_of(pos)
        m = rec.message
        copies = rec.copies if keep and len(rec.copies) == len(rec.refs) else ()
        replay_seen = self._replay_seen
        g = self._by_refs.get(id(rec.refs))
        if g is not None and rec.refs is g.bare and replay_seen is None and (not copies or copies is g.names):
            self._share(g.names, pos, seg, m)  # add_shared's record in a segment naming them all
            return
        ref_names = self._ref_names
        shared: list[str] = []  # the queues whose copy is a position only
        for i, (h, name) in enumerate(rec.refs):
            if name:
                ref_names[h] = name
                self._named.setdefault(seg, set()).add(h)
            else:
                found = ref_names.get(h) or self._ref_name(h)
                if found is None:
                    log.error(
                        "a stored topic message %s refers to a subscription the journal does not name "
                        "(reference %#x): that copy is lost",
                        m.id,
                        h,
                    )
                    continue
                name = found
            if copies:
                copy = copies[i]
                if not isinstance(copy, str):
                    self._apply_enq(copy, pos, False, keep)
                    continue
            shared.append(name)
        if not shared:
            pass
        elif replay_seen is not None:  # a full replay: each copy's hash is seen now
            prefix = (m.id + ":").encode("utf-8", "surrogatepass")
            for name in shared:
                ch = copy_hash(prefix, name.encode("utf-8", "surrogatepass"))
                self.page_list(name).append(pos, ch, m.timestamp, priority_of(m))
                replay_seen.add(ch)
        else:
            self._share(tuple(shared), pos, seg, m)
            return
        paged = len(shared)
        if paged:
            self.count += paged
            self._seg_live[seg] = self._seg_live.get(seg, 0) + paged
            self._enqs[seg] = self._enqs.get(seg, 0) + paged
        if m.key:
            self.dedupe.add(m.destination, m.key, m.timestamp, seg)

    def _share(self, group: tuple[str, ...], pos: int, seg: int, m: Message) -> None:
        """Topic message ``m`` (at ``pos``) is a paged copy in each of queues ``group``:
        one entry in their shared tail (pages.py), counted once a copy."""
        tail = self._tails.get(group)
        if tail is None or tail.gone:
            tail = self._tail_for(group, tail)
        tail.add(pos, (m.id + ":").encode("utf-8", "surrogatepass"), m.timestamp, priority_of(m))
        paged = len(group)
        self.count += paged
        self._seg_live[seg] = self._seg_live.get(seg, 0) + paged
        self._enqs[seg] = self._enqs.get(seg, 0) + paged
        if m.key:
            self.dedupe.add(m.destination, m.key, m.timestamp, seg)

    def _tail_for(self, group: tuple[str, ...], tail: SharedTail | None) -> SharedTail:
        """The shared tail of queues ``group``, every one's page list attached to it: the
        one their attached lists already share when no other list reads it (a group that
        lost or gained a queue keeps its tail: nothing is copied), else a new one (the
        lists attached elsewhere copy their entries first)."""
        lists = [self.page_list(name) for name in group]
        attached = [pl.tail for pl in lists if pl.tail is not None]
        t = attached[0] if attached else tail
        if t is None or any(a is not t for a in attached) or t.attached != len(attached):
            t = SharedTail()
        if t.key and self._tails.get(t.key) is t and t.key != group:
            del self._tails[t.key]  # its lists were that group's: no longer
        if len(self._tails) >= _MAX_GROUPS:
            for key in [k for k, v in self._tails.items() if not v.attached]:
                del self._tails[key]
        t.gone.clear()
        t.key = group
        self._tails[group] = t
        for name, pl in zip(group, lists, strict=True):
            if pl.tail is not t:
                pl.attach(t, name.encode("utf-8", "surrogatepass"))
        return t

    # ------------------------------------------------------------------ naming
    def _named_record(self, rec: Record, named: set[int]) -> Record:
        """``rec`` with the names of its references written where ``named`` (what the
        segment names so far, updated) does not have them yet, and only there."""
        if isinstance(rec, Fan):
            hs = [h for h, _ in rec.refs]
            if named.issuperset(hs):  # the common case: the segment names them all
                if not any(name for _h, name in rec.refs):
                    return rec  # (a replica's stream: as the master wrote it)
                return Fan(rec.message, tuple(zip(hs, itertools.repeat(""))), rec.copies)
            refs: list[tuple[int, str]] = []
            for h, name in rec.refs:
                if h in named:
                    refs.append((h, ""))
                else:
                    refs.append((h, name or self._ref_name(h) or ""))
                    named.add(h)
            new = tuple(refs)
            return rec if new == rec.refs else Fan(rec.message, new, rec.copies)
        if isinstance(rec, Tx) and any(isinstance(p, Fan) for p in rec.records):
            parts: list[TxPart] = []
            for p in rec.records:
                np = self._named_record(p, named)
                assert not isinstance(np, Tx)
                parts.append(np)  # type: ignore[arg-type]  # a TxPart stays one
            return Tx(tuple(parts))
        return rec

    def _fan_encode(
        self, records: Sequence[Record], payloads: Sequence[bytes] | None = None
    ) -> tuple[list[Record], list[bytes]]:
        """``records`` (one batch) with their references named for the segment the batch
        goes into, and their payloads (``payloads``, when given, kept for the records that
        do not change)."""
        head = self.journal.head
        if len(records) == 1 and payloads is None and isinstance(records[0], Fan):
            fan = records[0]
            g = self._by_refs.get(id(fan.refs))
            if g is not None and fan.refs is g.refs:  # add_shared's: named once a segment
                if g.seg != head and self._named.get(head, set()).issuperset(g.hs):
                    g.seg = head
                if g.seg == head:
                    bare = Fan(fan.message, g.bare, fan.copies)
                    p = encode(bare)
                    if self.journal.segment_for(len(p) + FRAME_HEAD) == head:
                        return [bare], [p]
        out_r: list[Record] = []
        out_p: list[bytes] = []
        for named in (set(self._named.get(head, ())), set()):
            out_r, out_p = [], []
            for i, rec in enumerate(records):
                new = self._named_record(rec, named)
                out_r.append(new)
                out_p.append(payloads[i] if payloads is not None and new is rec else encode(new))
            size = sum(len(p) for p in out_p) + FRAME_HEAD * len(out_p)
            if self.journal.segment_for(size) == head:
                break  # else: a new segment, which names nothing yet
        return out_r, out_p

    # ------------------------------------------------------------------ moving a copy
    def _copy_move(self, where: Message | tuple[PageList, int], source: str, destination: str) -> list[Record]:
        """The records that move a topic message's copy from ``source`` to ``destination``
        (an ``Ack`` of it and an ``Enq`` of the moved message, one ``Tx``); a resident copy
        is changed in place, as :meth:`MessageStore.apply` changes a moved message."""
        if isinstance(where, Message):
            m = where
        else:
            pl, i = where
            (m,) = self._read([pl.pos[i]], source)
        if not any(k == ORIGINAL_DESTINATION for k, _ in m.headers):
            m.headers = (*m.headers, (ORIGINAL_DESTINATION, m.destination))
        m.destination = destination
        m.key = ""
        m.wire_cache = None
        m.delivery_count = 0
        return [Tx((Ack((m.id,), source), Enq(m)))]
