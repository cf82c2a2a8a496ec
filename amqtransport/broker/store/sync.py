"""Reading a store out for a replica: a snapshot in bounded batches, then the journal's tail.

Theory of operation
-------------------
A new or returning slave needs the master's state as of one journal position ``P``
and then every record after it. Encoding the whole state in one step would hold the
store twice in memory and stall the master's loop; instead:

* :class:`SnapshotReader` takes, on the loop and at once, what the state *is* at
  ``P``: the durable subscriptions, the idempotency keys, and every live message's
  journal position (resident messages' positions, copies of the paged lists' arrays:
  8 bytes a message). It then produces the snapshot's record payloads in batches of
  about ``max_bytes``, reading the messages back from the journal (the records there
  do not change; a moved message is given as the move left it, and a topic message's
  copy that shares a ``Fan`` record as an ``Enq`` of its own), so memory stays
  bounded however big the store is, and the master serves between batches.
* :class:`TailReader` reads the records appended after ``P`` back from the journal, as
  far as the writer has written them, segment after segment, in order.

While either is open, compaction deletes no segment (:meth:`MessageStore.hold_deletes`):
the positions they read must stay readable. Both run on the loop thread.

A live message whose record cannot be read back (a corrupt record: bits changed on the
master's disk) does not stop the full sync: it is sent from memory when the master
holds it there, else left out (the master could not deliver it either); either way it
is logged at ERROR and counted (:meth:`~.paging.PagedMessages.unreadable_message`) and
the sync carries on with the rest. (Before, every full sync failed on it,
and the slave retried for as long as the record lived.)
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import TYPE_CHECKING

from .journal import JournalError
from .pages import MOVED, SEG_SHIFT
from .paging import materialize
from .records import T_FAN, Enq, Keys, RecordError, encode

if TYPE_CHECKING:
    from .store import MessageStore

__all__ = ["SnapshotReader", "TailReader"]

_KEYS_PER_RECORD = 5000
_BATCH = 1000  # messages read back per journal read


class SnapshotReader:
    """The store's state at the journal's current position, as record payloads."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        store.hold_deletes()
        self._held = True
        seg, off, records = store.journal.position
        self.position = (seg, off)
        self.records = records  # records appended before the position (the stream's base)
        head: list[bytes] = [encode(sub) for sub in store.subs.values()]
        keys = [(scope, k, ts) for scope, k, ts, kseg in store.dedupe.items() if kseg >= 0]
        for i in range(0, len(keys), _KEYS_PER_RECORD):
            head.append(encode(Keys(tuple(keys[i : i + _KEYS_PER_RECORD]))))
        self._head = deque(head)
        resident: dict[str, array[int]] = {}
        for m in store.resident.values():
            resident.setdefault(m.destination, array("Q")).append(m.pos)
        self._lists: deque[tuple[str, array[int]]] = deque(resident.items())
        for dest, pl in store.paged.items():
            self._lists.append((dest, pl.arrays()[0]))
        self._at = 0  # index into the first list
        self._avg = 256  # bytes a message record takes, as seen so far
        self._ready: deque[bytes] = deque()  # read back, not given yet
        self.messages = sum(len(a) for _d, a in self._lists)  # holes included
        self.skipped = 0  # live messages left out: their records cannot be read back

    def next(self, max_bytes: int) -> list[bytes]:
        """The next payloads, up to the one that reaches ``max_bytes``; [] once everything
        was given."""
        out: list[bytes] = []
        size = 0
        while self._head and size < max_bytes:
            p = self._head.popleft()
            out.append(p)
            size += len(p)
        while size < max_bytes:
            if not self._ready:
                if not self._read_more(max_bytes - size):
                    break
                continue  # (what it read may all have been left out)
            p = self._ready.popleft()
            out.append(p)
            size += len(p)
        return out

    def _read_more(self, room: int) -> bool:
        """Read about ``room`` bytes of messages back into ``_ready``; False at the end."""
        while self._lists:
            dest, positions = self._lists[0]
            want = max(1, min(_BATCH, room // self._avg))
            chunk = [p for p in positions[self._at : self._at + want] if p >> SEG_SHIFT]  # no holes, no transients
            self._at += want
            if self._at >= len(positions):
                self._lists.popleft()
                self._at = 0
            if not chunk:
                continue
            for pos, payload in self._read(chunk, dest):
                try:
                    # a moved message as the move left it; a topic message's copy (a Fan
                    # record, fanout.py, shared by other live copies) as that copy alone
                    p = encode(Enq(materialize(payload, pos, dest))) if pos & MOVED or payload[0] == T_FAN else payload
                except RecordError as exc:
                    self._left_out(pos, dest, exc)
                    continue
                self._ready.append(p)
                self._avg = (self._avg * 7 + len(p)) // 8 or 1
            return True
        return False

    def _read(self, chunk: list[int], dest: str) -> list[tuple[int, bytes]]:
        """``(position, payload)`` of the records of ``chunk`` that can be read back."""
        try:
            return list(zip(chunk, self.store.journal.read(chunk), strict=True))
        except (JournalError, RecordError) as exc:
            if len(chunk) == 1:
                self._left_out(chunk[0], dest, exc)
                return []
        out: list[tuple[int, bytes]] = []
        for pos in chunk:
            out.extend(self._read([pos], dest))
        return out

    def _left_out(self, pos: int, dest: str, exc: Exception) -> None:
        """One unreadable record: sent from memory when the message is resident there,
        else left out -- unless the journal itself is gone or failed: then the sync fails
        (a copy missing everything must never count as in sync)."""
        journal = self.store.journal
        problem = journal.disk_problem() if journal.failed is None else str(journal.failed)
        if problem is not None:
            raise JournalError(f"cannot read the journal back: {problem}") from exc
        held = next((m for m in self.store.resident.values() if m.pos == pos and m.destination == dest), None)
        if held is not None:
            self.store.unreadable_message(pos, dest, exc, "sent to the replica from memory")
            self._ready.append(encode(Enq(held)))
            return
        self.skipped += 1
        self.store.unreadable_message(pos, dest, exc, "left out of the replica's full sync (it is lost here too)")

    def close(self) -> None:
        if self._held:
            self._held = False
            self.store.release_deletes()


class TailReader:
    """The journal's records from ``position`` on, as they are written."""

    def __init__(self, store: MessageStore, position: tuple[int, int]) -> None:
        self.store = store
        store.hold_deletes()
        self._held = True
        self.segment, self.offset = position
        self.caught_up = False  # the last read stopped at what the writer had written

    def next(self, max_bytes: int) -> list[bytes]:
        payloads, self.segment, self.offset, self.caught_up = self.store.journal.read_span(
            self.segment, self.offset, max_bytes
        )
        return payloads

    def close(self) -> None:
        if self._held:
            self._held = False
            self.store.release_deletes()
