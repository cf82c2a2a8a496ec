"""Serializer: exact bytes per version, escaping rules, and frames that cannot be expressed."""

from __future__ import annotations

import pytest

from amqtransport.errors import LocalProtocolError
from amqtransport.stomp import Frame, FrameParser, serialize


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
