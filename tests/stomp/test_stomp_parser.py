"""Table-driven parser tests; every case is fed whole, byte by byte and with trailing data."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from stomp_codec_support import Events, expect_error

from amqtransport.errors import RemoteProtocolError
from amqtransport.stomp import HEARTBEAT, NEED_DATA, Frame, FrameParser, Limits

HB = HEARTBEAT


def F(command: str, headers: list[tuple[str, str]] | None = None, body: bytes = b"") -> Frame:
    return Frame(command, tuple(headers or ()), body)


# (id, version, wire bytes, expected events)
VALID: list[tuple[str, str, bytes, list[object]]] = [
    ("send-lf", "1.2", b"SEND\ndestination:/queue/a\n\n\x00", [F("SEND", [("destination", "/queue/a")])]),
    (
        "send-crlf-body",
        "1.2",
        b"SEND\r\ndestination:/queue/a\r\n\r\nhello\x00",
        [F("SEND", [("destination", "/queue/a")], b"hello")],
    ),
    (
        "mixed-eol",
        "1.2",
        b"MESSAGE\r\na:1\nb:2\r\n\nx\x00",
        [F("MESSAGE", [("a", "1"), ("b", "2")], b"x")],
    ),
    (
        "content-length-nul-in-body",
        "1.2",
        b"MESSAGE\ncontent-length:5\n\na\x00b\x00c\x00",
        [F("MESSAGE", [("content-length", "5")], b"a\x00b\x00c")],
    ),
    ("content-length-zero", "1.2", b"SEND\ncontent-length:0\n\n\x00", [F("SEND", [("content-length", "0")])]),
    (
        "content-length-padded",
        "1.2",
        b"SEND\ncontent-length: 3 \n\nabc\x00",
        [F("SEND", [("content-length", " 3 ")], b"abc")],
    ),
    (
        "first-content-length-wins",
        "1.2",
        b"SEND\ncontent-length:2\ncontent-length:9\n\nab\x00",
        [F("SEND", [("content-length", "2"), ("content-length", "9")], b"ab")],
    ),
    (
        "heartbeats-around",
        "1.2",
        b"\n\r\nRECEIPT\nreceipt-id:7\n\n\x00\n\n\r\n",
        [HB, HB, F("RECEIPT", [("receipt-id", "7")]), HB, HB, HB],
    ),
    ("only-heartbeats", "1.2", b"\n\n\r\n\n", [HB, HB, HB, HB]),
    (
        "repeated-headers-kept-in-order",
        "1.2",
        b"MESSAGE\nfoo:1\nbar:x\nfoo:2\n\n\x00",
        [F("MESSAGE", [("foo", "1"), ("bar", "x"), ("foo", "2")])],
    ),
    (
        "escapes-1.2",
        "1.2",
        b"SEND\na\\cb:x\\ny\\rz\\\\w\n\n\x00",
        [F("SEND", [("a:b", "x\ny\rz\\w")])],
    ),
    ("escapes-1.1", "1.1", b"SEND\na\\cb:x\\ny\\\\\n\n\x00", [F("SEND", [("a:b", "x\ny\\")])]),
    ("no-escapes-1.0", "1.0", b"SEND\nkey:a\\nb\\q\n\n\x00", [F("SEND", [("key", "a\\nb\\q")])]),
    ("connect-not-unescaped", "1.2", b"CONNECT\nlogin:a\\nb\\t\n\n\x00", [F("CONNECT", [("login", "a\\nb\\t")])]),
    ("stomp-not-unescaped", "1.2", b"STOMP\npasscode:p\\w\n\n\x00", [F("STOMP", [("passcode", "p\\w")])]),
    ("connected-not-unescaped", "1.1", b"CONNECTED\nserver:x\\y\n\n\x00", [F("CONNECTED", [("server", "x\\y")])]),
    ("colon-in-value", "1.2", b"SEND\ndestination:/queue/a:b\n\n\x00", [F("SEND", [("destination", "/queue/a:b")])]),
    ("empty-value", "1.2", b"SEND\nfoo:\n\n\x00", [F("SEND", [("foo", "")])]),
    ("spaces-kept", "1.2", b"SEND\nfoo: bar \n\n\x00", [F("SEND", [("foo", " bar ")])]),
    (
        "utf8",
        "1.2",
        "SEND\nclé:värde ✓\n\nbody ✓\x00".encode(),
        [F("SEND", [("clé", "värde ✓")], "body ✓".encode())],
    ),
    (
        "body-with-blank-lines-no-length",
        "1.2",
        b"SEND\n\nline1\n\nline2\r\n\x00",
        [F("SEND", [], b"line1\n\nline2\r\n")],
    ),
    (
        "back-to-back",
        "1.2",
        b"SEND\n\na\x00SEND\n\nb\x00ACK\nid:1\n\n\x00",
        [F("SEND", [], b"a"), F("SEND", [], b"b"), F("ACK", [("id", "1")])],
    ),
    ("nul-in-header-value", "1.2", b"SEND\nk:a\x00b\n\n\x00", [F("SEND", [("k", "a\x00b")])]),
    ("cr-inside-value-1.1", "1.1", b"SEND\nk:a\rb\n\n\x00", [F("SEND", [("k", "a\rb")])]),
    (
        "error-frame",
        "1.2",
        b"ERROR\nmessage:bad\ncontent-length:4\n\noops\x00\n",
        [F("ERROR", [("message", "bad"), ("content-length", "4")], b"oops"), HB],
    ),
]


@pytest.mark.parametrize(("version", "data", "expected"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_valid(feed_mode: Callable[..., Events], version: str, data: bytes, expected: list[object]) -> None:
    assert feed_mode(data, version) == expected


# (id, version, wire bytes, limits, substring expected in the error message)
SMALL = Limits(max_frame_size=64, max_headers=3, max_header_line=20)
INVALID: list[tuple[str, str, bytes, Limits | None, str]] = [
    ("unknown-command", "1.2", b"FOO\n\n\x00", None, "unknown STOMP command 'FOO'"),
    ("lowercase-command", "1.2", b"send\n\n\x00", None, "unknown STOMP command 'send'"),
    ("nul-before-command", "1.2", b"\x00SEND\n\n\x00", None, "unknown STOMP command"),
    ("space-command", "1.2", b" \n\n\x00", None, "unknown STOMP command"),
    ("no-colon", "1.2", b"SEND\nnocolon\n\n\x00", None, "without ':'"),
    ("empty-name", "1.2", b"SEND\n:value\n\n\x00", None, "empty name"),
    ("undefined-escape-1.2", "1.2", b"SEND\na:\\t\n\n\x00", None, "undefined escape sequence '\\t'"),
    ("undefined-escape-in-name", "1.2", b"SEND\n\\x:1\n\n\x00", None, "undefined escape"),
    ("cr-escape-undefined-1.1", "1.1", b"SEND\na:\\r\n\n\x00", None, "undefined escape sequence '\\r'"),
    ("lone-backslash", "1.2", b"SEND\na:b\\\n\n\x00", None, "lone backslash"),
    ("content-length-alpha", "1.2", b"SEND\ncontent-length:abc\n\nabc\x00", None, "content-length 'abc'"),
    ("content-length-negative", "1.2", b"SEND\ncontent-length:-1\n\n\x00", None, "non-negative decimal"),
    ("content-length-float", "1.2", b"SEND\ncontent-length:1.5\n\nx\x00", None, "non-negative decimal"),
    ("content-length-empty", "1.2", b"SEND\ncontent-length:\n\n\x00", None, "content-length ''"),
    ("content-length-unicode-digit", "1.2", "SEND\ncontent-length:٣\n\nabc\x00".encode(), None, "decimal"),
    ("missing-nul", "1.2", b"SEND\ncontent-length:2\n\nabc\x00", None, "not followed by NUL (found byte 0x63)"),
    ("bare-cr-between-frames", "1.2", b"\rSEND\n\n\x00", None, "carriage return not followed by line feed"),
    ("bad-utf8", "1.2", b"SEND\nk:\xff\n\n\x00", None, "not valid UTF-8"),
    ("bad-utf8-command", "1.2", b"SE\xc3ND\n\n\x00", None, "not valid UTF-8"),
    ("frame-too-big-no-length", "1.2", b"SEND\n\n" + b"x" * 100 + b"\x00", SMALL, "max_frame_size=64"),
    (
        "frame-too-big-content-length",
        "1.2",
        b"SEND\ncontent-length:100\n\n" + b"x" * 100 + b"\x00",
        SMALL,
        "max_frame_size=64",
    ),
    ("too-many-headers", "1.2", b"SEND\na:1\nb:2\nc:3\nd:4\n\n\x00", SMALL, "max_headers=3"),
    ("header-line-too-long", "1.2", b"SEND\nk:" + b"v" * 30 + b"\n\n\x00", SMALL, "max_header_line=20"),
    ("command-line-too-long", "1.2", b"S" * 30 + b"\n\n\x00", SMALL, "max_header_line=20"),
    (
        "headers-too-big",
        "1.2",
        b"SEND\n" + b"".join(b"h:%d\n" % i for i in range(3)) + b"x:" + b"y" * 18 + b"\n\n\x00",
        Limits(max_frame_size=32, max_headers=10, max_header_line=20),
        "max_frame_size=32",
    ),
]


@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
@pytest.mark.parametrize(
    ("version", "data", "limits", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid(mode: str, version: str, data: bytes, limits: Limits | None, message: str) -> None:
    error = expect_error(data, mode, version, limits)
    assert message in str(error)


def test_limits_are_inclusive(feed_mode: Callable[..., Events]) -> None:
    frame = b"SEND\nk:" + b"v" * 18 + b"\n\n" + b"b" * 30 + b"\x00"
    limits = Limits(max_frame_size=len(frame), max_headers=1, max_header_line=20)
    assert feed_mode(frame, "1.2", limits) == [F("SEND", [("k", "v" * 18)], b"b" * 30)]
    cl_frame = b"SEND\ncontent-length:3\n\nabc\x00"
    exact = Limits(max_frame_size=len(cl_frame))
    assert feed_mode(cl_frame, "1.2", exact) == [F("SEND", [("content-length", "3")], b"abc")]
    with pytest.raises(RemoteProtocolError, match="max_frame_size"):
        parser = FrameParser(limits=Limits(max_frame_size=len(cl_frame) - 1))
        parser.feed(cl_frame)
        parser.next_event()


def test_limit_values_validated() -> None:
    with pytest.raises(ValueError, match="max_headers"):
        Limits(max_headers=0)


def test_content_length_limit_raised_before_body_arrives() -> None:
    parser = FrameParser(limits=Limits(max_frame_size=1024))
    parser.feed(b"SEND\ncontent-length:999999999\n\n")
    with pytest.raises(RemoteProtocolError, match="content-length 999999999"):
        parser.next_event()


def test_endless_header_line_rejected_without_newline() -> None:
    parser = FrameParser(limits=Limits(max_header_line=100))
    parser.feed(b"SEND\nk:")
    assert parser.next_event() is NEED_DATA
    with pytest.raises(RemoteProtocolError, match="max_header_line=100"):
        for _ in range(10):
            parser.feed(b"x" * 50)
            parser.next_event()


def test_version_is_settable_after_negotiation() -> None:
    parser = FrameParser()
    parser.feed(b"CONNECTED\nversion:1.0\n\n\x00SEND\nk:a\\nb\n\n\x00")
    assert parser.next_event() == F("CONNECTED", [("version", "1.0")])
    parser.version = "1.0"
    assert parser.next_event() == F("SEND", [("k", "a\\nb")])
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        parser.version = "2.0"
    with pytest.raises(ValueError):
        FrameParser("1.3")


def test_get_returns_first_repeated_header() -> None:
    parser = FrameParser()
    parser.feed(b"MESSAGE\nfoo:1\nfoo:2\n\n\x00")
    frame = parser.next_event()
    assert isinstance(frame, Frame)
    assert frame.get("foo") == "1"
    assert frame.get_all("foo") == ["1", "2"]
    assert frame.header_map == {"foo": "1"}


def test_custom_command_set() -> None:
    parser = FrameParser(commands={"SEND"})
    parser.feed(b"SEND\n\n\x00MESSAGE\n\n\x00")
    assert parser.next_event() == F("SEND")
    with pytest.raises(RemoteProtocolError, match="expected one of SEND"):
        parser.next_event()


def test_events_stops_at_need_data_and_resumes() -> None:
    parser = FrameParser()
    parser.feed(b"SEND\n\na\x00SEND\n")
    assert list(parser.events()) == [F("SEND", [], b"a")]
    assert parser.pending_bytes == 5
    parser.feed(b"\nb\x00")
    assert list(parser.events()) == [F("SEND", [], b"b")]
    assert not parser.in_frame


@pytest.mark.timeout(60)
@pytest.mark.parametrize("with_length", [True, False])
def test_big_body_in_small_chunks_is_linear(with_length: bool) -> None:
    body = bytes(range(1, 256)) * 4112  # ~1 MiB, no NUL
    head = b"SEND\ndestination:/queue/big\n" + (b"content-length:%d\n" % len(body) if with_length else b"")
    data = head + b"\n" + body + b"\x00"
    parser = FrameParser()
    events: list[object] = []
    for i in range(0, len(data), 4096):
        parser.feed(data[i : i + 4096])
        events.extend(parser.events())
    assert len(events) == 1
    frame = events[0]
    assert isinstance(frame, Frame) and frame.body == body


def test_buffer_is_compacted_on_long_streams() -> None:
    frame = b"MESSAGE\nmessage-id:1\n\n" + b"x" * 1000 + b"\x00"
    parser = FrameParser()
    count = 0
    for _ in range(2000):
        parser.feed(frame)
        count += len(list(parser.events()))
    assert count == 2000
    assert len(parser._buf) < 200_000  # consumed bytes are dropped, not kept forever


def test_too_many_headers_rejected_before_the_block_ends() -> None:
    parser = FrameParser(limits=Limits(max_headers=5))
    parser.feed(b"SEND\n" + b"a:b\n" * 5)
    assert parser.next_event() is NEED_DATA
    parser.feed(b"a:b\n")
    with pytest.raises(RemoteProtocolError, match="max_headers=5"):
        parser.next_event()
