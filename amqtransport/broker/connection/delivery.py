"""MESSAGE frames as a connection writes them: a cached header block per message.

Theory of operation
-------------------
A MESSAGE frame is the per-delivery start (``MESSAGE``, ``subscription``, ``ack`` in
1.2, ``redelivered`` / the delivery count) built for each delivery, then the headers
the message carries (its id, destination, timestamp and the producer's headers),
escaped once per STOMP version and cached on the message (``Message.wire_cache``):
a topic message that fans out to a thousand subscriptions is escaped once for each
version its subscribers speak. A durable subscription's queue keeps the topic the
message was published to in its ``destination`` header: that is the destination the
subscriber sees; a temporary destination is shown by the name its connection gave it
(``wire_name``, :meth:`~.temporary.TempNames.wire_name`: only its owner reads it, so the
cached block is its owner's). Pure: bytes in, bytes out.
"""

from __future__ import annotations

from collections.abc import Callable

from amqtransport.stomp.encoders import DELIVERY_COUNT_HEADER, message_headers, message_start

from ..dispatch.message import Message
from ..dispatch.names import DURABLE_PREFIX

__all__ = ["browse_end_frame", "message_frame"]

#: headers set per delivery: a producer's copies of them are not passed on
_DELIVERY_HEADERS = frozenset({"subscription", "ack", "redelivered", DELIVERY_COUNT_HEADER, "message-id"})


def message_frame(sub_id: str, msg: Message, version: str, delivery_count: int,
                  wire_name: Callable[[str], str]) -> bytes:
    """The MESSAGE frame delivering ``msg`` to subscription ``sub_id`` in STOMP ``version``
    (``wire_name``: the connection's name for a temporary destination)."""
    cache = msg.wire_cache
    if not isinstance(cache, dict):
        cache = msg.wire_cache = {}
    common = cache.get(version)
    if common is None:
        common = cache[version] = _common_block(msg, version, wire_name)
    head = message_start(sub_id, msg.id if version == "1.2" else None, version, delivery_count)
    return head + common + msg.body + b"\x00"


def browse_end_frame(sub_id: str, destination: str, version: str) -> bytes:
    """The ``browser:end`` MESSAGE that closes a queue browser's messages."""
    end = [("browser", "end"), ("destination", destination), ("message-id", "0")]
    return message_start(sub_id, None, version) + message_headers(end, 0, version) + b"\x00"


def _common_block(msg: Message, v: str, wire_name: Callable[[str], str]) -> bytes:
    dest = msg.destination
    user = msg.headers
    if dest.startswith("/temp-"):  # only its owner reads it: its name for it
        dest = wire_name(dest)
    elif dest.startswith(DURABLE_PREFIX):
        for k, val in user:
            if k == "destination":
                dest = val
                break
    headers = [("message-id", msg.id), ("destination", dest)]
    has_ts = False
    for k, val in user:
        if k in _DELIVERY_HEADERS or k == "destination" or k == "content-length":
            continue
        if k == "timestamp":
            has_ts = True
        headers.append((k, val))
    if not has_ts:
        headers.append(("timestamp", str(int(msg.timestamp * 1000))))
    return message_headers(headers, len(msg.body), v)
