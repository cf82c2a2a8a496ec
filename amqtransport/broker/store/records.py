"""Journal records and their binary encoding.

Every state change the store must survive a crash for is one record:

========  =====================================================================
``Enq``     a persistent message was accepted (carries the whole message); with
            ``relocated`` it is compaction's re-written copy of a live message
            (type 11), which supersedes the older copy
``Ack``     messages were consumed (removed) — one record may name many ids, of one
            ``destination`` (type 9; ``""``: not said, type 2, journals of older versions)
``Move``    a message moved to another destination (dead-letter queue), from
            ``source`` (type 10; ``""``: not said, type 3)
``Tx``      a transaction commit: its sub-records (``Enq``, ``Ack``, ``Move``,
            ``Keys``) are applied all or nothing, because they share one checksum
``Keys``    idempotency keys with their destination (the dedupe window): carried
            forward by compaction, and the key of a topic message's durable copies
``Sub``     a durable topic subscription exists, with its selector if it has one (type 12;
            type 6 without) and the login that owns it if the broker has users (type
            13, selector and owner); carried forward by compaction
``Unsub``   a durable topic subscription was removed
``Fan``     a persistent topic message for its durable subscriptions, stored once
            (type 14, format version 2): the message as published and one reference
            per subscription queue it is for -- a 64-bit hash of the queue's name,
            with the name itself the first time the segment refers to that queue
            (:mod:`.fanout`); each reference is one live copy
========  =====================================================================

Format versions. Version 1 wrote a topic message once per durable subscription (an
``Enq`` each, in one ``Tx``); version 2 (:data:`FORMAT_VERSION`) adds ``Fan``. Every
version-1 record still decodes the same, so a journal written before ``Fan`` recovers
unchanged; a broker of version 1 reading a version-2 journal would take a ``Fan`` for
damage (an unknown record type), so a downgrade needs an empty journal.

Encoding (little endian): one type byte, then the fields; strings are ``u16`` length
+ UTF-8 (header values ``u32``), bytes ``u32`` length + raw. :func:`encode` and
:func:`decode` are exact inverses; :func:`decode` raises :class:`RecordError` (never
another exception) on anything malformed, so recovery can treat it as corruption.
The journal adds framing (length + CRC32) around the payloads produced here.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from amqtransport.errors import ServerError

from ..dispatch.message import Message

__all__ = [
    "Enq",
    "Ack",
    "Move",
    "Tx",
    "TxPart",
    "Keys",
    "Sub",
    "Unsub",
    "Fan",
    "FORMAT_VERSION",
    "Record",
    "RecordError",
    "RecordTooLarge",
    "encode",
    "decode",
    "enq_expires",
    "enq_fields",
    "header_needles",
]


class RecordError(ServerError, ValueError):
    """A record payload could not be decoded (or a record could not be encoded)."""


class RecordTooLarge(RecordError):
    """A record is larger than the journal can read back (it is never written)."""


@dataclass(frozen=True, slots=True)
class Enq:
    message: Message
    relocated: bool = False  # compaction's copy of a message already live (supersedes it)


@dataclass(frozen=True, slots=True)
class Ack:
    ids: tuple[str, ...]
    destination: str = ""  # where the messages were ("": not said; any)


@dataclass(frozen=True, slots=True)
class Move:
    id: str
    destination: str
    source: str = ""  # where the message was ("": not said; any)


@dataclass(frozen=True, slots=True)
class Keys:
    """Idempotency keys: ``(destination, key, accepted-at wall clock)`` each.

    Written with type byte 8; type 5 (keys without a destination, from journals older
    than per-destination scoping) still decodes, with destination ``""`` (any).
    """

    keys: tuple[tuple[str, str, float], ...]


@dataclass(frozen=True, slots=True)
class Fan:
    """A topic message stored once for its durable subscriptions: ``refs`` are
    ``(hash of the queue name, the name or "")`` -- the name is written only where the
    segment does not name that queue yet (:mod:`.fanout`). ``copies`` (the writer's side
    only; never encoded), one per reference: the copy the dispatch core holds, or the
    queue's name when the copy goes straight to the queue's paged list."""

    message: Message
    refs: tuple[tuple[int, str], ...]
    copies: tuple[Message | str, ...] = field(default=(), compare=False)


TxPart = Enq | Ack | Move | Keys | Fan


@dataclass(frozen=True, slots=True)
class Tx:
    records: tuple[TxPart, ...]


@dataclass(frozen=True, slots=True)
class Sub:
    """A durable topic subscription: messages for ``topic`` (matching ``selector``, a
    JMS selector; ``""``: all) are copied to ``queue``; ``owner``: the login that made
    it (``""``: a broker without users, or a journal of an older version)."""

    queue: str
    topic: str
    client_id: str
    name: str
    selector: str = ""
    owner: str = ""


@dataclass(frozen=True, slots=True)
class Unsub:
    queue: str


Record = Enq | Ack | Move | Tx | Keys | Sub | Unsub | Fan

FORMAT_VERSION = 2  # 1: one Enq per durable subscription; 2: Fan (see the module docstring)

T_ENQ, T_ACK, T_MOVE, T_TX, T_KEYS_UNSCOPED, T_SUB, T_UNSUB, T_KEYS, T_ACK_IN, T_MOVE_FROM, T_ENQ_AGAIN = range(1, 12)
T_SUB_SELECTOR = 12
T_SUB_OWNED = 13
T_FAN = 14

_H = struct.Struct("<H")
_Q = struct.Struct("<Q")
_QH = struct.Struct("<QH")
_I = struct.Struct("<I")
_D = struct.Struct("<d")
# type, len(id), len(destination), len(key), timestamp, expires, delivery_count, len(headers), len(body)
_ENQ_HEAD = struct.Struct("<BHHHddIII")
_ENQ_HEAD_AT = _ENQ_HEAD.unpack_from
_ENQ_FIELDS = _ENQ_HEAD.size  # where an Enq's variable-length fields start
_json_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False).encode


def _s16(out: list[bytes], text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > 0xFFFF:
        raise RecordError(f"string too long for a record field ({len(raw)} bytes)")
    out.append(_H.pack(len(raw)))
    out.append(raw)


_last_bare: tuple[object, bytes] = (None, b"")  # the last unnamed references encoded, by identity


def _remember_bare(refs: object, data: bytes) -> None:
    global _last_bare
    _last_bare = (refs, data)  # one assignment: a reader on another thread sees a consistent pair


def _b32(out: list[bytes], raw: bytes) -> None:
    out.append(_I.pack(len(raw)))
    out.append(raw)


def _encode_into(out: list[bytes], rec: Record) -> None:
    if isinstance(rec, Enq):
        out.append(encode_enq(rec.message, T_ENQ_AGAIN if rec.relocated else T_ENQ))
    elif isinstance(rec, Ack):
        if rec.destination:
            out.append(bytes((T_ACK_IN,)))
            _s16(out, rec.destination)
        else:
            out.append(bytes((T_ACK,)))
        out.append(_I.pack(len(rec.ids)))
        for i in rec.ids:
            _s16(out, i)
    elif isinstance(rec, Move):
        out.append(bytes((T_MOVE_FROM if rec.source else T_MOVE,)))
        _s16(out, rec.id)
        _s16(out, rec.destination)
        if rec.source:
            _s16(out, rec.source)
    elif isinstance(rec, Tx):
        out.append(bytes((T_TX,)))
        out.append(_I.pack(len(rec.records)))
        for sub in rec.records:
            if isinstance(sub, Tx):
                raise RecordError("nested transaction record")
            inner = encode(sub)
            _b32(out, inner)
    elif isinstance(rec, Keys):
        out.append(bytes((T_KEYS,)))
        out.append(_I.pack(len(rec.keys)))
        for scope, key, ts in rec.keys:
            _s16(out, scope)
            _s16(out, key)
            out.append(_D.pack(ts))
    elif isinstance(rec, Sub):
        out.append(bytes((T_SUB_OWNED if rec.owner else T_SUB_SELECTOR if rec.selector else T_SUB,)))
        for text in (rec.queue, rec.topic, rec.client_id, rec.name):
            _s16(out, text)
        if rec.selector or rec.owner:
            _s16(out, rec.selector)
        if rec.owner:
            _s16(out, rec.owner)
    elif isinstance(rec, Unsub):
        out.append(bytes((T_UNSUB,)))
        _s16(out, rec.queue)
    elif isinstance(rec, Fan):
        out.append(bytes((T_FAN,)))
        _b32(out, encode_enq(rec.message))
        out.append(_I.pack(len(rec.refs)))
        refs, last = rec.refs, _last_bare
        if refs is last[0]:  # the same references as the last record (a group's, fanout.py)
            out.append(last[1])
            return
        if not any(name for _h, name in refs):  # the common case: no name written
            _remember_bare(refs, b"".join([_QH.pack(h, 0) for h, _name in refs]))
            out.append(_last_bare[1])
            return
        for h, name in rec.refs:
            if name:
                out.append(_Q.pack(h))
                _s16(out, name)
            else:
                out.append(_QH.pack(h, 0))
    else:  # pragma: no cover - typing guards this
        raise RecordError(f"not a record: {rec!r}")


def _encode_headers(headers: tuple[tuple[str, str], ...]) -> bytes:
    """NUL-separated names and values (C-speed join/split); JSON if a NUL occurs inside."""
    if not headers:
        return b"\x00"
    flat = "\x00".join(itertools.chain.from_iterable(headers))
    if flat.count("\x00") == 2 * len(headers) - 1:
        return b"\x00" + flat.encode("utf-8", "surrogatepass")
    return _json_dumps(headers).encode("ascii")


def header_needles(pairs: Sequence[tuple[str, str]]) -> tuple[bytes, ...]:
    """Byte strings of which an ``Enq`` (or ``Fan``) payload holds at least one when its
    message has a header ``(name, value)`` of ``pairs`` (either header encoding of
    :func:`_encode_headers`: ``NUL name NUL value``, or the JSON pair ``["name","value"]``).
    A payload holding none of them has none of those headers: the prefilter of a selective
    scan (dispatch/scan.py). Holding one proves nothing (a body may hold it too)."""
    out: list[bytes] = []
    for name, value in pairs:
        for needle in (b"\x00" + name.encode("utf-8", "surrogatepass") + b"\x00" + value.encode("utf-8", "surrogatepass"),
                       _json_dumps([name, value]).encode("ascii")):
            if needle not in out:
                out.append(needle)
    return tuple(out)


_EXPIRES_AT = 1 + 2 + 2 + 2 + 8  # the expires field in _ENQ_HEAD
_D_AT = struct.Struct("<d").unpack_from


def enq_expires(payload: bytes) -> float:
    """The ``expires`` of the message of an ``Enq`` or ``Fan`` payload (0: never; a payload
    too short for it: 0, decoding it says what is wrong)."""
    at = _EXPIRES_AT if payload[0] != T_FAN else 5 + _EXPIRES_AT  # a Fan: type byte, u32 length, the Enq
    if len(payload) < at + 8:
        return 0.0
    return float(_D_AT(payload, at)[0])


def _enq_offsets(payload: bytes | memoryview) -> tuple[int, float, float, int, int, int, int, int, int, int]:
    """An ``Enq`` payload's head, ``(kind, timestamp, expires, delivery count, a, b, c, d,
    e, f)``, and where its fields lie: the id ``[a:b]``, the destination ``[b:c]``, the
    key ``[c:d]``, the headers ``[d:e]``, the body ``[e:f]`` (``f``: the payload's length,
    else :class:`RecordError`; a payload shorter than the head: :class:`struct.error`)."""
    (kind, lid, ldest, lkey, ts, expires, count, lh, lb) = _ENQ_HEAD_AT(payload, 0)
    b = _ENQ_FIELDS + lid
    c = b + ldest
    d = c + lkey
    e = d + lh
    f = e + lb
    if f != len(payload):
        raise RecordError("record truncated" if f > len(payload) else f"{len(payload) - f} trailing bytes after a record")
    return kind, ts, expires, count, _ENQ_FIELDS, b, c, d, e, f


def enq_fields(payload: bytes) -> tuple[str, str, tuple[tuple[str, str], ...], float, int] | None:
    """``(id, destination, headers, timestamp, delivery count)`` of an ``Enq`` payload's
    message, without the rest of it (no body, no :class:`Message`); None for another
    record type. :class:`RecordError` when malformed."""
    if payload[0] not in (T_ENQ, T_ENQ_AGAIN):
        return None
    try:
        _kind, ts, _expires, count, a, b, c, d, e, _f = _enq_offsets(payload)
        return (payload[a:b].decode("utf-8", "surrogatepass"), payload[b:c].decode("utf-8", "surrogatepass"),
                _decode_headers(payload[d:e]), ts, count)
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, RecordError):
            raise
        raise RecordError(f"malformed record: {exc}") from exc


def _decode_headers(raw: bytes) -> tuple[tuple[str, str], ...]:
    if raw[:1] == b"\x00":
        if len(raw) == 1:
            return ()
        parts = raw[1:].decode("utf-8", "surrogatepass").split("\x00")
        if len(parts) % 2:
            raise RecordError("message headers: odd number of NUL-separated fields")
        return tuple(zip(parts[0::2], parts[1::2], strict=True))
    loaded = json.loads(raw)
    if not isinstance(loaded, list) or not all(
        isinstance(h, list) and len(h) == 2 and isinstance(h[0], str) and isinstance(h[1], str) for h in loaded
    ):
        raise RecordError("message headers are not a list of [name, value] strings")
    return tuple((h[0], h[1]) for h in loaded)


def encode_enq(m: Message, kind: int = T_ENQ) -> bytes:
    idb = m.id.encode("utf-8", "surrogatepass")
    db = m.destination.encode("utf-8", "surrogatepass")
    kb = m.key.encode("utf-8", "surrogatepass")
    hb = _encode_headers(m.headers)
    if len(idb) > 0xFFFF or len(db) > 0xFFFF or len(kb) > 0xFFFF:
        raise RecordError("message id, destination or key longer than 65535 bytes")
    head = _ENQ_HEAD.pack(
        kind, len(idb), len(db), len(kb), m.timestamp, m.expires, m.delivery_count, len(hb), len(m.body)
    )
    return b"".join((head, idb, db, kb, hb, m.body))


def encode(rec: Record) -> bytes:
    """The payload bytes of ``rec`` (without the journal's length/CRC framing)."""
    out: list[bytes] = []
    _encode_into(out, rec)
    return b"".join(out)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.buf):
            raise RecordError("record truncated")
        chunk = self.buf[self.pos : end]
        self.pos = end
        return chunk

    def s16(self) -> str:
        (n,) = _H.unpack(self.take(2))
        return bytes(self.take(n)).decode("utf-8", "surrogatepass")

    def b32(self) -> bytes:
        (n,) = _I.unpack(self.take(4))
        return bytes(self.take(n))

    def u32(self) -> int:
        return int(_I.unpack(self.take(4))[0])

    def u64(self) -> int:
        return int(_Q.unpack(self.take(8))[0])

    def f64(self) -> float:
        return float(_D.unpack(self.take(8))[0])


