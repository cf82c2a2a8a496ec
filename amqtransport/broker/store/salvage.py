"""Reading past damage: what recovery does at a bad frame, and ``amq broker verify`` / ``repair``.

Theory of operation
-------------------
A scan of a segment (:class:`~.segments.Scan`) stops at the first frame that is not
intact (a torn header or record, an impossible length, a checksum mismatch, a payload
that does not decode). What lies *after* it decides what it was:

* nothing intact until the end of the **last** segment: a *torn tail*, the write a crash
  interrupted (never fsynced, so never receipted). Recovery cuts it off, as before.
  (In a preallocated segment, :mod:`.segments`, the torn bytes have zeros after them:
  the same rule, since no intact frame follows; the cut takes the zeros too.)
* an intact frame further on (:func:`next_frame`), or a bad frame in a segment that is
  not the last (the writer fsyncs a segment before it opens the next, so a finished
  segment has no torn tail): *damage* -- bits changed on the disk. Recovery never
  destroys what it could read: it skips exactly the damaged bytes, goes on with the
  next intact frame, and reports each :class:`Damage` (segment, offsets, and what the
  skipped bytes held when they still decode: "Enq ID:x-1 to /queue/a") in the log at
  ERROR and in :attr:`~.journal.Journal.damage` (``amq_journal_damaged_regions``).

:func:`next_frame` tries first where the bad frame says it ends (a bit flipped inside a
payload leaves its length intact: exactly one record is lost), then every later
offset whose frame has a possible length, a matching CRC and a payload that decodes,
giving up after :data:`SEARCH_BUDGET` bytes of checksumming (then the rest of the
segment counts as damaged).

A segment whose data ends at a zero tail (preallocated, :mod:`.segments`) ends cleanly
there (:class:`ZeroTail`). Recovery cuts the zero tail off too, as it cuts a torn tail,
since it always starts a fresh head segment (preallocated itself): the old one is
never written again, and its file size is then its written size once more.

Offline (:func:`verify` and :func:`repair`, ``amq broker verify|repair DATA_DIR``, with
no broker running): ``verify`` reports every segment's records and damage and whether
the checkpoint can be used, changing nothing; ``repair`` copies every damaged segment
and the checkpoint into ``journal/quarantine/<UTC time>/`` (never deleting anything),
then rewrites each damaged segment with only its intact frames (a torn tail included)
and removes the checkpoint from the journal (positions moved: the next start replays
the whole journal). Records that are *gone* -- a segment missing that compaction did
not delete (:mod:`.chain`), or what a checkpoint proves lost -- make the broker refuse
to start; ``verify`` names them and ``repair`` writes the report into the quarantine
(``LOST.txt``), quarantines the checkpoint and records the missing segments as gone,
so that the broker then starts, knowingly, without them.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .chain import Chain, read_chain, write_chain
from .checkpoint_file import CheckpointError, CheckpointProvesLoss, load
from .files import fsync_dir
from .records import Ack, Enq, Fan, Keys, Move, Record, RecordError, Sub, Tx, Unsub, decode
from .segments import FRAME, MAGIC, MAX_RECORD, Scan, first_nonzero, segment_id

__all__ = [
    "SEARCH_BUDGET", "Damage", "TornTail", "ZeroTail", "SegmentReport", "JournalReport", "describe", "next_frame", "scan_with_damage",
    "recover_segment", "verify", "repair", "quarantine_journal",
]

log = logging.getLogger(__name__)

#: bytes of payload :func:`next_frame` may checksum while looking for the next intact frame
SEARCH_BUDGET = 256 << 20
QUARANTINE = "quarantine"


@dataclass(frozen=True)
class Damage:
    """Bytes of a segment that hold no intact frame, skipped by recovery."""

    segment: int
    offset: int  # where the bad bytes start
    end: int  # where the next intact frame starts (the end of the file: nothing intact after)
    problem: str  # what the scan found at ``offset``
    lost: str  # what the bytes held, as far as it can be read ("" when nothing decodes)

    def __str__(self) -> str:
        what = f"; they held {self.lost}" if self.lost else "; nothing in them can be read"
        return (f"segment {self.segment}: {self.problem}: {self.end - self.offset} bytes skipped "
                f"(offset {self.offset} to {self.end}){what}")


@dataclass(frozen=True)
class TornTail:
    """The last segment ends with a write a crash interrupted, from ``offset``."""

    segment: int
    offset: int
    problem: str


@dataclass(frozen=True)
class ZeroTail:
    """A segment's written data ends at ``offset``: zeros (preallocated, never written) follow."""

    segment: int
    offset: int


