"""The checkpoint file (:mod:`.checkpoint` writes and loads it): the format, and the
checks that a checkpoint belongs to the journal it is loaded with.

Theory of operation
-------------------
A :class:`Capture` is the store's state at one journal position ``P``. On disk it is
``<journal>/checkpoint``: a header (magic, CRC32 of the body, the body's length) and a
body of sections (the position, the older segments' sizes, the durable subscriptions,
the idempotency keys, the compaction accounting, every destination's paged arrays).
:func:`write_file` streams it into ``checkpoint.tmp`` (the arrays as they are, the
header's CRC and length last) and renames it over the old one only once the records
before ``P`` are durable; a crash leaves the old file or the new one, whole.

Trust (:func:`check_against`): a torn or corrupt file is refused by its CRC; a file
whose ``P`` lies beyond the journal, whose last frame before ``P`` is another, or whose
older segments differ in size or are unknown is from another journal. :func:`load`
raises :class:`CheckpointError` saying which; recovery then replays the whole journal.
But a checkpoint that *proves loss* (:func:`proven_loss`: a segment it knew is gone and
compaction did not delete it, or one is shorter than what it covered as durable) raises
:class:`CheckpointProvesLoss`, and recovery refuses to start (:mod:`.checkpoint`).

Sizes are *written* sizes (:mod:`.segments`, preallocated segments). The checkpoint's
own segment was the head when it was taken, so it may be preallocated: its file is
longer than its data, and data lost from it (what a power loss takes from a
preallocated file reads back as zeros, not as a shorter file) is found by the frame
before ``P``: when it does not check out and only zeros follow from before ``P``, the
segment was cut short (:func:`_cut_short`). An older segment was cut to its written
size when the writer rolled past it; one a crash left with its zero tail does not
match its recorded size, and the checkpoint is not used (the whole journal is replayed).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
import time
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, overload

from amqtransport.errors import ServerError

from .chain import Chain
from .files import replace_file, write_all
from .records import Sub, decode, encode
from .segments import MAGIC

log = logging.getLogger(__name__)

FILE = "checkpoint"
_MAGIC = b"AMQCKPT1"
_HEAD = struct.Struct("<8sIQ")  # magic, crc32 of the body, length of the body
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_KEY = struct.Struct("<dq")
_FRAME = struct.Struct("<II")
VERSION = 1


class CheckpointError(ServerError, ValueError):
    """The checkpoint cannot be used (the message says why)."""


class CheckpointProvesLoss(CheckpointError):
    """The checkpoint proves that journal records it covers are gone (:func:`proven_loss`)."""


@dataclass
class Capture:
    """The store's state at one journal position (see the module docstring)."""

    segment: int
    offset: int
    records: int  # records appended before P in this process (what must be durable)
    last_frame: tuple[int, int] | None  # (offset, crc) of the frame that ends at P, in P's segment
    sizes: dict[int, int]  # segment -> size, for the segments before P's
    count: int
    subs: list[tuple[Sub, int]]
    keys: dict[tuple[str, str], tuple[float, int, int]]
    refs: dict[int, list[int]]
    enqs: dict[int, int]
    seg_live: dict[int, int]
    lists: dict[str, tuple[array[int], array[int], array[float], bool]] = field(default_factory=dict)
    journal: str = ""  # the identity of the journal it was taken from (chain.py; "" unknown)