def decode(payload: bytes | memoryview) -> Record:
    """Inverse of :func:`encode`; raises :class:`RecordError` on malformed input."""
    try:
        if payload and payload[0] in (T_ENQ, T_ENQ_AGAIN):
            return _decode_enq(payload)
        rec = _decode(_Reader(payload), top=True)
    except RecordError:
        raise
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise RecordError(f"malformed record: {exc}") from exc
    return rec


def _decode_enq(payload: bytes | memoryview) -> Enq:
    """The commonest record, by slicing (what ``_decode`` does for it, faster)."""
    kind, ts, expires, count, a, b, c, d, e, f = _enq_offsets(payload)
    raw = bytes(payload)
    return Enq(
        Message(
            id=raw[a:b].decode("utf-8", "surrogatepass"),
            destination=raw[b:c].decode("utf-8", "surrogatepass"),
            headers=_decode_headers(raw[d:e]),
            body=raw[e:f],
            key=raw[c:d].decode("utf-8", "surrogatepass"),
            timestamp=ts,
            persistent=True,
            expires=expires,
            delivery_count=count,
        ),
        kind == T_ENQ_AGAIN,
    )


def _decode(r: _Reader, top: bool) -> Record:
    (kind,) = r.take(1)
    rec: Record
    if kind == T_ENQ or kind == T_ENQ_AGAIN:
        r.pos = 0
        (_, lid, ldest, lkey, ts, expires, count, lh, lb) = _ENQ_HEAD.unpack(r.take(_ENQ_HEAD.size))
        mid = bytes(r.take(lid)).decode("utf-8", "surrogatepass")
        dest = bytes(r.take(ldest)).decode("utf-8", "surrogatepass")
        key = bytes(r.take(lkey)).decode("utf-8", "surrogatepass")
        headers = _decode_headers(bytes(r.take(lh)))
        body = bytes(r.take(lb))
        rec = Enq(
            Message(
                id=mid,
                destination=dest,
                headers=headers,
                body=body,
                key=key,
                timestamp=ts,
                persistent=True,
                expires=expires,
                delivery_count=count,
            ),
            kind == T_ENQ_AGAIN,
        )
    elif kind == T_ACK or kind == T_ACK_IN:
        where = r.s16() if kind == T_ACK_IN else ""
        n = r.u32()
        if n > len(r.buf):
            raise RecordError("ack count larger than the record")
        rec = Ack(tuple(r.s16() for _ in range(n)), where)
    elif kind == T_MOVE:
        rec = Move(r.s16(), r.s16())
    elif kind == T_MOVE_FROM:
        rec = Move(r.s16(), r.s16(), r.s16())
    elif kind == T_TX:
        if not top:
            raise RecordError("nested transaction record")
        n = r.u32()
        if n > len(r.buf):
            raise RecordError("transaction count larger than the record")
        subs: list[TxPart] = []
        for _ in range(n):
            inner = _decode(_Reader(r.b32()), top=False)
            if not isinstance(inner, (Enq, Ack, Move, Keys, Fan)):
                raise RecordError(f"record type {type(inner).__name__} inside a transaction")
            subs.append(inner)
        rec = Tx(tuple(subs))
    elif kind == T_KEYS:
        n = r.u32()
        if n > len(r.buf):
            raise RecordError("key count larger than the record")
        rec = Keys(tuple((r.s16(), r.s16(), r.f64()) for _ in range(n)))
    elif kind == T_KEYS_UNSCOPED:
        n = r.u32()
        if n > len(r.buf):
            raise RecordError("key count larger than the record")
        rec = Keys(tuple(("", r.s16(), r.f64()) for _ in range(n)))
    elif kind == T_SUB:
        rec = Sub(r.s16(), r.s16(), r.s16(), r.s16())
    elif kind == T_SUB_SELECTOR:
        rec = Sub(r.s16(), r.s16(), r.s16(), r.s16(), r.s16())
    elif kind == T_SUB_OWNED:
        rec = Sub(r.s16(), r.s16(), r.s16(), r.s16(), r.s16(), r.s16())
    elif kind == T_UNSUB:
        rec = Unsub(r.s16())
    elif kind == T_FAN:
        inner_enq = r.b32()
        if not inner_enq or inner_enq[0] != T_ENQ:
            raise RecordError("a Fan record whose message is not an Enq")
        message = _decode_enq(inner_enq).message
        n = r.u32()
        if n > len(r.buf):
            raise RecordError("reference count larger than the record")
        rec = Fan(message, _decode_refs(r, n))
    else:
        raise RecordError(f"unknown record type {kind}")
    if top and r.pos != len(r.buf):
        raise RecordError(f"{len(r.buf) - r.pos} trailing bytes after a record")
    return rec


def _decode_refs(r: _Reader, n: int) -> tuple[tuple[int, str], ...]:
    """A ``Fan`` record's ``n`` references, read from ``r`` (unpack_from on the buffer:
    a record may hold hundreds)."""
    buf, at = r.buf, r.pos
    if at + n * _QH.size > len(buf):
        raise RecordError("record truncated")
    refs: list[tuple[int, str]] = []
    unpack = _QH.unpack_from
    for _ in range(n):
        h, ln = unpack(buf, at)
        at += 10
        if ln:
            if at + ln > len(buf):
                raise RecordError("record truncated")
            refs.append((h, bytes(buf[at : at + ln]).decode("utf-8", "surrogatepass")))
            at += ln
        else:
            refs.append((h, ""))
    r.pos = at
    return tuple(refs)


def flatten(records: Sequence[Record]) -> list[Record]:
    """Sub-records of transactions inlined (used by accounting)."""
    out: list[Record] = []
    for rec in records:
        if isinstance(rec, Tx):
            out.extend(rec.records)
        else:
            out.append(rec)
    return out
