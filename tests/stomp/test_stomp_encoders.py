"""The broker's fast encoders (stomp/encoders.py) and the one escaping policy (stomp/escaping.py).

Two promises, checked on generated headers in every version:

- for every frame serialize() accepts, the fast encoders write exactly its bytes;
- a header serialize() refuses (the version cannot express it) is written the way
  escaping.expressible() says -- each offending character a space -- and a header it
  accepts is never changed; what comes out always parses back to what went in.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqtransport.errors import LocalProtocolError
from amqtransport.stomp import Frame, FrameParser, serialize
from amqtransport.stomp.encoders import (
    DELIVERY_COUNT_HEADER,
    connected_frame,
    error_frame,
    message_headers,
    message_start,
    receipt_frame,
)
from amqtransport.stomp.escaping import expressible, header_line, unexpressible

VERSIONS = ("1.0", "1.1", "1.2")
# text rich in what matters: separators, line ends, escapes
tricky = st.text(st.sampled_from("ab:\\\r\n é"), max_size=8)
header_text = st.one_of(tricky, st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))
names = header_text.filter(lambda n: bool(n) and n != "content-length")
headers = st.lists(st.tuples(names, header_text), max_size=5)


def _accepts(frame: Frame, version: str) -> bool:
    try:
        serialize(frame, version)
    except LocalProtocolError:
        return False
    return True


def _parse(data: bytes, version: str) -> Frame:
    parser = FrameParser(version)
    parser.feed(data)
    [frame] = [e for e in parser.events() if isinstance(e, Frame)]
    assert parser.pending_bytes == 0
    return frame


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(VERSIONS),
    header_text.filter(bool),
    header_text.filter(bool),
    st.integers(min_value=1, max_value=3),
    headers,
    st.binary(max_size=16),
)
def test_message_is_serialize_or_the_policy(
    version: str, sub_id: str, msg_id: str, count: int, user: list[tuple[str, str]], body: bytes
) -> None:
    ack = msg_id if version == "1.2" else None
    per_delivery = [("subscription", sub_id), *([("ack", ack)] if ack is not None else [])]
    if count > 1:
        per_delivery += [("redelivered", "true"), (DELIVERY_COUNT_HEADER, str(count))]
    common = [("message-id", msg_id), *user]
    fast = message_start(sub_id, ack, version, count) + message_headers(common, len(body), version) + body + b"\x00"
    whole = [*per_delivery, *common, ("content-length", str(len(body)))]
    frame = Frame("MESSAGE", tuple(whole), body)
    if _accepts(frame, version):
        assert fast == serialize(frame, version)
    expected = tuple(expressible(k, v, version, "MESSAGE") for k, v in whole)
    assert _parse(fast, version) == Frame("MESSAGE", expected, body)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(VERSIONS), header_text, header_text.filter(bool), st.booleans(), headers, st.booleans())
def test_error_and_receipt_are_serialize_or_the_policy(
    version: str, message: str, receipt: str, with_receipt: bool, extra: list[tuple[str, str]], own_body: bool
) -> None:
    body = b"details" if own_body else message.encode("utf-8")
    fast = error_frame(
        message, version, receipt_id=receipt if with_receipt else None, headers=extra, body=body if own_body else None
    )
    whole = [("message", message), ("content-type", "text/plain"), *([("receipt-id", receipt)] if with_receipt else []),
             *extra, ("content-length", str(len(body)))]
    frame = Frame("ERROR", tuple(whole), body)
    if _accepts(frame, version):
        assert fast == serialize(frame, version)
    assert _parse(fast, version) == Frame("ERROR", tuple(expressible(k, v, version, "ERROR") for k, v in whole), body)

    fast_receipt = receipt_frame(receipt, version)
    receipt_only = Frame("RECEIPT", (("receipt-id", receipt),))
    if _accepts(receipt_only, version):
        assert fast_receipt == serialize(receipt_only, version)
    assert _parse(fast_receipt, version).headers == (expressible("receipt-id", receipt, version, "RECEIPT"),)


@settings(max_examples=200, deadline=None)
@given(headers)
def test_connected_is_serialize_or_the_policy(pairs: list[tuple[str, str]]) -> None:
    fast = connected_frame(pairs)
    frame = Frame("CONNECTED", tuple(pairs))
    if _accepts(frame, "1.2"):
        assert fast == serialize(frame, "1.2")
    assert _parse(fast, "1.2").headers == tuple(expressible(k, v, "1.2", "CONNECTED") for k, v in pairs)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(VERSIONS), st.sampled_from(["MESSAGE", "CONNECTED", "SEND", "ERROR"]), names, header_text)
def test_the_policy_changes_only_what_cannot_be_sent(version: str, command: str, name: str, value: str) -> None:
    fixed = expressible(name, value, version, command)
    assert unexpressible(*fixed, version, command) is None
    if unexpressible(name, value, version, command) is None:
        assert fixed == (name, value)
        assert header_line(name, value, version, command) == serialize(
            Frame(command, ((name, value),)), version
        ).decode("utf-8").split("\n")[1]
    else:
        with pytest.raises(LocalProtocolError):
            serialize(Frame(command, ((name, value),)), version)
        assert len(fixed[0]) == len(name) and len(fixed[1]) == len(value)  # characters become spaces


@pytest.mark.parametrize(
    ("version", "command", "header", "written"),
    [
        ("1.0", "MESSAGE", ("k", "two\nlines"), ("k", "two lines")),
        ("1.0", "MESSAGE", ("a:b", "v"), ("a b", "v")),  # was sent as-is: the peer read header 'a'
        ("1.0", "MESSAGE", ("k", "ends\r"), ("k", "ends ")),
        ("1.0", "MESSAGE", ("k", "mid\rdle"), ("k", "mid\rdle")),  # expressible: kept (was rewritten)
        ("1.1", "MESSAGE", ("k", "ends\r"), ("k", "ends ")),  # was sent as-is: the peer lost the CR
        ("1.1", "MESSAGE", ("k", "two\nlines"), ("k", "two\nlines")),  # escaped: kept
        ("1.2", "CONNECTED", ("user-name", "a\nb"), ("user-name", "a b")),
        ("1.2", "MESSAGE", ("a:b", "x\ny\r"), ("a:b", "x\ny\r")),
    ],
)
def test_the_policy_by_example(version: str, command: str, header: tuple[str, str], written: tuple[str, str]) -> None:
    assert expressible(*header, version, command) == written
