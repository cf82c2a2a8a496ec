"""The HA port: the listening socket every HA node binds in every role.

It reads one STOMP ``CONNECT`` per connection (a status request, a replication link,
a demote request) and hands it to the node (:meth:`HaNode.handle_ha_frame`); garbage
is answered with an ``ERROR`` frame and the connection is closed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from amqtransport.stomp import Frame, FrameParser, NeedData, serialize

if TYPE_CHECKING:
    from .node import HaNode

__all__ = ["HaPortProtocol", "answer_error"]


class HaPortProtocol(asyncio.Protocol):
    """The HA port: reads one STOMP CONNECT and hands it to the node."""

    def __init__(self, node: HaNode) -> None:
        self.node = node
        self.parser = FrameParser("1.2")
        self.transport: asyncio.Transport | None = None
        self.peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        p = transport.get_extra_info("peername")
        self.peer = f"{p[0]}:{p[1]}" if isinstance(p, tuple) else str(p)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        try:
            self.parser.feed(data)
            event = self.parser.next_event()
        except Exception as exc:  # noqa: BLE001 - garbage on the HA port: answer and close
            answer_error(self.transport, f"malformed frame on the HA port: {exc}")
            return
        if isinstance(event, NeedData):
            return
        if not isinstance(event, Frame):
            return
        self.transport.pause_reading()
        self.node.handle_ha_frame(self.transport, event, self.peer)


def answer_error(transport: asyncio.Transport, message: str) -> None:
    frame = Frame.make("ERROR", [("message", message.replace("\n", " "))], message)
    transport.write(serialize(frame))
    transport.close()
