"""The segment chain: which journal segments were created and which compaction deleted,
so a missing one is noticed.

Theory of operation
-------------------
Segment ids only grow (``seg-<id>.log``; recovery starts a new head after the highest
ever created) and compaction deletes the dead ones, in any order. So a segment id that
is not on disk is either compaction's doing or a loss (a file deleted by hand, a restore
that missed one, a file system that lost it), and only a durable record tells which.
That record is ``<journal>/deleted-segments``: ``floor`` (every id below it is gone
legitimately), the ids at or above it compaction deleted, ``top`` (the highest id ever
created), and the journal's identity (a random id made with the record; checkpoints
carry it), as one JSON line with a CRC32, replaced atomically (:func:`.files.replace_file`).

Two writes keep it true, each durable before what it covers happens:

* :meth:`~.journal.Journal.delete_segments` records the ids *before* it hands them to
  the writer that unlinks them, so a crash in between leaves a file recorded as deleted
  that still exists (harmless: it is read as usual), never a deleted file that is not
  recorded.
* the writer records a new segment's id as ``top`` once the segment exists (created,
  its header synced, the directory synced) and *before* the first record is written
  into it (:meth:`~.journal.Journal.record_created`; a rollover, so rare and cheap). A
  crash in between leaves a segment newer than ``top`` holding no record (harmless:
  the next start records it), never a segment with records that ``top`` does not cover.

:meth:`Chain.missing` is a *proof* of loss: an id from ``floor`` up to the highest
segment on disk or ``top``, whichever is higher, that is neither there nor recorded as
deleted was written and is gone -- the newest segments too (losing them leaves no gap,
but ``top`` still names them). Recovery refuses to start on one (:class:`SegmentsLost`,
naming the files and pointing to ``amq broker verify`` / ``repair``); ``amq broker
repair`` records the loss (:meth:`Chain.plus`) after keeping a note of it in
``quarantine/``, and the broker then starts knowingly without those records (its new
head after ``top``: an id is never used twice). A journal without the file (a new one,
or one written before it was kept) gets one recording the ids it has: floor = its lowest
id, every gap above as deleted and ``top`` its highest -- nothing can be proved about
what went before; a record written before ``top`` was kept reads as ``top`` 0 (nothing
known) until the next segment is created.
"""

from __future__ import annotations

import json
import logging
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .files import replace_file, write_all
from .segments import JournalError, segment_name

__all__ = ["CHAIN_FILE", "Chain", "SegmentsLost", "check_chain", "read_chain", "write_chain", "describe_missing"]

log = logging.getLogger(__name__)

CHAIN_FILE = "deleted-segments"


class SegmentsLost(JournalError):
    """Segments of the journal are gone that compaction did not delete: recovery refuses."""


def new_journal_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Chain:
    """Segment ids compaction deleted: every id below ``floor``, and ``ids``; the highest
    id ever created (``top``; 0: not known); and the journal's identity (``journal``,
    made with the record: a checkpoint carries it, so a checkpoint from another journal
    proves nothing about this one)."""

    floor: int = 1
    ids: frozenset[int] = frozenset()
    journal: str = field(default_factory=new_journal_id)
    top: int = 0

    def __contains__(self, seg: object) -> bool:
        return isinstance(seg, int) and (seg < self.floor or seg in self.ids)

    def plus(self, deleted: Iterable[int]) -> Chain:
        ids = set(self.ids) | {s for s in deleted if s >= self.floor}
        floor = self.floor
        while floor in ids:
            ids.discard(floor)
            floor += 1
        return Chain(floor, frozenset(ids), self.journal, self.top)

    def created(self, seg: int) -> Chain:
        """The chain once segment ``seg`` exists (``top`` raised to it)."""
        return Chain(self.floor, self.ids, self.journal, max(self.top, seg))

    def missing(self, existing: Sequence[int]) -> list[int]:
        """Ids up to the highest of ``existing`` and ``top`` that are neither there nor deleted."""
        have = set(existing)
        high = max(have | {self.top})
        return [s for s in range(self.floor, high + 1) if s not in have and s not in self.ids]

    @classmethod
    def of(cls, existing: Sequence[int]) -> Chain:
        """The chain of a journal that kept no record: every gap counts as deleted."""
        if not existing:
            return cls()
        have = set(existing)
        low = min(have)
        return cls(low, frozenset(s for s in range(low, max(have)) if s not in have), top=max(have))


def _encode(chain: Chain) -> bytes:
    body = json.dumps({"floor": chain.floor, "deleted": sorted(chain.ids), "journal": chain.journal,
                       "top": chain.top}, sort_keys=True)
    return json.dumps({"chain": body, "crc": zlib.crc32(body.encode())}).encode() + b"\n"


def read_chain(directory: Path) -> Chain | None:
    """The journal's record of deleted segments; None when it has none (or it cannot be
    trusted: then nothing is proved, and the log says why)."""
    path = directory / CHAIN_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        outer = json.loads(raw)
        body = outer["chain"]
        if zlib.crc32(body.encode()) != outer["crc"]:
            raise ValueError("checksum mismatch")
        inner = json.loads(body)
        chain = Chain(int(inner["floor"]), frozenset(int(s) for s in inner["deleted"]), str(inner["journal"]),
                      int(inner.get("top", 0)))  # a record from before ``top`` was kept: nothing known
        if chain.floor < 1 or chain.top < 0 or any(s < chain.floor for s in chain.ids):
            raise ValueError(f"impossible ids (floor {chain.floor}, top {chain.top})")
        return chain
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("journal %s: %s is unreadable (%s): a missing segment cannot be told from a deleted one",
                  directory, CHAIN_FILE, exc)
        return None


def write_chain(directory: Path, chain: Chain, *, fsync: bool = True) -> None:
    """Replace the record atomically (temp file, fsync, rename, fsync of the directory)."""
    data = _encode(chain)
    replace_file(directory, CHAIN_FILE, lambda fd: write_all(fd, data), fsync=fsync)


def describe_missing(directory: Path, missing: Sequence[int]) -> str:
    names = ", ".join(segment_name(s) for s in missing[:10]) + (" ..." if len(missing) > 10 else "")
    return (f"journal {directory}: {len(missing)} segment(s) missing that compaction did not delete ({names}): "
            f"the records they held are lost. The broker refuses to start on them: `amq broker verify "
            f"{directory.parent}` reports, `amq broker repair {directory.parent}` records the loss (keeping a note "
            "in journal/quarantine/) and the broker then starts without them")


def check_chain(directory: Path, existing: Sequence[int], *, fsync: bool = True) -> Chain:
    """The journal's record (one is written now for a journal without it); raises
    :class:`SegmentsLost` when a segment is missing that compaction did not delete."""
    chain = read_chain(directory)
    if chain is None:
        chain = Chain.of(existing)
        if directory.is_dir():
            write_chain(directory, chain, fsync=fsync)
    missing = chain.missing(existing)
    if missing:
        raise SegmentsLost(describe_missing(directory, missing))
    return chain
