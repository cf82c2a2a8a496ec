"""Sans-IO STOMP 1.0/1.1/1.2 codec: frames, incremental parser, serializer, negotiation.

No socket, thread, asyncio or clock here (the layering test checks it): bytes in
with :meth:`FrameParser.feed`, events out with :meth:`FrameParser.next_event`,
frames in and bytes out with :func:`serialize`.
"""

from __future__ import annotations

from .escaping import escape_header, unescape_header
from .frames import (
    BROKER_STOPPED_HEADER,
    CLIENT_COMMANDS,
    CONNECTION_ENDED_HEADER,
    HEARTBEAT,
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_HEADER_ALIASES,
    IN_DOUBT_HEADER,
    NEED_DATA,
    SERVER_COMMANDS,
    Event,
    Frame,
    HeaderInput,
    Heartbeat,
    NeedData,
)
from .heartbeat import (
    HEARTBEAT_BYTES,
    format_heartbeat_header,
    negotiate_heartbeat,
    parse_heartbeat_header,
)
from .limits import Limits
from .negotiation import negotiate_version
from .parser import ALL_COMMANDS, FrameParser
from .serializer import serialize
from .versions import SUPPORTED_VERSIONS, UNESCAPED_COMMANDS

__all__ = [
    "Frame",
    "Heartbeat",
    "NeedData",
    "HEARTBEAT",
    "NEED_DATA",
    "Event",
    "HeaderInput",
    "FrameParser",
    "Limits",
    "serialize",
    "HEARTBEAT_BYTES",
    "negotiate_heartbeat",
    "parse_heartbeat_header",
    "format_heartbeat_header",
    "negotiate_version",
    "IDEMPOTENCY_HEADER",
    "IDEMPOTENCY_HEADER_ALIASES",
    "IN_DOUBT_HEADER",
    "BROKER_STOPPED_HEADER",
    "CONNECTION_ENDED_HEADER",
    "CLIENT_COMMANDS",
    "SERVER_COMMANDS",
    "ALL_COMMANDS",
    "SUPPORTED_VERSIONS",
    "UNESCAPED_COMMANDS",
    "escape_header",
    "unescape_header",
]
