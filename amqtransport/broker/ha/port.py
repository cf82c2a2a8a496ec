"""The HA port: the listening socket every HA node binds in every role.

Theory of operation
-------------------
Each connection may send exactly one STOMP ``CONNECT`` (a status request, a
replication link, a demote or stand-by request); :class:`HaPortProtocol` parses it
and hands it to the node (:meth:`HaNode.handle_ha_frame`), which answers, closes, or
keeps the socket (a replication link). Garbage is answered with an ``ERROR`` frame
and the connection is closed. Because this port is open in every role and before any
authentication, it is bounded (:class:`~.config.HaPortLimits`): at most ``max_connections``
connections waiting for their request (more are closed at once), ``idle_timeout``
seconds to deliver the request, ``max_frame`` bytes for it. Refusals are logged with
the remote address by a :class:`RefusalLog`, which keeps a flood of them from filling
the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from amqtransport.stomp import Frame, FrameParser, Limits, NeedData, serialize

from .config import HaPortLimits

if TYPE_CHECKING:
    from .node import HaNode

__all__ = ["HaPortProtocol", "RefusalLog", "answer_error"]

log = logging.getLogger(__name__)


class RefusalLog:
    """Logs refused HA requests with the remote address: at most ``burst`` lines per
    ``window`` seconds, then one line saying how many were left out."""

    def __init__(
        self, logger: logging.Logger, *, burst: int = 20, window: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst = burst
        self.window = window
        self.clock = clock
        self._start = -window
        self._count = 0
        self._dropped = 0
        self.total = 0

    def __call__(self, peer: str, what: str, reason: str) -> None:
        self.total += 1
        now = self.clock()
        if now - self._start >= self.window:
            if self._dropped:
                self.logger.warning("HA port: %d more refusals not logged in the last %.0f s", self._dropped,
                                    self.window)
            self._start, self._count, self._dropped = now, 0, 0
        if self._count >= self.burst:
            self._dropped += 1
            return
        self._count += 1
        self.logger.warning("HA port: refused %s from %s: %s", what, peer, reason)


class HaPortProtocol(asyncio.Protocol):
    """One connection to the HA port, until its request is handed to the node."""

    def __init__(self, node: HaNode, limits: HaPortLimits, waiting: set[HaPortProtocol]) -> None:
        self.node = node
        self.limits = limits
        self.waiting = waiting
        self.parser = FrameParser(
            "1.2", Limits(max_frame_size=limits.max_frame, max_headers=64, max_header_line=min(8192, limits.max_frame))
        )
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        p = transport.get_extra_info("peername")
        self.peer = f"{p[0]}:{p[1]}" if isinstance(p, tuple) else str(p)
        if len(self.waiting) >= self.limits.max_connections:
            self.node.refused(self.peer, "a connection",
                              f"{len(self.waiting)} connections already wait for their request (limit)")
            answer_error(transport, "too many connections to the HA port")
            return
        self.waiting.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.limits.idle_timeout, self._idle)

    def _idle(self) -> None:
        self._timer = None
        if self.transport is not None and self in self.waiting:
            self.node.refused(self.peer, "a connection", f"no request within {self.limits.idle_timeout:g} s")
            self._done()
            answer_error(self.transport, f"no CONNECT frame within {self.limits.idle_timeout:g} s")

    def _done(self) -> None:
        self.waiting.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self not in self.waiting:
            return
        try:
            self.parser.feed(data)
            while not isinstance(event := self.parser.next_event(), Frame | NeedData):
                pass  # a heart-beat EOL before the request
        except Exception as exc:  # noqa: BLE001 - garbage on the HA port: answer and close
            self.node.refused(self.peer, "a frame", f"malformed: {exc}")
            self._done()
            answer_error(self.transport, f"malformed frame on the HA port: {exc}")
            return
        if isinstance(event, NeedData):
            return
        self._done()
        self.transport.pause_reading()
        self.node.handle_ha_frame(self.transport, event, self.peer)


def answer_error(transport: asyncio.Transport, message: str) -> None:
    frame = Frame.make("ERROR", [("message", message.replace("\n", " "))], message)
    transport.write(serialize(frame))
    transport.close()