def _intact(view: memoryview, pos: int, max_record: int) -> bool:
    if len(view) - pos < FRAME.size:
        return False
    length, crc = FRAME.unpack_from(view, pos)
    if length == 0 or length > max_record or pos + FRAME.size + length > len(view):
        return False
    payload = view[pos + FRAME.size : pos + FRAME.size + length]
    if zlib.crc32(payload) != crc:
        return False
    try:
        decode(payload)
    except RecordError:
        return False
    return True


def next_frame(view: memoryview, pos: int, max_record: int = MAX_RECORD, budget: int = SEARCH_BUDGET) -> int | None:
    """The offset of the first intact frame after the bad one at ``pos``, or None."""
    end = len(view)
    if end - pos >= FRAME.size:
        length: int = FRAME.unpack_from(view, pos)[0]
        stated = pos + FRAME.size + length
        if length <= max_record and stated < end and _intact(view, stated, max_record):
            return stated
    spent = 0
    at = pos + 1
    while at + FRAME.size <= end and spent <= budget:
        length, _crc = FRAME.unpack_from(view, at)
        if length == 0:  # no frame starts here: skip a run of zeros (a preallocated tail) at C speed
            at = max(at + 1, first_nonzero(view, at) - 3)  # a frame's length has a non-zero byte
            continue
        if length <= max_record and at + FRAME.size + length <= end:
            spent += length
            if _intact(view, at, max_record):
                return at
        at += 1
    return None


def _name(rec: Record) -> str:
    if isinstance(rec, Enq):
        return f"Enq {rec.message.id} to {rec.message.destination}"
    if isinstance(rec, Ack):
        return f"Ack of {', '.join(rec.ids[:5])}{' ...' if len(rec.ids) > 5 else ''}"
    if isinstance(rec, Move):
        return f"Move of {rec.id} to {rec.destination}"
    if isinstance(rec, Tx):
        return f"Tx [{'; '.join(_name(r) for r in rec.records[:5])}{' ...' if len(rec.records) > 5 else ''}]"
    if isinstance(rec, Keys):
        return f"Keys ({len(rec.keys)} idempotency keys)"
    if isinstance(rec, Sub):
        return f"Sub {rec.queue}"
    if isinstance(rec, Unsub):
        return f"Unsub {rec.queue}"
    if isinstance(rec, Fan):
        return f"Fan {rec.message.id} to {rec.message.destination} ({len(rec.refs)} subscriptions)"
    return type(rec).__name__  # pragma: no cover - every record kind is named above


def describe(view: memoryview, pos: int, end: int) -> str:
    """What the damaged bytes ``view[pos:end]`` held, as far as their first frame still
    decodes (its checksum aside): e.g. ``Enq ID:x-1 to /queue/a``; "" when it does not."""
    if end - pos < FRAME.size:
        return ""
    length, _crc = FRAME.unpack_from(view, pos)
    if pos + FRAME.size + length > end:
        return ""
    try:
        rec = decode(view[pos + FRAME.size : pos + FRAME.size + length])
    except RecordError:
        return ""
    more = pos + FRAME.size + length < end
    return _name(rec) + (" and more" if more else "")


def scan_with_damage(
    view: memoryview, seg: int, start: int, max_record: int, *, last: bool
) -> Iterator[tuple[int, memoryview, Record] | Damage | TornTail | ZeroTail]:
    """Every intact frame of a segment from ``start`` as ``(offset, payload, record)``,
    every damaged region as a :class:`Damage`, and last a :class:`TornTail` when the
    ``last`` segment ends with one (recovery truncates it), or a :class:`ZeroTail` when
    the segment's data ends before its preallocated end."""
    pos = start
    while True:
        scan = Scan(view, pos, max_record)
        yield from scan
        if scan.problem is None:
            if scan.zero_tail and scan.end < len(view):
                yield ZeroTail(seg, scan.end)
            return
        nxt = next_frame(view, scan.end, max_record)
        if nxt is None and last:
            yield TornTail(seg, scan.end, scan.problem)
            return
        stop = len(view) if nxt is None else nxt
        yield Damage(seg, scan.end, stop, scan.problem, describe(view, scan.end, stop))
        if nxt is None:
            return
        pos = nxt