# ---------------------------------------------------------------------- the file format
def _s16(out: list[bytes], text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    out.append(struct.pack("<H", len(raw)))
    out.append(raw)


def _raw(a: array[int] | array[float]) -> bytes:
    if sys.byteorder != "little":  # pragma: no cover - the format is little endian
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def body_parts(cap: Capture) -> Iterator[bytes | array[int] | array[float]]:
    """The checkpoint's body, piece by piece (the paged lists' arrays as they are: written
    without a copy of a million-message list)."""
    header = {
        "version": VERSION,
        "segment": cap.segment,
        "offset": cap.offset,
        "last_frame": list(cap.last_frame) if cap.last_frame else None,
        "sizes": {str(s): n for s, n in cap.sizes.items()},
        "count": cap.count,
        "created": time.time(),
        "journal": cap.journal,
    }
    out: list[bytes] = []
    hb = json.dumps(header, sort_keys=True).encode()
    out += [_U32.pack(len(hb)), hb]
    out.append(_U32.pack(len(cap.subs)))
    for sub, seg in cap.subs:
        raw = encode(sub)
        out += [_U32.pack(len(raw)), raw, _U64.pack(seg)]
    out.append(_U32.pack(len(cap.keys)))
    for (scope, key), (ts, seg, _serial) in sorted(cap.keys.items(), key=lambda kv: kv[1][0]):
        _s16(out, scope)
        _s16(out, key)
        out.append(_KEY.pack(ts, seg))
    out.append(_U32.pack(len(cap.refs)))
    for seg, refs in cap.refs.items():
        out += [_U64.pack(seg), _U32.pack(len(refs)), array("Q", refs).tobytes() if refs else b""]
    for table in (cap.enqs, cap.seg_live):
        out.append(_U32.pack(len(table)))
        flat = array("Q")
        for seg, n in table.items():
            flat.append(seg)
            flat.append(n)
        out.append(_raw(flat))
    out.append(_U32.pack(len(cap.lists)))
    yield b"".join(out)
    for dest, (pos, ids, times, ordered) in cap.lists.items():
        head: list[bytes] = []
        _s16(head, dest)
        head += [_U64.pack(len(pos)), bytes((1 if ordered else 0,))]
        yield b"".join(head)
        for a in (pos, ids, times):
            yield _native(a)


def _native(a: array[int] | array[float]) -> array[int] | array[float]:
    """``a`` in the file's byte order (little endian): itself on this machine's usual order."""
    if sys.byteorder != "little":  # pragma: no cover - the format is little endian
        a = array(a.typecode, a)
        a.byteswap()
    return a


def serialize(cap: Capture) -> bytes:
    """The checkpoint file's bytes (in one piece; :func:`write_file` streams them)."""
    body = b"".join(bytes(p) for p in body_parts(cap))
    return _HEAD.pack(_MAGIC, zlib.crc32(body), len(body)) + body


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> memoryview:
        end = self.at + n
        if end > len(self.data):
            raise CheckpointError("checkpoint is cut short inside its body")
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self.take(8))[0])

    def s16(self) -> str:
        (n,) = struct.unpack("<H", self.take(2))
        return bytes(self.take(n)).decode("utf-8", "surrogatepass")

    @overload
    def array(self, typecode: Literal["Q"], n: int) -> array[int]: ...
    @overload
    def array(self, typecode: Literal["d"], n: int) -> array[float]: ...
    def array(self, typecode: str, n: int) -> array[int] | array[float]:
        a = array(typecode)
        a.frombytes(self.take(8 * n))
        if sys.byteorder != "little":  # pragma: no cover
            a.byteswap()
        return a


def parse(data: bytes) -> Capture:
    """The capture a checkpoint file holds; :class:`CheckpointError` when it is torn or corrupt."""
    if len(data) < _HEAD.size:
        raise CheckpointError("checkpoint shorter than its header (torn)")
    magic, crc, length = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC:
        raise CheckpointError("not a checkpoint (bad magic)")
    body = memoryview(data)[_HEAD.size :]
    if len(body) != length:
        raise CheckpointError(f"checkpoint body is {len(body)} bytes, its header says {length} (torn)")
    if zlib.crc32(body) != crc:
        raise CheckpointError("checkpoint checksum mismatch (corrupt)")
    try:
        return _parse_body(_Reader(body))
    except (struct.error, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"checkpoint body is malformed: {exc}") from exc


def _parse_body(r: _Reader) -> Capture:
    header = json.loads(bytes(r.take(r.u32())))
    if header.get("version") != VERSION:
        raise CheckpointError(f"checkpoint version {header.get('version')!r} is not {VERSION}")
    lf = header["last_frame"]
    cap = Capture(
        segment=int(header["segment"]),
        offset=int(header["offset"]),
        records=0,
        last_frame=(int(lf[0]), int(lf[1])) if lf else None,
        sizes={int(s): int(n) for s, n in header["sizes"].items()},
        count=int(header["count"]),
        subs=[],
        keys={},
        refs={},
        enqs={},
        seg_live={},
        journal=str(header.get("journal") or ""),
    )
    for _ in range(r.u32()):
        sub = decode(bytes(r.take(r.u32())))
        if not isinstance(sub, Sub):
            raise CheckpointError("checkpoint holds a subscription that is not a Sub record")
        cap.subs.append((sub, r.u64()))
    for serial in range(r.u32()):
        scope, key = r.s16(), r.s16()
        ts, seg = _KEY.unpack(r.take(_KEY.size))
        cap.keys[(scope, key)] = (ts, seg, serial)
    for _ in range(r.u32()):
        seg = r.u64()
        n = r.u32()
        cap.refs[seg] = list(r.array("Q", n)) if n else []
    for table in (cap.enqs, cap.seg_live):
        n = r.u32()
        flat = r.array("Q", 2 * n)
        for i in range(0, 2 * n, 2):
            table[int(flat[i])] = int(flat[i + 1])
    for _ in range(r.u32()):
        dest = r.s16()
        n = r.u64()
        ordered = r.take(1)[0] == 1
        pos = r.array("Q", n)
        ids = r.array("Q", n)
        ts = r.array("d", n)
        cap.lists[dest] = (pos, ids, ts, ordered)
    if r.at != len(r.data):
        raise CheckpointError(f"{len(r.data) - r.at} bytes after the checkpoint's last section")
    return cap


