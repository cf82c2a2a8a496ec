"""The broker core's refusal of a client request."""

from __future__ import annotations

from amqtransport.errors import ServerError

__all__ = ["CoreError", "HeaderError"]


class CoreError(ServerError):
    """A client request the core refuses; the message goes into the ERROR frame."""


class HeaderError(CoreError):
    """A SEND whose header is wrong (an ``AMQ_SCHEDULED_*`` value): ERROR, and the
    connection keeps working, as on ActiveMQ."""
