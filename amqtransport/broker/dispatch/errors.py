"""The broker core's refusal of a client request."""

from __future__ import annotations

from amqtransport.errors import ServerError

__all__ = ["CoreError"]


class CoreError(ServerError):
    """A client request the core refuses; the message goes into the ERROR frame."""
