"""Shared helpers for the STOMP codec tests (h11 style: every case in three feeding modes).

Imported by name (pytest puts this directory on sys.path; tests/ has no __init__.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from amqtransport.errors import RemoteProtocolError
from amqtransport.stomp import NEED_DATA, Frame, FrameParser, Heartbeat, Limits

Events = list[Frame | Heartbeat]

#: Appended in the "trailing data" mode: the start of a frame that never completes.
TRAILER = b"MESSAGE\nsub"


def drain(parser: FrameParser) -> Events:
    return list(parser.events())


def parse_whole(data: bytes, version: str = "1.2", limits: Limits | None = None) -> Events:
    parser = FrameParser(version, limits or Limits())
    parser.feed(data)
    events = drain(parser)
    assert parser.next_event() is NEED_DATA
    assert parser.pending_bytes == 0
    return events


def parse_bytewise(data: bytes, version: str = "1.2", limits: Limits | None = None) -> Events:
    parser = FrameParser(version, limits or Limits())
    events: Events = []
    for i in range(len(data)):
        parser.feed(data[i : i + 1])
        events.extend(drain(parser))
    assert parser.pending_bytes == 0
    return events


def parse_trailing(data: bytes, version: str = "1.2", limits: Limits | None = None) -> Events:
    parser = FrameParser(version, limits or Limits())
    parser.feed(data + TRAILER)
    events = drain(parser)
    assert parser.next_event() is NEED_DATA
    assert parser.pending_bytes == len(TRAILER)
    assert parser.in_frame
    return events


MODES: dict[str, Callable[..., Events]] = {
    "whole": parse_whole,
    "bytewise": parse_bytewise,
    "trailing": parse_trailing,
}


def expect_error(data: bytes, mode: str, version: str = "1.2", limits: Limits | None = None) -> RemoteProtocolError:
    """Feed ``data`` in ``mode``; the parser must raise RemoteProtocolError (returned)."""
    parser = FrameParser(version, limits or Limits())
    chunks = [data[i : i + 1] for i in range(len(data))] if mode == "bytewise" else [data]
    if mode == "trailing":
        chunks = [data + TRAILER]
    with pytest.raises(RemoteProtocolError) as info:
        for chunk in chunks:
            parser.feed(chunk)
            drain(parser)
    # Dead after an error: every later call raises too.
    with pytest.raises(RemoteProtocolError, match="unusable"):
        parser.next_event()
    with pytest.raises(RemoteProtocolError, match="unusable"):
        parser.feed(b"SEND\n\n\x00")
    return info.value
