"""Parser limits: a peer that breaks one gets a RemoteProtocolError naming it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    """Bounds on what one incoming frame may use.

    ``max_frame_size`` counts every byte of the frame on the wire, from the first
    byte of the command to the terminating NUL (body included); ``max_headers`` the
    header lines; ``max_header_line`` the bytes of one line (the command line too),
    without its EOL.
    """

    max_frame_size: int = 10 * 1024 * 1024
    max_headers: int = 1000
    max_header_line: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("max_frame_size", "max_headers", "max_header_line"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