def recover_segment(
    path: Path, seg_id: int, first: int, *, last: bool, max_record: int, on_damage: Callable[[Damage], None]
) -> Iterator[tuple[int, int, memoryview, Record]]:
    """Recovery's reading of one segment: yield ``(segment, offset, payload, record)`` for
    every intact frame from offset ``first``, report each damaged region to ``on_damage``
    and read on past it, and cut off a torn tail (``last``: only the last segment can have
    one; it was never fsynced, so never receipted). ``payload`` is valid until the next item."""
    data = path.read_bytes()
    view = memoryview(data)
    torn: TornTail | ZeroTail | None = None
    if len(view) < len(MAGIC) or bytes(view[: len(MAGIC)]) != MAGIC:
        problem = "short segment header" if len(view) < len(MAGIC) else "bad segment magic"
        if last and len(view) < len(MAGIC):
            torn = TornTail(seg_id, 0, problem)  # a crash while the head was created
        elif data:
            on_damage(Damage(seg_id, 0, len(view), problem, ""))
    else:
        for item in scan_with_damage(view, seg_id, min(first, len(view)), max_record, last=last):
            if isinstance(item, tuple):
                yield seg_id, *item
            elif isinstance(item, TornTail | ZeroTail):
                torn = item
            else:
                on_damage(item)
    del view
    if isinstance(torn, ZeroTail):  # never written: this segment is done (a fresh head is made)
        log.debug("journal %s: cutting the %d unwritten bytes after offset %d", path.name,
                  len(data) - torn.offset, torn.offset)
    elif torn is not None:  # never fsynced, so never receipted: cut it off
        log.warning("journal %s: %s; truncating %d bytes (a torn tail)", path.name, torn.problem,
                    len(data) - torn.offset)
    if torn is not None:
        with open(path, "r+b") as fh:
            if torn.offset < len(MAGIC):
                fh.truncate(0)
                fh.write(MAGIC)
            else:
                fh.truncate(torn.offset)
            fh.flush()
            os.fsync(fh.fileno())


# ---------------------------------------------------------------------- offline
@dataclass
class SegmentReport:
    segment: int
    size: int
    records: int = 0
    damage: list[Damage] = field(default_factory=list)
    torn_tail: tuple[int, str] | None = None  # (offset, problem) of a last segment's torn tail
    header: str | None = None  # a bad segment header (magic)
    unwritten: int = 0  # bytes preallocated after the written data (a zero tail; not in ``size``)


@dataclass
class JournalReport:
    directory: Path
    segments: list[SegmentReport] = field(default_factory=list)
    checkpoint: str = "none"  # "usable", "none", or why it cannot be used
    missing: list[int] = field(default_factory=list)  # segments gone that compaction did not delete (chain.py)
    checkpoint_loss: str = ""  # what the checkpoint proves lost ("" nothing)

    @property
    def damaged(self) -> list[SegmentReport]:
        return [s for s in self.segments if s.damage or s.header]

    @property
    def lost(self) -> bool:
        """Records are proved gone: a missing segment, or a checkpoint that proves loss
        (the broker refuses to start until ``repair`` has recorded it)."""
        return bool(self.missing or self.checkpoint_loss)

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.lost

    def summary(self, most: int = 5) -> str:
        """What reads back damaged or is missing, in one line ("" when nothing is): each
        damaged region, unreadable segment, the missing segments, what the checkpoint
        proves lost (a pair's node says this when it will not serve its journal)."""
        parts = [str(d) for s in self.damaged for d in s.damage]
        parts += [f"segment {s.segment}: {s.header}" for s in self.damaged if s.header]
        if self.missing:
            parts.append(f"segments {self.missing[:10]} missing")
        if self.checkpoint_loss:
            parts.append(f"the checkpoint proves loss: {self.checkpoint_loss}")
        return "; ".join(parts[:most]) + (f" (and {len(parts) - most} more)" if len(parts) > most else "")

    def lines(self) -> list[str]:
        out = [f"journal {self.directory}: {len(self.segments)} segments, "
               f"{sum(s.records for s in self.segments)} intact records"]
        for s in self.segments:
            note = ""
            if s.header:
                note = f"; {s.header}: the segment cannot be read"
            elif s.damage:
                note = f"; DAMAGED ({len(s.damage)} regions)"
            elif s.torn_tail:
                note = f"; a torn tail at offset {s.torn_tail[0]} ({s.torn_tail[1]}): cut off at the next start"
            if s.unwritten:
                note += f"; {s.unwritten} bytes preallocated after them"
            out.append(f"  seg-{s.segment:010d}.log: {s.size} bytes, {s.records} records{note}")
            out.extend(f"    {d}" for d in s.damage)
        if self.missing:
            names = ", ".join(f"seg-{s:010d}.log" for s in self.missing[:10])
            out.append(f"MISSING {len(self.missing)} segments that compaction did not delete: {names}"
                       f"{' ...' if len(self.missing) > 10 else ''} (their records are lost; the broker refuses to "
                       "start until `amq broker repair` records the loss)")
        out.append(f"checkpoint: {self.checkpoint}")
        if self.ok:
            out.append("no damage")
        else:
            if self.damaged:
                out.append(f"{len(self.damaged)} damaged segments: `amq broker repair` salvages their intact records "
                           "(and keeps the originals in journal/quarantine/)")
            if self.lost:
                out.append("records are lost: `amq broker repair` records the loss and quarantines the checkpoint; "
                           "the broker then starts without them")
        return out


