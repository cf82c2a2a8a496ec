"""The broker core's refusal of a client request."""

from __future__ import annotations

__all__ = ["CoreError"]


class CoreError(Exception):
    """A client request the core refuses; the message goes into the ERROR frame."""
