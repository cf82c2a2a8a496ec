"""The ``bit-flip`` fault's damage: one bit flipped in one journal record that is not the last.

Theory of operation
-------------------
:func:`flip_bit` runs while the node is down. It lists the journal's segment files
(``seg-<id>.log`` anywhere under the data directory, ``quarantine/`` left out). A
record of a segment that is not the newest (a finished segment: the writer fsynced it
before it opened the next) is *damage* to recovery when it does not check out, never a
torn tail to cut (:mod:`amqtransport.broker.store.salvage`): it skips exactly that
record and reports it. So is a record of the newest segment that has an intact frame
after it. The nemesis's brokers compact every 500 ms, which most of the time leaves a
single segment, so: a record of a finished segment when there is one, else a record of
the newest segment but its last one. Recovery replays only from its checkpoint's
position on (what lies before is in the checkpoint), so a record at or after that
position comes first: the one recovery must read. It picks the record (seeded),
walking the frames with the store's own
:class:`~amqtransport.broker.store.segments.Scan`, flips one bit of the record's
*payload* (its length stays intact: exactly one record is lost on that node) and
fsyncs the file. A pair node whose record was skipped must get it back from its peer
(a resync), so the checker still sees nothing lost.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from amqtransport.broker.store.checkpoint_file import FILE as CHECKPOINT
from amqtransport.broker.store.checkpoint_file import parse
from amqtransport.broker.store.salvage import describe
from amqtransport.broker.store.segments import FRAME, MAGIC, MAX_RECORD, Scan, segment_id

__all__ = ["Flip", "finished_segments", "flip_bit"]


@dataclass(frozen=True)
class Flip:
    segment: Path
    frame: int  # the frame's offset in the segment
    byte: int  # the flipped byte's offset in the segment
    bit: int
    record: str  # what the record was

    def describe(self) -> str:
        return (f"bit {self.bit} of byte {self.byte} flipped in {self.segment.name} (the record at offset "
                f"{self.frame}: {self.record})")


def segments(data_dir: Path) -> list[Path]:
    """The segments of ``data_dir``'s journal, oldest first."""
    segs = [(i, p) for p in data_dir.rglob("seg-*.log")
            if "quarantine" not in p.parts and (i := segment_id(p)) is not None]
    segs.sort()
    return [p for _, p in segs]


def finished_segments(data_dir: Path) -> list[Path]:
    """The segments of ``data_dir``'s journal but the newest, oldest first."""
    return segments(data_dir)[:-1]


def replay_start(journal: Path) -> tuple[int, int] | None:
    """(segment, offset) where recovery starts replaying the journal in ``journal`` (its
    checkpoint's position); None when there is no checkpoint it could use."""
    try:
        cap = parse((journal / CHECKPOINT).read_bytes())
    except (OSError, ValueError):
        return None
    return cap.segment, cap.offset


def flip_bit(data_dir: Path, rng: random.Random) -> Flip | None:
    """Flip one bit of one record (see the module docstring); None when the journal
    has no record but the newest segment's last."""
    segs = segments(data_dir)
    candidates: list[tuple[bool, bool, Path, int, int]] = []  # (replayed, finished, segment, offset, length)
    for seg in segs:
        data = seg.read_bytes()
        if not data.startswith(MAGIC):
            continue
        start = replay_start(seg.parent)
        seg_id = segment_id(seg) or 0
        frames = [(off, len(payload)) for off, payload, _rec in Scan(memoryview(data), len(MAGIC), MAX_RECORD)]
        if seg == segs[-1]:
            frames = frames[:-1]  # the newest segment's last record would read as a torn tail
        candidates += [(start is None or (seg_id, off) >= start, seg != segs[-1], seg, off, n) for off, n in frames]
    if not candidates:
        return None
    best = max((replayed, finished) for replayed, finished, *_ in candidates)
    _, _, seg, off, length = rng.choice([c for c in candidates if (c[0], c[1]) == best])
    data = seg.read_bytes()
    byte = off + FRAME.size + rng.randrange(length)
    bit = rng.randrange(8)
    fd = os.open(seg, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([data[byte] ^ (1 << bit)]), byte)
        os.fsync(fd)
    finally:
        os.close(fd)
    return Flip(seg, off, byte, bit, describe(memoryview(data), off, off + FRAME.size + length) or "?")
