"""Index checkpoints: recovery that replays only the journal's tail.

Theory of operation
-------------------
A checkpoint is the store's state folded up to a journal position ``P`` (segment,
offset): the durable subscriptions, the idempotency keys, the compaction accounting,
and every live message as its destination's paged entry (position, id hash,
acceptance time: :mod:`.pages`) -- never a message body, which stays in the journal.
Recovery (:meth:`Checkpointer.recover`) loads it and replays only the records after
``P``; because the store's state is a fold of its record stream, that is the state a
full replay would build. The file is ``<journal>/checkpoint``.

Writing, crash-safe. The state is *captured* on the loop between two appends, so it
is exactly the fold of the records before ``P`` (copies of arrays and dicts, no Python
loop over paged messages: resident messages, the queues' fronts and the newest, join
the copied arrays at their ends); a thread writes it into ``checkpoint.tmp`` piece by
piece (the arrays as they are; the header's CRC and length last), waits until every
record before ``P`` is durable (a checkpoint must never claim a record that a crash
can still take away), fsyncs it, renames it over ``checkpoint`` and fsyncs the
directory. A crash at any point leaves the previous checkpoint or the new one,
whole. Checkpoints are written every ``interval`` bytes of journal (at least the size
of the last checkpoint, so they never cost more writing than the journal itself),
when compaction has segments to delete, and on a clean close.

Trust. The file starts with a CRC32 of everything after it and that length, so a torn
or corrupt file is refused. It names ``P``, the size of every
older segment, and the offset and CRC of the last frame before ``P``: a journal whose
segment ``P`` is shorter than ``P``, whose frame there is another, or whose older
segments differ in size or are not all known to the checkpoint (another journal, a
restored backup) is not the journal the checkpoint was taken from. A checkpoint that is
merely *older* than the journal holds is fine (the tail is longer) unless compaction
has since deleted a segment it still counts live messages in: after the tail, every
live message must be in a segment that exists. Whenever any of this fails, recovery
logs why and replays the whole journal: a bad checkpoint costs time, never state --
unless the checkpoint *proves loss*: a segment it knew (or counts live messages in) is
gone and the record of compaction's deletes (:mod:`.chain`) does not name it, or a
segment is shorter than the checkpoint covered as durable. Then recovery refuses to
start (:class:`~.chain.SegmentsLost`), naming what is missing and pointing to ``amq
broker verify`` / ``repair``.

Failure. A checkpoint that cannot be written (the data directory is gone, the disk is
full, ``checkpoint.tmp`` cannot be created) is an optimisation lost, not state: the
writer logs it, counts it (:attr:`Checkpointer.failures`, the store's
``amq_store_background_failures_total``), asks the journal to check the disk under it
at once (:meth:`~.journal.Journal.check_soon`: a directory that is gone fails the
journal and fences the broker) and tries again only after a back-off that doubles from
:data:`RETRY_FIRST` to :data:`RETRY_MAX` seconds -- never in a loop without a delay.
While the journal has failed no checkpoint is started at all; nor, background or at
close, while the store is *diverged* (an apply failed after its append: the state is
behind the journal, and a checkpoint from it would claim records it does not hold;
:mod:`.store`, "A failed apply").

Compaction and checkpoints. Deleting a segment could make the current checkpoint
stale (its live messages' acks may go with another deleted segment). So when the
store writes periodic checkpoints, compaction's dead segments are deleted only once a
checkpoint taken after their death is published (:meth:`Checkpointer.delete_segments`).
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from ..dispatch.message import Message
from .chain import SegmentsLost, describe_missing
from .checkpoint_file import (
    FILE,
    Capture,
    CheckpointError,
    CheckpointProvesLoss,
    load,
    serialize,
    write_file,
)
from .dedupe import DedupeWindow
from .journal import Journal, JournalError
from .pages import SEG_SHIFT, PageList, id_hash
from .records import Sub


class IndexedStore(Protocol):
    """What a checkpoint captures, restores and recovers of the store (the store's
    :class:`~.store.MessageStore`; declared here so that this module does not import it)."""

    directory: Path
    journal: Journal
    count: int
    subs: dict[str, Sub]
    dedupe: DedupeWindow
    resident: dict[str, Message]
    paged: dict[str, PageList]
    _sub_seg: dict[str, int]
    _seg_live: dict[int, int]
    _enqs: dict[int, int]
    _refs: dict[int, set[int]]
    _transient: dict[int, Message]
    diverged: BaseException | None

    def reset_state(self) -> None: ...

    def replay(self, start: tuple[int, int] | None) -> int: ...

    def delete_now(self, segments: Sequence[int]) -> None: ...

__all__ = ["Checkpointer", "Capture", "load", "serialize", "FILE", "CheckpointError", "DIVERGED", "RETRY_FIRST",
           "RETRY_MAX"]

log = logging.getLogger(__name__)

#: seconds before the first retry of a checkpoint that could not be written (doubling)
RETRY_FIRST = 1.0
#: the longest back-off between two attempts
RETRY_MAX = 60.0
#: what the log says of a diverged store (:mod:`.store`, "A failed apply")
DIVERGED = ("the store's state is behind its journal after a failed apply: no checkpoint written; "
            "the next start recovers from the journal")

def capture(store: IndexedStore) -> Capture:
    """The store's state now (on the loop: see the module docstring)."""
    j = store.journal
    seg, off, records = j.position
    last = j.last_frame
    cap = Capture(
        segment=seg,
        offset=off,
        records=records,
        last_frame=(last[1], last[2]) if last is not None and last[0] == seg else None,
        sizes={s: n for s, n in j.segment_sizes().items() if s < seg},
        count=store.count,
        subs=[(sub, store._sub_seg.get(q, 0)) for q, sub in store.subs.items()],  # noqa: SLF001
        keys=store.dedupe.copy_entries(),
        refs={s: sorted(r) for s, r in store._refs.items()},  # noqa: SLF001
        enqs=dict(store._enqs),  # noqa: SLF001
        seg_live=dict(store._seg_live),  # noqa: SLF001
        journal=j.chain.journal if j.chain is not None else "",
    )
    resident: dict[str, list[tuple[float, int, int]]] = {}
    for m in store.resident.values():
        resident.setdefault(m.destination, []).append((m.timestamp, m.pos, id_hash(m.id)))
    for dest in {*store.paged, *resident}:
        pl = store.paged.get(dest)
        pos, ids, ts = pl.arrays() if pl is not None else (array("Q"), array("Q"), array("d"))
        if store._transient:  # noqa: SLF001 - non-persistent messages among them: not recovered
            keep = [i for i, p in enumerate(pos) if p >> SEG_SHIFT]
            pos = array("Q", [pos[i] for i in keep])
            ids = array("Q", [ids[i] for i in keep])
            ts = array("d", [ts[i] for i in keep])
        ordered = pl.ordered if pl is not None else True
        mine = resident.get(dest)
        if mine:
            mine.sort(key=lambda e: e[0])
            # resident messages are the queue's front (older than every paged one) and the
            # newest (a message just added, not paged yet): both join the arrays whole
            oldest = _first_live_ts(pos, ts)
            newest = ts[-1] if len(ts) else float("-inf")
            k = 0
            while k < len(mine) and mine[k][0] <= oldest:
                k += 1
            if ordered and all(e[0] > newest for e in mine[k:]):
                before, after = mine[:k], mine[k:]  # in place: the copies are ours
                pos[0:0] = array("Q", [e[1] for e in before])
                ids[0:0] = array("Q", [e[2] for e in before])
                ts[0:0] = array("d", [e[0] for e in before])
                pos.extend(array("Q", [e[1] for e in after]))
                ids.extend(array("Q", [e[2] for e in after]))
                ts.extend(array("d", [e[0] for e in after]))
            else:
                merged = sorted([*mine, *((t, p, h) for p, h, t in zip(pos, ids, ts, strict=True) if p)],
                                key=lambda e: e[0])
                pos = array("Q", [e[1] for e in merged])
                ids = array("Q", [e[2] for e in merged])
                ts = array("d", [e[0] for e in merged])
                ordered = True
        cap.lists[dest] = (pos, ids, ts, ordered)
    return cap


