"""Serializer: exact bytes per version, escaping rules, and frames that cannot be expressed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.errors import LocalProtocolError
from amqtransport.stomp import ALL_COMMANDS, Frame, FrameParser, serialize
from amqtransport.stomp.serializer import _checked, _plain
from amqtransport.stomp.versions import UNESCAPED_COMMANDS


def F(command: str, headers: list[tuple[str, str]] | None = None, body: bytes = b"") -> Frame:
    return Frame(command, tuple(headers or ()), body)


# (id, frame, version, exact bytes)
EXACT: list[tuple[str, Frame, str, bytes]] = [
    ("no-body", F("SUBSCRIBE", [("id", "0"), ("destination", "/queue/a")]), "1.2",
     b"SUBSCRIBE\nid:0\ndestination:/queue/a\n\n\x00"),
    ("body-gets-content-length", F("SEND", [("destination", "/q")], b"hi"), "1.2",
     b"SEND\ndestination:/q\ncontent-length:2\n\nhi\x00"),
    ("existing-content-length-kept", F("SEND", [("content-length", "2")], b"hi"), "1.2",
     b"SEND\ncontent-length:2\n\nhi\x00"),
    ("nul-in-body", F("MESSAGE", [], b"a\x00b"), "1.0", b"MESSAGE\ncontent-length:3\n\na\x00b\x00"),
    ("escape-1.2", F("SEND", [("a:b", "x\ny\rz\\")]), "1.2", b"SEND\na\\cb:x\\ny\\rz\\\\\n\n\x00"),
    ("escape-1.1", F("SEND", [("a:b", "x\ny\\")]), "1.1", b"SEND\na\\cb:x\\ny\\\\\n\n\x00"),
    ("cr-mid-value-1.1", F("SEND", [("k", "a\rb")]), "1.1", b"SEND\nk:a\rb\n\n\x00"),
    ("no-escape-1.0", F("SEND", [("k", "a\\b:c")]), "1.0", b"SEND\nk:a\\b:c\n\n\x00"),
    ("connect-unescaped", F("CONNECT", [("login", "a\\b:c")]), "1.2", b"CONNECT\nlogin:a\\b:c\n\n\x00"),
    ("connected-unescaped", F("CONNECTED", [("server", "x\\y")]), "1.1", b"CONNECTED\nserver:x\\y\n\n\x00"),
    ("repeated-order-kept", F("MESSAGE", [("a", "1"), ("b", "2"), ("a", "3")]), "1.2",
     b"MESSAGE\na:1\nb:2\na:3\n\n\x00"),
    ("utf8", F("SEND", [("clé", "✓")], "é".encode()), "1.2",
     "SEND\nclé:✓\ncontent-length:2\n\né\x00".encode()),
]


@pytest.mark.parametrize(("frame", "version", "wire"), [c[1:] for c in EXACT], ids=[c[0] for c in EXACT])
def test_exact_bytes(frame: Frame, version: str, wire: bytes) -> None:
    assert serialize(frame, version) == wire
    parser = FrameParser(version)
    parser.feed(wire)
    parsed = parser.next_event()
    assert isinstance(parsed, Frame)
    assert parsed.command == frame.command and parsed.body == frame.body
    assert parsed.headers[: len(frame.headers)] == frame.headers


# (id, frame, version, message substring)
BAD: list[tuple[str, Frame, str, str]] = [
    ("empty-command", F(""), "1.2", "empty command"),
    ("unknown-command", F("FOO"), "1.2", "unknown STOMP command 'FOO'"),
    ("newline-in-command", F("SEND\n"), "1.2", "unknown STOMP command"),
    ("newline-in-header-1.0", F("SEND", [("k", "a\nb")]), "1.0", "line feed"),
    ("newline-in-name-1.0", F("SEND", [("k\n", "a")]), "1.0", "line feed"),
    ("colon-in-name-1.0", F("SEND", [("a:b", "v")]), "1.0", "contains ':'"),
    ("trailing-cr-1.0", F("SEND", [("k", "v\r")]), "1.0", "carriage return"),
    ("trailing-cr-1.1", F("SEND", [("k", "v\r")]), "1.1", "carriage return"),
    ("newline-in-connect-1.2", F("CONNECT", [("login", "a\nb")]), "1.2", "never escaped"),
    ("colon-in-connect-name", F("CONNECT", [("a:b", "x")]), "1.2", "contains ':'"),
    ("empty-header-name", F("SEND", [("", "x")]), "1.2", "empty name"),
    ("content-length-mismatch", F("SEND", [("content-length", "5")], b"abc"), "1.2", "body is 3 bytes"),
    ("non-str-header", Frame("SEND", (("k", 1),)), "1.2", "must be str"),  # type: ignore[arg-type]
    ("surrogate", F("SEND", [("k", "\udc80")]), "1.2", "UTF-8"),
]


@pytest.mark.parametrize(("frame", "version", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_unexpressible(frame: Frame, version: str, message: str) -> None:
    with pytest.raises(LocalProtocolError) as info:
        serialize(frame, version)
    assert message in str(info.value)


def test_unknown_version_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        serialize(F("SEND"), "2.0")


def test_make_and_helpers() -> None:
    frame = Frame.make("SEND", {"destination": "/q", "a": "1"}, "text")
    wire = serialize(frame.with_headers(a="2").without_headers("destination"))
    assert wire == b"SEND\na:2\ncontent-length:4\n\ntext\x00"


# -- the fast path (serializer._plain) against the checked path -----------------------------

_HEADER_TEXT = st.lists(st.sampled_from(["a", "é", ":", "\\", "\r", "\n", "-", "content-length", "content-type",
                                         "text/x", "\udc80", "3"]), max_size=3).map("".join)
_HEADER = st.one_of(st.tuples(_HEADER_TEXT, _HEADER_TEXT),
                    st.tuples(_HEADER_TEXT, st.integers(0, 9)),  # a value that is no str
                    st.tuples(_HEADER_TEXT, _HEADER_TEXT, _HEADER_TEXT),  # no pair
                    st.tuples(_HEADER_TEXT))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(ALL_COMMANDS | {"FOO", ""})), st.lists(_HEADER, max_size=5),
       st.one_of(st.binary(max_size=8), st.just(bytearray(b"xy"))), st.sampled_from(("1.0", "1.1", "1.2")),
       st.booleans())
def test_the_fast_path_writes_what_the_checked_path_writes_or_raises_the_same(
        command: str, headers: list[tuple[object, ...]], body: bytes, version: str, text_mode: bool) -> None:
    """Every frame goes the same way whichever path takes it: the same bytes, or the
    checked path's error (the fast path only ever steps aside)."""
    frame = Frame(command, tuple(headers), body)  # type: ignore[arg-type]
    try:
        expected: bytes | str = _checked(frame, version, text_mode)
    except LocalProtocolError as exc:
        expected = str(exc)
    try:
        got: bytes | str = serialize(frame, version, text_mode=text_mode)
    except LocalProtocolError as exc:
        got = str(exc)
    assert got == expected
    if isinstance(expected, bytes) and version != "1.0" and command not in UNESCAPED_COMMANDS:
        plain = _plain(frame, text_mode)
        assert plain is None or plain == expected


def test_the_common_send_takes_the_fast_path() -> None:
    frame = F("SEND", [("destination", "/queue/a"), ("persistent", "true"), ("amq-idempotency-key", "k1"),
                       ("receipt", "r-1")], b"x" * 3)
    assert _plain(frame, False) == _checked(frame, "1.2", False) == (
        b"SEND\ndestination:/queue/a\npersistent:true\namq-idempotency-key:k1\nreceipt:r-1\ncontent-length:3\n\nxxx\x00")
