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
logs why and replays the whole journal: a bad checkpoint costs time, never state.

Compaction and checkpoints. Deleting a segment could make the current checkpoint
stale (its live messages' acks may go with another deleted segment). So when the
store writes periodic checkpoints, compaction's dead segments are deleted only once a
checkpoint taken after their death is published (:meth:`Checkpointer.delete_segments`).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from amqtransport.errors import ServerError

from .journal import MAGIC, JournalError
from .pages import SEG_SHIFT, PageList, id_hash
from .records import Sub, decode, encode

if TYPE_CHECKING:
    from .store import MessageStore

__all__ = ["Checkpointer", "Capture", "load", "serialize", "FILE", "CheckpointError"]

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


def capture(store: MessageStore) -> Capture:
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


def load(directory: Path, segments: Sequence[int]) -> Capture:
    """The checkpoint of the journal in ``directory``; :class:`CheckpointError` (with the
    reason) when there is none or it cannot be trusted."""
    path = directory / FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError("no checkpoint") from None
    cap = parse(data)
    check_against(cap, directory, segments)
    return cap


def restore(store: MessageStore, cap: Capture) -> None:
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


def write_file(directory: Path, cap: Capture, *, fsync: bool = True,
               ready: Callable[[], None] | None = None) -> int:
    """Write ``checkpoint.tmp`` (streamed: the header's CRC and length are written last,
    over a placeholder), call ``ready`` (which may raise to give up: the records the
    checkpoint covers must be durable first), fsync, rename over ``checkpoint``, fsync
    the directory. Returns the file's size."""
    tmp = directory / (FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, bytes(_HEAD.size))
        crc = 0
        size = 0
        for part in body_parts(cap):
            view = memoryview(part).cast("B")
            crc = zlib.crc32(view, crc)
            size += len(view)
            _write_all(fd, view)
        os.pwrite(fd, _HEAD.pack(_MAGIC, crc, size), 0)
        if ready is not None:
            ready()
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / FILE)
    if fsync:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return _HEAD.size + size


def _write_all(fd: int, data: memoryview | bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# ---------------------------------------------------------------------- the store's writer
class Checkpointer:
    """When and how a store writes its checkpoints, and recovery from them."""

    def __init__(self, store: MessageStore, *, interval: int, enabled: bool) -> None:
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
        why = "checkpoints are off"
        if self.enabled:
            try:
                cap = load(store.directory, journal.existing_segments())
            except (CheckpointError, OSError) as exc:
                why = str(exc)
            else:
                restore(store, cap)
                n = store.replay((cap.segment, cap.offset))
                existing = set(journal.segments)
                missing = sorted(s for s in store._seg_live if s not in existing)  # noqa: SLF001
                if not missing:
                    return f"recovered from the checkpoint at segment {cap.segment} offset {cap.offset} + {n} records"
                why = f"the checkpoint is stale: it counts live messages in deleted segments {missing[:5]}"
                store.reset_state()
            level = logging.INFO if why == "no checkpoint" else logging.WARNING
            log.log(level, "store %s: %s; replaying the whole journal", store.directory, why)
        n = store.replay(None)
        return f"replayed the whole journal ({n} records; {why})"

    # ---------------------------------------------------------------- writing
    def appended(self) -> None:
        """After an append (loop): start a background checkpoint when one is due."""
        if self.interval and self._thread is None:
            due = max(self.interval, self.last_size)
            if self.store.journal.appended_bytes - self._last_bytes >= due:
                self.start_background()

    def after_full_replay(self) -> None:
        """A whole journal was replayed: checkpoint it (in the background) so the next
        recovery need not."""
        if self.enabled and self.interval and self._thread is None:
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
            if self._thread is None:
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
            log.warning("store %s: checkpoint not written: %s", self.store.directory, exc)
            self.store.journal.post(lambda: self._done(False, 0, []))
            return
        self.store.journal.post(lambda: self._done(True, size, deletes))

    def _done(self, ok: bool, size: int, deletes: list[int]) -> None:
        self._thread = None
        if ok:
            self.written += 1
            self.last_size = size
            log.debug("store %s: checkpoint written (%d bytes)", self.store.directory, size)
            if deletes and self.store.journal.failed is None and not self.holds:
                self.pending_deletes.difference_update(deletes)
                self.store.delete_now(deletes)
        self._deletes_due()

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