def _segments(journal: Path) -> list[int]:
    return sorted(i for p in journal.glob("seg-*.log") if (i := segment_id(p)) is not None)


def verify(journal: Path, max_record: int = MAX_RECORD) -> JournalReport:
    """Read every segment of the journal directory ``journal``; change nothing."""
    report = JournalReport(journal)
    ids = _segments(journal)
    for n, seg in enumerate(ids):
        data = (journal / f"seg-{seg:010d}.log").read_bytes()
        sr = SegmentReport(seg, len(data))
        report.segments.append(sr)
        if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
            if data:
                sr.header = "short segment header" if len(data) < len(MAGIC) else "bad segment magic"
            continue
        view = memoryview(data)
        for item in scan_with_damage(view, seg, len(MAGIC), max_record, last=n == len(ids) - 1):
            if isinstance(item, Damage):
                sr.damage.append(item)
            elif isinstance(item, TornTail):
                sr.torn_tail = (item.offset, item.problem)
            elif isinstance(item, ZeroTail):
                sr.size, sr.unwritten = item.offset, len(data) - item.offset
            else:
                sr.records += 1
        del view
    chain = read_chain(journal) or Chain.of(ids)
    report.missing = chain.missing(ids)
    try:
        load(journal, ids, chain)
        report.checkpoint = "usable"
    except CheckpointProvesLoss as exc:
        report.checkpoint_loss = str(exc)
        report.checkpoint = f"PROVES LOSS ({exc}): the broker refuses to start until `amq broker repair`"
    except CheckpointError as exc:
        report.checkpoint = "none" if str(exc) == "no checkpoint" else f"not usable ({exc}): the next start replays everything"
    except OSError as exc:
        report.checkpoint = f"unreadable ({exc})"
    return report


def quarantine_journal(data_dir: Path, now: float | None = None) -> Path | None:
    """Move ``data_dir/journal`` whole into ``data_dir/quarantine/<UTC time>/`` (a rename:
    nothing is copied or deleted); returns where, None when there is no journal. A pair's
    node does this with a damaged journal before it resyncs from its peer."""
    journal = data_dir / "journal"
    if not journal.is_dir():
        return None
    dest = data_dir / QUARANTINE / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    dest.mkdir(parents=True, exist_ok=True)
    os.replace(journal, dest / "journal")
    return dest / "journal"


def repair(journal: Path, max_record: int = MAX_RECORD, now: float | None = None) -> tuple[JournalReport, Path | None]:
    """Salvage the damaged segments of ``journal`` (see the module docstring); returns the
    report of what was found and the quarantine directory (None: nothing to repair).
    The caller holds the journal's lock."""
    report = verify(journal, max_record)
    if report.ok:
        return report, None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    quarantine = journal / QUARANTINE / stamp
    quarantine.mkdir(parents=True, exist_ok=True)
    for sr in report.damaged:
        path = journal / f"seg-{sr.segment:010d}.log"
        shutil.copy2(path, quarantine / path.name)
        data = path.read_bytes()
        kept = [MAGIC]
        if not sr.header:
            view = memoryview(data)
            last = sr is report.segments[-1]
            for item in scan_with_damage(view, sr.segment, len(MAGIC), max_record, last=last):
                if isinstance(item, tuple):
                    offset, payload, _rec = item
                    kept.append(bytes(view[offset : offset + FRAME.size + len(payload)]))
            del view
        tmp = path.with_suffix(".repair")
        with open(tmp, "wb") as fh:
            fh.write(b"".join(kept))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    ckpt = journal / "checkpoint"
    if ckpt.exists():  # positions in the segments moved: the next start replays everything
        os.replace(ckpt, quarantine / ckpt.name)
    if report.lost:  # what is gone cannot be salvaged: note it, and record it so the broker starts
        (quarantine / "LOST.txt").write_text("\n".join(report.lines()) + "\n", encoding="utf-8")
        if report.missing:
            write_chain(journal, (read_chain(journal) or Chain.of(_segments(journal))).plus(report.missing))
    fsync_dir(journal)
    return report, quarantine
