"""Heart-beat and version negotiation tables."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqtransport.errors import RemoteProtocolError
from amqtransport.stomp import (
    HEARTBEAT_BYTES,
    FrameParser,
    Heartbeat,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat_header,
)
from amqtransport.stomp.heartbeat import format_heartbeat_header

# ours, theirs, (we send every, we expect every)
HEARTBEAT_TABLE = [
    ((0, 0), (0, 0), (0, 0)),
    ((10000, 10000), (0, 0), (0, 0)),
    ((0, 0), (5000, 5000), (0, 0)),
    ((10000, 10000), (5000, 5000), (10000, 10000)),
    ((1000, 2000), (3000, 4000), (4000, 3000)),
    ((1000, 0), (0, 500), (1000, 0)),  # we can send, they want: we send; nobody sends to us
    ((0, 1000), (500, 0), (0, 1000)),  # they can send, we want: we expect; we never send
    ((1000, 1000), (0, 3000), (3000, 0)),
    ((1000, 1000), (3000, 0), (0, 3000)),
    ((100, 100), (100, 100), (100, 100)),
]


@pytest.mark.parametrize(("ours", "theirs", "expected"), HEARTBEAT_TABLE)
def test_negotiate_heartbeat(ours: tuple[int, int], theirs: tuple[int, int], expected: tuple[int, int]) -> None:
    assert negotiate_heartbeat(ours, theirs) == expected
    # Symmetric: what we send is what the peer expects, and the other way round.
    peer = negotiate_heartbeat(theirs, ours)
    assert peer == (expected[1], expected[0])


@given(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)))
def test_negotiate_heartbeat_symmetry(ours: tuple[int, int], theirs: tuple[int, int]) -> None:
    send, expect = negotiate_heartbeat(ours, theirs)
    assert negotiate_heartbeat(theirs, ours) == (expect, send)


PARSE_HB = [
    (None, (0, 0)),
    ("0,0", (0, 0)),
    ("10000,10000", (10000, 10000)),
    (" 500 , 1000 ", (500, 1000)),
]


@pytest.mark.parametrize(("value", "expected"), PARSE_HB)
def test_parse_heartbeat_header(value: str | None, expected: tuple[int, int]) -> None:
    assert parse_heartbeat_header(value) == expected


@pytest.mark.parametrize("value", ["", "1", "1,2,3", "-1,0", "a,b", "1.5,2", ",", "1,", "١,٢"])
def test_parse_heartbeat_header_rejects(value: str) -> None:
    with pytest.raises(RemoteProtocolError, match="heart-beat header"):
        parse_heartbeat_header(value)


@given(st.text(max_size=30))
def test_parse_heartbeat_header_fuzz(value: str) -> None:
    try:
        cx, cy = parse_heartbeat_header(value)
    except RemoteProtocolError:
        return
    assert cx >= 0 and cy >= 0
    assert parse_heartbeat_header(format_heartbeat_header((cx, cy))) == (cx, cy)


def test_heartbeat_bytes_parse_as_heartbeat() -> None:
    parser = FrameParser()
    parser.feed(HEARTBEAT_BYTES * 3)
    assert all(isinstance(e, Heartbeat) for e in parser.events())


VERSION_TABLE = [
    (None, ("1.0", "1.1", "1.2"), "1.0"),
    ("", ("1.0", "1.1", "1.2"), "1.0"),
    ("1.0", ("1.0", "1.1", "1.2"), "1.0"),
    ("1.1", ("1.0", "1.1", "1.2"), "1.1"),
    ("1.2", ("1.0", "1.1", "1.2"), "1.2"),
    ("1.0,1.1,1.2", ("1.0", "1.1", "1.2"), "1.2"),
    ("1.2,1.0", ("1.0", "1.1", "1.2"), "1.2"),
    (" 1.1 , 1.0 ", ("1.0", "1.1", "1.2"), "1.1"),
    ("1.0,1.1,1.2,2.0", ("1.0", "1.1", "1.2"), "1.2"),
    ("1.0,1.1,1.2", ("1.0", "1.1"), "1.1"),
    ("1.1,1.2", ("1.2",), "1.2"),
]


@pytest.mark.parametrize(("accept", "supported", "expected"), VERSION_TABLE)
def test_negotiate_version(accept: str | None, supported: tuple[str, ...], expected: str) -> None:
    assert negotiate_version(accept, supported) == expected


@pytest.mark.parametrize(
    ("accept", "supported"),
    [("2.0", ("1.0", "1.1", "1.2")), (None, ("1.1", "1.2")), ("1.0", ("1.2",)), ("abc,,", ("1.0", "1.1", "1.2"))],
)
def test_negotiate_version_no_common(accept: str | None, supported: tuple[str, ...]) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        negotiate_version(accept, supported)
    assert ",".join(supported) in str(info.value)


@given(st.one_of(st.none(), st.text(max_size=30)))
def test_negotiate_version_fuzz(accept: str | None) -> None:
    try:
        version = negotiate_version(accept)
    except RemoteProtocolError:
        return
    assert version in ("1.0", "1.1", "1.2")
