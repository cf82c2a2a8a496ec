"""Fast encoders for the frames a broker writes most: MESSAGE, RECEIPT, ERROR, CONNECTED.

:func:`~.serializer.serialize` checks a whole :class:`~.frames.Frame` and refuses what
it cannot write faithfully. A broker delivering tens of thousands of messages a second
builds its frames from pieces instead: the header block of a message
(:func:`message_headers`) is built once per message and STOMP version and shared by
every subscription it goes to; only :func:`message_start` (the subscription, the ack
id, the redelivery count) is built per delivery.

For every frame :func:`serialize` accepts, these functions produce exactly its bytes
(``tests/stomp/test_stomp_encoders.py`` checks it on generated frames). A header the
version cannot express, which :func:`serialize` would refuse, is written as the one
policy of :mod:`.escaping` says (:func:`~.escaping.expressible`: the offending
characters become spaces): a relayed message must still be delivered.

Sans-IO like the rest of the codec: text in, bytes out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .escaping import header_line

__all__ = [
    "DELIVERY_COUNT_HEADER",
    "connected_frame",
    "error_frame",
    "message_headers",
    "message_start",
    "receipt_frame",
]

#: MESSAGE header: how many times the message has been delivered (with ``redelivered:true``)
DELIVERY_COUNT_HEADER: Final = "amq-delivery-count"


def message_start(subscription: str, ack: str | None, version: str, delivery_count: int = 1) -> bytes:
    """The start of a MESSAGE frame: the command and the per-delivery headers
    (``subscription``; ``ack`` unless None; ``redelivered:true`` and
    :data:`DELIVERY_COUNT_HEADER` from the second delivery on). Follow it with
    :func:`message_headers`, the body and a NUL."""
    head = f"MESSAGE\n{header_line('subscription', subscription, version, 'MESSAGE')}\n"
    if ack is not None:
        head += f"{header_line('ack', ack, version, 'MESSAGE')}\n"
    if delivery_count > 1:
        head += f"redelivered:true\n{DELIVERY_COUNT_HEADER}:{delivery_count}\n"
    return head.encode("utf-8")


def message_headers(headers: Iterable[tuple[str, str]], body_length: int, version: str) -> bytes:
    """The rest of a MESSAGE frame's head: ``headers`` in order, ``content-length`` and
    the blank line (the caller leaves out any ``content-length`` of its own)."""
    lines = [header_line(k, v, version, "MESSAGE") for k, v in headers]
    lines.append(f"content-length:{body_length}\n\n")
    return "\n".join(lines).encode("utf-8")


def receipt_frame(receipt_id: str, version: str) -> bytes:
    """A whole RECEIPT frame."""
    return f"RECEIPT\n{header_line('receipt-id', receipt_id, version, 'RECEIPT')}\n\n\x00".encode()


def error_frame(
    message: str,
    version: str,
    *,
    receipt_id: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes | None = None,
) -> bytes:
    """A whole ERROR frame: ``message``, ``content-type:text/plain``, ``receipt-id``
    unless None, ``headers``, ``content-length``; the body is ``body`` or else the
    message itself."""
    lines = [
        "ERROR",
        header_line("message", message, version, "ERROR"),
        "content-type:text/plain",
    ]
    if receipt_id is not None:
        lines.append(header_line("receipt-id", receipt_id, version, "ERROR"))
    lines.extend(header_line(k, v, version, "ERROR") for k, v in headers)
    data = message.encode("utf-8") if body is None else body
    lines.append(f"content-length:{len(data)}\n\n")
    return "\n".join(lines).encode("utf-8") + data + b"\x00"


def connected_frame(headers: Iterable[tuple[str, str]]) -> bytes:
    """A whole CONNECTED frame (its headers are never escaped, in any version)."""
    lines = ["CONNECTED", *(header_line(k, v, "1.2", "CONNECTED") for k, v in headers)]
    return ("\n".join(lines) + "\n\n\x00").encode("utf-8")