def _first_live_ts(pos: array[int], ts: array[float]) -> float:
    for p, t in zip(pos, ts, strict=True):
        if p:
            return t
    return float("inf")




def restore(store: IndexedStore, cap: Capture) -> None:
    """Put a loaded capture's state into an empty store."""
    store.reset_state()
    for sub, seg in cap.subs:
        store.subs[sub.queue] = sub
        store._sub_seg[sub.queue] = seg  # noqa: SLF001
    for (scope, key), (ts, seg, _serial) in cap.keys.items():
        store.dedupe.add(scope, key, ts, seg)
    store._refs = {s: set(r) for s, r in cap.refs.items()}  # noqa: SLF001
    store._enqs = dict(cap.enqs)  # noqa: SLF001
    store._seg_live = dict(cap.seg_live)  # noqa: SLF001
    for dest, (pos, ids, times, ordered) in cap.lists.items():
        pl = PageList.from_arrays(pos, ids, times, ordered=ordered)
        if pl:
            store.paged[dest] = pl
    store.count = cap.count




# ---------------------------------------------------------------------- the store's writer
class Checkpointer:
    """When and how a store writes its checkpoints, and recovery from them."""

    def __init__(self, store: IndexedStore, *, interval: int, enabled: bool) -> None:
        self.store = store
        self.interval = interval  # bytes of journal between background checkpoints (0: none)
        self.enabled = enabled  # read and write checkpoints at all
        self.pending_deletes: set[int] = set()  # dead segments waiting for a checkpoint
        self.holds = 0  # readers of old positions (see hold())
        self.written = 0  # checkpoints published by this process
        self.last_recovery = ""  # what recover() did
        self.last_size = 0
        self._last_bytes = 0
        self._thread: threading.Thread | None = None
        self.failures = 0  # checkpoints that could not be written, ever
        self.failing = ""  # why the last attempt failed ("" once one succeeds)
        self._retry_at = 0.0  # time.monotonic() before which no background checkpoint starts
        self._streak = 0  # failures in a row (the back-off doubles with each)

    @property
    def path(self) -> Path:
        return self.store.directory / FILE

    # ---------------------------------------------------------------- recovery
    def recover(self) -> str:
        """Load the checkpoint and replay the tail, or replay everything; says which
        (also in :attr:`last_recovery`)."""
        self.last_recovery = self._recover()
        return self.last_recovery

    def _recover(self) -> str:
        store = self.store
        journal = store.journal
        journal.lock()
        chain = journal.check_chain()  # a segment gone that compaction did not delete: SegmentsLost
        why = "checkpoints are off"
        if self.enabled:
            try:
                cap = load(store.directory, journal.existing_segments(), chain)
            except CheckpointProvesLoss as exc:
                raise SegmentsLost(f"journal {store.directory}: the checkpoint proves records lost: {exc}. The broker "
                                   f"refuses to start: `amq broker verify {store.directory.parent}` reports, `amq "
                                   f"broker repair {store.directory.parent}` quarantines the checkpoint (and damaged "
                                   "segments) and the broker then starts without what is lost") from exc
            except (CheckpointError, OSError) as exc:
                why = str(exc)
            else:
                restore(store, cap)
                n = store.replay((cap.segment, cap.offset))
                existing = set(journal.segments)
                missing = sorted(s for s in store._seg_live if s not in existing)  # noqa: SLF001
                if not missing:
                    self._count_tail(cap.segment, cap.offset)
                    return f"recovered from the checkpoint at segment {cap.segment} offset {cap.offset} + {n} records"
                lost = [s for s in missing if s not in chain] if cap.journal == chain.journal else []
                if lost:
                    raise SegmentsLost(describe_missing(journal.directory, lost))
                why = f"the checkpoint is stale: it counts live messages in deleted segments {missing[:5]}"
                store.reset_state()
            level = logging.INFO if why == "no checkpoint" else logging.WARNING
            log.log(level, "store %s: %s; replaying the whole journal", store.directory, why)
        n = store.replay(None)
        return f"replayed the whole journal ({n} records; {why})"

    def _count_tail(self, segment: int, offset: int) -> None:
        """The journal after the checkpoint counts toward the next one as if this process
        had appended it, and a tail of a segment or more makes the next one due at the
        first append: a process that recovered a tail it did not write (a restart, a
        takeover) checkpoints it, so the next recovery replays what this process appends,
        not every term's since the last checkpoint. Counting only a process's own appends,
        a pair failing over more often than every ``interval`` bytes never wrote one, and
        each new master replayed a longer tail (issue 24, the nemesis: the same checkpoint
        for minutes, 51,000 then 71,000 records replayed, up to 1.2 s of a takeover)."""
        journal = self.store.journal
        tail = sum(size - (offset if seg == segment else 0)
                   for seg, size in journal.segment_sizes().items() if seg >= segment)
        self._last_bytes = journal.appended_bytes - (self.interval if tail >= journal.segment_size else max(0, tail))

    # ---------------------------------------------------------------- writing
    def _may_start(self) -> bool:
        """No background checkpoint while one runs, the journal has failed, the store is
        diverged, or a failed one's back-off lasts."""
        return (self._thread is None and self.store.journal.failed is None and self.store.diverged is None
                and time.monotonic() >= self._retry_at)

    def retry_due(self) -> None:
        """Periodically (compaction's timer, loop): retry deletes waiting for a checkpoint
        once a failed checkpoint's back-off is over."""
        if self.failing and self.pending_deletes:
            self._deletes_due()

    def appended(self) -> None:
        """After an append (loop): start a background checkpoint when one is due."""
        if self.interval and self._may_start():
            due = max(self.interval, self.last_size)
            if self.store.journal.appended_bytes - self._last_bytes >= due:
                self.start_background()

    def after_full_replay(self) -> None:
        """A whole journal was replayed: checkpoint it (in the background) so the next
        recovery need not."""
        if self.enabled and self.interval and self._may_start():
            self.start_background()

    def delete_segments(self, segments: Sequence[int]) -> None:
        """Dead segments from compaction: delete them now, or once a checkpoint that does
        not need them is published (periodic checkpoints), and not while something reads
        old positions (:meth:`hold`)."""
        if not (self.enabled and self.interval) and not self.holds:
            self.store.delete_now(segments)
            return
        self.pending_deletes.update(segments)
        self._deletes_due()

    def hold(self) -> None:
        """Delete no segment until :meth:`release` (a replica is reading old positions)."""
        self.holds += 1

    def release(self) -> None:
        self.holds -= 1
        self._deletes_due()

    def _deletes_due(self) -> None:
        if self.holds or not self.pending_deletes or self.store.journal.failed is not None:
            return
        if self.enabled and self.interval:
            if self._may_start():
                self.start_background()
            return
        deletes = sorted(self.pending_deletes)
        self.pending_deletes.clear()
        self.store.delete_now(deletes)

    def start_background(self) -> None:
        cap = capture(self.store)
        deletes = sorted(self.pending_deletes)
        self._last_bytes = self.store.journal.appended_bytes
        self._thread = threading.Thread(target=self._run, args=(cap, deletes), daemon=True,
                                        name=f"checkpoint:{self.store.directory}")
        self._thread.start()

    def _run(self, cap: Capture, deletes: list[int]) -> None:
        size = 0
        journal = self.store.journal

        def ready() -> None:
            if not journal.wait_durable(cap.records, timeout=600):
                raise JournalError("the records it covers did not become durable")

        try:
            size = write_file(self.store.directory, cap, fsync=journal.fsync, ready=ready)
        except Exception as exc:  # noqa: BLE001 - a checkpoint is an optimisation
            why = str(exc) or type(exc).__name__
            self.store.journal.post(lambda: self._done(False, 0, [], why))
            return
        self.store.journal.post(lambda: self._done(True, size, deletes))

    def _done(self, ok: bool, size: int, deletes: list[int], why: str = "") -> None:
        self._thread = None
        if not ok:
            self._failed(why)
            return
        self.failing = ""
        self._retry_at = 0.0
        self._streak = 0
        self.written += 1
        self.last_size = size
        log.debug("store %s: checkpoint written (%d bytes)", self.store.directory, size)
        if deletes and self.store.journal.failed is None and not self.holds:
            self.pending_deletes.difference_update(deletes)
            self.store.delete_now(deletes)
        self._deletes_due()

    def _failed(self, why: str) -> None:
        """A checkpoint was not written: count it, have the journal check its disk, back off."""
        self.failures += 1
        self._streak += 1
        self.failing = why
        delay = min(RETRY_MAX, RETRY_FIRST * 2 ** min(self._streak - 1, 16))
        self._retry_at = time.monotonic() + delay
        log.warning("store %s: checkpoint not written: %s; checking the disk and retrying in %.0f s",
                    self.store.directory, why, delay)
        self.store.journal.check_soon()

    def write_now(self) -> int:
        """Capture and publish a checkpoint synchronously (everything appended must be
        durable, or become so); returns its size. Deletes the segments it frees."""
        self.stop()
        cap = capture(self.store)
        deletes = sorted(self.pending_deletes)
        journal = self.store.journal

        def ready() -> None:
            if not journal.wait_durable(cap.records, timeout=600):
                raise JournalError("checkpoint not written: the records it covers are not durable")

        size = write_file(self.store.directory, cap, fsync=journal.fsync, ready=ready)
        self.written += 1
        self.last_size = size
        self._last_bytes = journal.appended_bytes
        if deletes and not self.holds:
            self.pending_deletes.difference_update(deletes)
            self.store.delete_now(deletes)
        return size

    def at_close(self) -> None:
        if not self.enabled:
            return
        if self.store.diverged is not None:
            log.error("store %s: closing: %s", self.store.directory, DIVERGED)
            return
        try:
            self.write_now()
        except (OSError, JournalError) as exc:
            log.warning("store %s: no checkpoint at close: %s", self.store.directory, exc)

    def stop(self) -> None:
        """Wait for a background checkpoint to finish."""
        t = self._thread
        if t is not None:
            t.join(timeout=600)
            self._thread = None
