"""The broker core's refusal of a client request."""

from __future__ import annotations

from amqtransport.errors import ServerError

__all__ = ["BadHeader", "CoreError"]


class CoreError(ServerError):
    """A client request the core refuses; the message goes into the ERROR frame."""


class BadHeader(CoreError):
    """A header of the frame has a value the core cannot take (``priority:12``): the
    frame is refused with an ERROR and the connection stays open."""
