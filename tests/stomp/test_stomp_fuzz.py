"""Fuzz: whatever bytes arrive, the parser yields events or raises RemoteProtocolError, nothing else.

Limits are small so that the limit checks are exercised too.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.errors import RemoteProtocolError
from amqtransport.stomp import Frame, FrameParser, Limits, serialize

SMALL = Limits(max_frame_size=120, max_headers=4, max_header_line=24)
VERSIONS = ("1.0", "1.1", "1.2")

VALID_STREAM = b"".join(
    serialize(f, "1.2") + b"\n"
    for f in (
        Frame.make("CONNECT", {"accept-version": "1.2", "host": "/"}),
        Frame.make("SEND", {"destination": "/q/a", "k\\:": "v\nx"}, b"a\x00b"),
        Frame.make("MESSAGE", [("a", "1"), ("a", "2")], b"hello"),
        Frame.make("ACK", {"id": "7"}),
    )
)

TOKENS = [
    b"SEND", b"MESSAGE", b"CONNECT", b"ERROR", b"FOO", b"\n", b"\r\n", b"\r", b"\x00", b":", b"\\",
    b"\\c", b"\\n", b"\\r", b"\\t", b"content-length:", b"content-length:3", b"content-length:-1",
    b"content-length:99999", b"k", b"v", b"abc", b"\xff", b"\xc3", b"x" * 30, b"\n\n",
]


def run(data: bytes, version: str, limits: Limits, cuts: list[int]) -> None:
    parser = FrameParser(version, limits)
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    try:
        for a, b in zip(points, points[1:], strict=False):
            parser.feed(data[a:b])
            for event in parser.events():
                if isinstance(event, Frame):
                    assert len(event.headers) <= limits.max_headers
                    assert len(event.body) < limits.max_frame_size
    except RemoteProtocolError as exc:
        assert "internal parser error" not in str(exc)
        assert str(exc)


cuts_st = st.lists(st.integers(0, 1000), max_size=8)
limits_st = st.sampled_from([SMALL, Limits()])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(VERSIONS), limits_st, cuts_st)
def test_random_bytes(data: bytes, version: str, limits: Limits, cuts: list[int]) -> None:
    run(data, version, limits, cuts)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=40), st.sampled_from(VERSIONS), limits_st, cuts_st)
def test_stomp_like_tokens(tokens: list[bytes], version: str, limits: Limits, cuts: list[int]) -> None:
    run(b"".join(tokens), version, limits, cuts)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID_STREAM)
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "duplicate", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.sampled_from(TOKENS))
        elif kind == "delete" and data:
            del data[pos : pos + draw(st.integers(1, 8))]
        elif kind == "duplicate":
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 40))]
        else:
            del data[pos:]
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(mutated(), st.sampled_from(VERSIONS), limits_st, cuts_st)
def test_mutated_valid_frames(data: bytes, version: str, limits: Limits, cuts: list[int]) -> None:
    run(data, version, limits, cuts)


def outcome(data: bytes, version: str, limits: Limits, cuts: list[int]) -> tuple[list[object], bool]:
    parser = FrameParser(version, limits)
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    events: list[object] = []
    try:
        for a, b in zip(points, points[1:], strict=False):
            parser.feed(data[a:b])
            events.extend(parser.events())
    except RemoteProtocolError:
        return events, True
    return events, False


@settings(max_examples=300, deadline=None)
@given(mutated(), st.sampled_from(VERSIONS), limits_st, cuts_st)
def test_chunking_does_not_change_the_outcome_of_bad_input(
    data: bytes, version: str, limits: Limits, cuts: list[int]
) -> None:
    """Fed whole or in pieces, the same events come out in the same order; an error
    found with the whole buffer is found in pieces too (possibly earlier, never later
    than the frame it concerns)."""
    whole, whole_failed = outcome(data, version, limits, [])
    pieces, pieces_failed = outcome(data, version, limits, cuts)
    if not whole_failed and not pieces_failed:
        assert pieces == whole
    else:
        shorter = min(len(whole), len(pieces))
        assert pieces[:shorter] == whole[:shorter]
        if whole_failed:
            assert pieces_failed and len(pieces) <= len(whole)
