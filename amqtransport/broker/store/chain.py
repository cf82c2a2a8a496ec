"""The segment chain: which journal segments compaction deleted, so a missing one is noticed.

Theory of operation
-------------------
Segment ids only grow (``seg-<id>.log``; recovery starts a new head after the highest)
and compaction deletes the dead ones, in any order. So a gap in the ids on disk is
either compaction's doing or a loss (a file deleted by hand, a restore that missed one,
a file system that lost it), and only a durable record of compaction's deletes tells
which. That record is ``<journal>/deleted-segments``: ``floor`` (every id below it is
gone legitimately), the ids at or above it compaction deleted, and the journal's
identity (a random id made with the record; checkpoints carry it), as one JSON line
with a CRC32. :meth:`~.journal.Journal.delete_segments` writes it (temp file, fsync, rename,
fsync of the directory) *before* it hands the ids to the writer that unlinks them, so
a crash in between leaves a file recorded as deleted that still exists (harmless: it is
read as usual), never a deleted file that is not recorded.

:meth:`Chain.missing` is a *proof* of loss: an id between ``floor`` and the highest
segment on disk that is neither there nor recorded as deleted was written and is gone.
Recovery refuses to start on one (:class:`SegmentsLost`, naming the files and pointing
to ``amq broker verify`` / ``repair``); ``amq broker repair`` records the loss
(:meth:`Chain.plus`) after keeping a note of it in ``quarantine/``, and the broker then
starts knowingly without those records. A journal without the file (a new one, or one
written before it was kept) gets one recording the ids it has: floor = its lowest id
and every gap above as deleted -- nothing can be proved about what went before.
Losing the highest segments leaves no gap; the checkpoint proves that loss when there
is one (:mod:`.checkpoint`).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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
    """Segment ids compaction deleted: every id below ``floor``, and ``ids``; and the
    journal's identity (``journal``, made with the record: a checkpoint carries it, so a
    checkpoint from another journal proves nothing about this one)."""

    floor: int = 1
    ids: frozenset[int] = frozenset()
    journal: str = field(default_factory=new_journal_id)

    def __contains__(self, seg: object) -> bool:
        return isinstance(seg, int) and (seg < self.floor or seg in self.ids)

    def plus(self, deleted: Iterable[int]) -> Chain:
        ids = set(self.ids) | {s for s in deleted if s >= self.floor}
        floor = self.floor
        while floor in ids:
            ids.discard(floor)
            floor += 1
        return Chain(floor, frozenset(ids), self.journal)

    def missing(self, existing: Sequence[int]) -> list[int]:
        """Ids below the highest of ``existing`` that are neither there nor deleted."""
        if not existing:
            return []
        have = set(existing)
        return [s for s in range(self.floor, max(have)) if s not in have and s not in self.ids]

    @classmethod
    def of(cls, existing: Sequence[int]) -> Chain:
        """The chain of a journal that kept no record: every gap counts as deleted."""
        if not existing:
            return cls()
        have = set(existing)
        low = min(have)
        return cls(low, frozenset(s for s in range(low, max(have)) if s not in have))


def _encode(chain: Chain) -> bytes:
    body = json.dumps({"floor": chain.floor, "deleted": sorted(chain.ids), "journal": chain.journal}, sort_keys=True)
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
        return Chain(int(inner["floor"]), frozenset(int(s) for s in inner["deleted"]), str(inner["journal"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("journal %s: %s is unreadable (%s): a missing segment cannot be told from a deleted one",
                  directory, CHAIN_FILE, exc)
        return None


def write_chain(directory: Path, chain: Chain, *, fsync: bool = True) -> None:
    """Replace the record atomically (temp file, fsync, rename, fsync of the directory)."""
    tmp = directory / (CHAIN_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, _encode(chain))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / CHAIN_FILE)
    if fsync:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


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
