"""Errors of the chaos proxy's API, each carrying the HTTP status Toxiproxy answers with.

The HTTP layer turns any :class:`ApiError` into ``{"error": message, "status": N}``;
anything else that escapes a handler becomes a 500 with the same shape.
"""

from __future__ import annotations

from amqtransport.errors import AmqTransportError

__all__ = ["ApiError", "BadRequest", "NotFound", "Conflict"]


class ApiError(AmqTransportError):
    """An API request failed; ``status`` is the HTTP status to answer with."""

    status: int = 500

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class BadRequest(ApiError, ValueError):
    """400: a malformed body, a missing or wrongly typed field, an invalid toxic."""

    status = 400


class NotFound(ApiError):
    """404: ``proxy not found``, ``toxic not found``, or an unknown path."""

    status = 404


class Conflict(ApiError):
    """409: ``proxy already exists``, ``toxic already exists``."""

    status = 409
