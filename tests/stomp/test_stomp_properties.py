"""Hypothesis properties: serialize -> parse round trips, and chunking never changes the result."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqtransport.stomp import ALL_COMMANDS, HEARTBEAT, Frame, FrameParser, Heartbeat, serialize
from amqtransport.stomp.escaping import escape_header, unescape_header

VERSIONS = ("1.0", "1.1", "1.2")
UNESCAPED = ("CONNECT", "STOMP", "CONNECTED")
COMMANDS = sorted(ALL_COMMANDS)

# Where headers are escaped (1.1/1.2 outside the handshake) any text is expressible, except a
# trailing CR under 1.1 (no \r escape); elsewhere names cannot hold ':' or LF, values no LF,
# and nothing may end a line with CR. We keep CR out of the unescaped alphabets entirely.
any_text = st.text(max_size=20)
plain_name = st.text(st.characters(blacklist_characters="\n\r:", blacklist_categories=("Cs",)), min_size=1, max_size=20)
plain_value = st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=20)


@st.composite
def frames(draw: st.DrawFn, version: str) -> Frame:
    command = draw(st.sampled_from(COMMANDS))
    escaped = version != "1.0" and command not in UNESCAPED
    if escaped:
        names = any_text.filter(bool)
        values = any_text.filter(lambda v: not (version == "1.1" and v.endswith("\r")))
    else:
        names, values = plain_name, plain_value
    names = names.filter(lambda n: n != "content-length")
    headers = draw(st.lists(st.tuples(names, values), max_size=6))
    body = draw(st.binary(max_size=64))
    return Frame(command, tuple(headers), body)


def expected_after_round_trip(frame: Frame) -> Frame:
    if frame.body:
        return Frame(frame.command, frame.headers + (("content-length", str(len(frame.body))),), frame.body)
    return frame


def parse_all(data: bytes, version: str, cuts: list[int] | None = None) -> list[Frame | Heartbeat]:
    parser = FrameParser(version)
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in (cuts or []))})
    events: list[Frame | Heartbeat] = []
    for a, b in zip(points, points[1:], strict=False):
        parser.feed(data[a:b])
        events.extend(parser.events())
    assert parser.pending_bytes == 0
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.sampled_from(VERSIONS).flatmap(lambda v: st.tuples(st.just(v), frames(v))))
def test_round_trip(case: tuple[str, Frame]) -> None:
    version, frame = case
    assert parse_all(serialize(frame, version), version) == [expected_after_round_trip(frame)]


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(VERSIONS).flatmap(
        lambda v: st.tuples(
            st.just(v),
            st.lists(st.tuples(frames(v), st.sampled_from([b"", b"\n", b"\r\n", b"\n\n"])), min_size=1, max_size=5),
        )
    ),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_any_chunking_gives_the_same_events(case: tuple[str, list[tuple[Frame, bytes]]], cuts: list[int]) -> None:
    version, items = case
    data = b""
    expected: list[Frame | Heartbeat] = []
    for frame, eols in items:
        data += serialize(frame, version) + eols
        expected.append(expected_after_round_trip(frame))
        expected.extend([HEARTBEAT] * eols.count(b"\n"))
    assert parse_all(data, version) == expected
    assert parse_all(data, version, cuts) == expected
    # Byte by byte as the extreme case.
    assert parse_all(data, version, list(range(len(data)))) == expected


@given(st.binary(max_size=200).filter(lambda b: b"\x00" not in b), st.sampled_from(VERSIONS))
def test_body_without_content_length_ends_at_first_nul(body: bytes, version: str) -> None:
    data = b"SEND\ndestination:/q\n\n" + body + b"\x00"
    assert parse_all(data, version) == [Frame("SEND", (("destination", "/q"),), body)]


@given(any_text, st.sampled_from(("1.1", "1.2")))
def test_escape_round_trip(text: str, version: str) -> None:
    if version == "1.1" and "\r" in text:
        return
    assert unescape_header(escape_header(text, version), version) == text


def reference_unescape(text: str, version: str) -> str | None:
    """A plain left-to-right scanner; None for an undefined or incomplete escape."""
    table = {"n": "\n", "c": ":", "\\": "\\"} | ({"r": "\r"} if version == "1.2" else {})
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            if i + 1 >= len(text) or text[i + 1] not in table:
                return None
            out.append(table[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@given(st.text(alphabet="\\rnct:x\n", max_size=16), st.sampled_from(("1.1", "1.2")))
def test_unescape_matches_a_reference_scanner(text: str, version: str) -> None:
    from amqtransport.errors import RemoteProtocolError

    expected = reference_unescape(text, version)
    try:
        got: str | None = unescape_header(text, version)
    except RemoteProtocolError:
        got = None
    assert got == expected
