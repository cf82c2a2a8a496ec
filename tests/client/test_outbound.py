"""The SEND frame both clients build (``outbound.send_frame``): its headers, in order,
and its idempotency key."""

from __future__ import annotations

import re

import pytest

from amqtransport.outbound import new_key, send_frame
from amqtransport.stomp import IDEMPOTENCY_HEADER, serialize
from amqtransport.transports.dialect import dialect_named

AMQ = dialect_named("amq")


def test_a_plain_send_has_its_headers_in_order_and_a_fresh_key() -> None:
    frame = send_frame("/queue/a", b"body", None, True, None, dialect=AMQ, duplicate_id_header=None)
    names = [name for name, _ in frame.headers]
    assert names == ["destination", "persistent", IDEMPOTENCY_HEADER]
    assert frame.get("destination") == "/queue/a" and frame.get("persistent") == "true"
    assert re.fullmatch(r"[0-9a-f]{32}", frame.get(IDEMPOTENCY_HEADER) or "")
    assert frame.body == b"body"


def test_fresh_keys_are_32_hex_digits_and_never_repeat() -> None:
    keys = {new_key() for _ in range(10_000)}
    assert len(keys) == 10_000
    assert all(re.fullmatch(r"[0-9a-f]{32}", key) for key in keys)


def test_text_body_caller_headers_and_options_keep_their_places() -> None:
    frame = send_frame("/queue/a", "héllo", {"persistent": "false", "x": 1, IDEMPOTENCY_HEADER: "mine"},  # type: ignore[dict-item]
                       False, None, dialect=AMQ, duplicate_id_header="_AMQ_DUPL_ID", priority=7, delay=50)
    assert frame.headers == (
        ("destination", "/queue/a"), ("content-type", "text/plain;charset=utf-8"), ("persistent", "false"),
        ("x", "1"), (IDEMPOTENCY_HEADER, "mine"), ("priority", "7"), ("AMQ_SCHEDULED_DELAY", "50"),
        ("_AMQ_DUPL_ID", "mine"))
    assert frame.body == "héllo".encode()
    # the key argument wins over a header; every value is a str (serialize takes the fast path)
    keyed = send_frame("/queue/a", b"", {IDEMPOTENCY_HEADER: "header"}, True, 42,  # type: ignore[arg-type]
                       dialect=dialect_named("artemis"), duplicate_id_header=None)
    assert keyed.get(IDEMPOTENCY_HEADER) == "42" and keyed.get("destination-type") == "ANYCAST"
    assert all(isinstance(v, str) for _, v in keyed.headers)
    assert serialize(keyed) == (b"SEND\ndestination:/queue/a\namq-idempotency-key:42\npersistent:true\n"
                               b"destination-type:ANYCAST\n\n\x00")  # the caller's header keeps its place


@pytest.mark.parametrize(("kwargs", "message"), [({"priority": 10}, "priority must be"),
                                                 ({"delay": -1}, "delay must be")])
def test_bad_priority_or_delay_is_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        send_frame("/queue/a", b"", None, True, None, dialect=AMQ, duplicate_id_header=None, **kwargs)  # type: ignore[arg-type]