def check_against(cap: Capture, directory: Path, segments: Sequence[int]) -> None:
    """:class:`CheckpointError` unless ``cap`` was taken from the journal in ``directory``
    (its segments now: ``segments``)."""
    head = directory / f"seg-{cap.segment:010d}.log"
    try:
        size = head.stat().st_size
    except FileNotFoundError:
        raise CheckpointError(f"its segment {cap.segment} is gone") from None
    if size < cap.offset:
        raise CheckpointError(f"segment {cap.segment} has {size} bytes, the checkpoint covers {cap.offset}")
    if cap.last_frame is not None:
        off, crc = cap.last_frame
        with open(head, "rb") as fh:
            fh.seek(off)
            raw = fh.read(_FRAME.size)
        if len(raw) < _FRAME.size:
            raise CheckpointError(f"no frame at segment {cap.segment} offset {off}")
        length, got = _FRAME.unpack(raw)
        if got != crc or off + _FRAME.size + length != cap.offset:
            raise CheckpointError(f"the frame before segment {cap.segment} offset {cap.offset} is not the one it "
                                  "was taken after (another journal?)")
    elif cap.offset != len(MAGIC):
        raise CheckpointError("a checkpoint inside a segment must name the frame before it")
    for seg in segments:
        if seg >= cap.segment:
            continue
        if seg not in cap.sizes:
            raise CheckpointError(f"segment {seg} is older than the checkpoint but unknown to it (another journal?)")
        actual = (directory / f"seg-{seg:010d}.log").stat().st_size
        if actual != cap.sizes[seg]:
            raise CheckpointError(f"segment {seg} has {actual} bytes, {cap.sizes[seg]} when the checkpoint was taken")


def proven_loss(cap: Capture, directory: Path, segments: Sequence[int], deleted: Chain) -> str | None:
    """What ``cap`` proves lost from the journal (its segments now: ``segments``;
    ``deleted``: those compaction deleted, :mod:`.chain`), or None: a segment it knew
    that is gone and was not deleted, or one cut shorter than it was when ``cap`` was
    taken (everything before ``P`` was durable then). Only a checkpoint of this very
    journal (the identity in ``deleted``) proves anything."""
    if not cap.journal or cap.journal != deleted.journal:
        return None
    existing = set(segments)
    gone = sorted(s for s in {cap.segment, *cap.sizes} if s not in existing and s not in deleted)
    if gone:
        return (f"segments {gone[:10]} existed when the checkpoint was taken and were not deleted by compaction; "
                "they are gone")
    for seg, size in sorted({**cap.sizes, cap.segment: cap.offset}.items()):
        if seg not in existing:
            continue
        path = directory / f"seg-{seg:010d}.log"
        actual = path.stat().st_size
        if actual >= size and seg == cap.segment and cap.last_frame is not None:
            actual = _cut_short(path, cap.last_frame[0], size) or actual
        if actual < size:
            return f"segment {seg} has {actual} bytes, the checkpoint covers {size} of it as durable: it was cut short"
    return None


def _cut_short(path: Path, frame: int, size: int) -> int | None:
    """Where the written data of ``path`` (preallocated: only zeros after it) ends, when
    that is before ``size`` and the frame at offset ``frame`` (the one that ends at
    ``size``) does not check out; None when the data is there (see the module docstring)."""
    with open(path, "rb") as fh:
        fh.seek(frame)
        head = fh.read(_FRAME.size)
        if len(head) == _FRAME.size:
            length, crc = _FRAME.unpack(head)
            if frame + _FRAME.size + length == size and zlib.crc32(fh.read(length)) == crc:
                return None  # the frame before P is whole
        fh.seek(0)
        data = fh.read()
    end = len(data.rstrip(b"\0"))  # after the last non-zero byte: zeros after it were never written
    return end if end < size else None


def load(directory: Path, segments: Sequence[int], deleted: Chain | None = None) -> Capture:
    """The checkpoint of the journal in ``directory``; :class:`CheckpointError` (with the
    reason) when there is none or it cannot be trusted; :class:`CheckpointProvesLoss`
    when it proves that records it covers are gone (``deleted``: the segments compaction
    deleted, :func:`proven_loss`)."""
    path = directory / FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError("no checkpoint") from None
    cap = parse(data)
    if deleted is not None and cap.journal and cap.journal != deleted.journal:
        raise CheckpointError("the checkpoint was taken from another journal (its identity differs)")
    if deleted is not None and (loss := proven_loss(cap, directory, segments, deleted)) is not None:
        raise CheckpointProvesLoss(loss)
    check_against(cap, directory, segments)
    return cap


def write_file(directory: Path, cap: Capture, *, fsync: bool = True,
               ready: Callable[[], None] | None = None) -> int:
    """Write ``checkpoint.tmp`` (streamed: the header's CRC and length are written last,
    over a placeholder), call ``ready`` (which may raise to give up: the records the
    checkpoint covers must be durable first), fsync, rename over ``checkpoint``, fsync
    the directory. Returns the file's size."""
    size = 0

    def write(fd: int) -> None:
        nonlocal size
        write_all(fd, bytes(_HEAD.size))
        crc = 0
        for part in body_parts(cap):
            view = memoryview(part).cast("B")
            crc = zlib.crc32(view, crc)
            size += len(view)
            write_all(fd, view)
        os.pwrite(fd, _HEAD.pack(_MAGIC, crc, size), 0)

    replace_file(directory, FILE, write, fsync=fsync, ready=ready)
    return _HEAD.size + size
