"""The broker's side of OpenTelemetry, pure: the W3C ``traceparent`` header a client
put on a SEND, and the OTLP/HTTP request body (protobuf) that carries the broker's
spans to a collector. No I/O; :mod:`.tracing` owns the exporter thread.

Theory of operation
-------------------
``traceparent`` is ``{version}-{trace-id}-{parent-id}-{flags}`` in lower-case hex
(W3C Trace Context): version ``00`` has exactly those four fields; a later version may
add fields after them, and ``ff`` is invalid; an all-zero trace or parent id is
invalid. :func:`parse_traceparent` returns None for anything else, so a malformed
header is simply not traced (the broker keeps the header as it came either way).

:func:`encode_export` writes an ``ExportTraceServiceRequest`` (opentelemetry-proto's
``collector/trace/v1``) by hand: a handful of message types, each field a tag and a
varint, a fixed64 or a length-delimited value, which spares the broker a protobuf
dependency. Field numbers are those of ``opentelemetry/proto/trace/v1/trace.proto``;
the tests decode the bytes with opentelemetry-proto itself.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ServerSpan", "TraceParent", "encode_export", "parse_traceparent", "SPAN_KIND_INTERNAL", "SPAN_KIND_SERVER"]

SPAN_KIND_INTERNAL = 1
SPAN_KIND_SERVER = 2

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\Z")

AttrValue = str | int | bool | float


@dataclass(frozen=True)
class TraceParent:
    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes: the producer's span, the broker's span's parent
    sampled: bool


def parse_traceparent(value: str) -> TraceParent | None:
    """The ``traceparent`` header's ids and sampled flag; None when it is not valid."""
    m = _TRACEPARENT.match(value.strip())
    if m is None:
        return None
    version, trace_hex, span_hex, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_hex == "0" * 32 or span_hex == "0" * 16:
        return None
    return TraceParent(bytes.fromhex(trace_hex), bytes.fromhex(span_hex), bool(int(flags, 16) & 1))


@dataclass
class ServerSpan:
    """One span the broker exports (the server span of a SEND, or one of its children)."""

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    error: str | None = None  # the status message of a failed one


# -- protobuf wire format -------------------------------------------------------------------

def _varint(n: int) -> bytes:
    if n < 0:
        n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes(number: int, data: bytes) -> bytes:
    return _key(number, 2) + _varint(len(data)) + data


def _str(number: int, text: str) -> bytes:
    return _bytes(number, text.encode("utf-8"))


def _uint(number: int, n: int) -> bytes:
    return _key(number, 0) + _varint(n)


def _fixed64(number: int, n: int) -> bytes:
    return _key(number, 1) + struct.pack("<Q", n)


def _any_value(value: AttrValue) -> bytes:
    # AnyValue: string_value 1, bool_value 2, int_value 3, double_value 4
    if isinstance(value, bool):
        return _uint(2, int(value))
    if isinstance(value, int):
        return _uint(3, value)
    if isinstance(value, float):
        return _key(4, 1) + struct.pack("<d", value)
    return _str(1, str(value))


def _key_value(key: str, value: AttrValue) -> bytes:
    return _str(1, key) + _bytes(2, _any_value(value))


def _attributes(number: int, attrs: Mapping[str, AttrValue]) -> bytes:
    return b"".join(_bytes(number, _key_value(k, v)) for k, v in attrs.items())


def _span(span: ServerSpan) -> bytes:
    out = (_bytes(1, span.trace_id) + _bytes(2, span.span_id) + _bytes(4, span.parent_span_id)
           + _str(5, span.name) + _uint(6, span.kind) + _fixed64(7, span.start_ns) + _fixed64(8, span.end_ns)
           + _attributes(9, span.attributes))
    # Status: message 2, code 3 (1 ok, 2 error)
    status = _str(2, span.error) + _uint(3, 2) if span.error is not None else _uint(3, 0)
    return out + _bytes(15, status)


def encode_export(spans: Sequence[ServerSpan], resource: Mapping[str, AttrValue], scope: str,
                  scope_version: str) -> bytes:
    """An ``ExportTraceServiceRequest`` with one resource and one scope holding ``spans``."""
    scope_spans = _bytes(1, _str(1, scope) + _str(2, scope_version)) + b"".join(_bytes(2, _span(s)) for s in spans)
    resource_spans = _bytes(1, _attributes(1, resource)) + _bytes(2, scope_spans)
    return _bytes(1, resource_spans)

