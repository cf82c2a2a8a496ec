"""The byte-stream interface every backend provides.

A backend turns a leaf URI into a connected :class:`NetworkStream`. Streams move
bytes only; framing lives in :mod:`amqtransport.stomp`, connection logic in
:mod:`amqtransport.transports`. Every operating-system error is mapped into the
``TransportError`` family inside the backend that raised it, so nothing above this
layer ever sees ``OSError`` or ``ssl.SSLError``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["NetworkStream", "Backend", "leaf_address"]


@runtime_checkable
class NetworkStream(Protocol):
    """A connected, bidirectional byte stream.

    ``read`` is called by one thread (the connection's reader); ``write`` may be
    called from several threads and must serialise them itself; ``close`` may be
    called from any thread and must wake a reader blocked in ``read``.
    """

    @property
    def peer(self) -> str:
        """``scheme://host:port`` of the remote end (for logs)."""
        ...

    def read(self, max_bytes: int, timeout: float | None) -> bytes | None:
        """Up to ``max_bytes``; ``None`` when nothing arrived within ``timeout``
        seconds (``None`` timeout: wait forever); ``b""`` at end of stream.
        Raises ``ReadError`` (or ``ConnectionClosed`` after ``close``)."""
        ...

    def write(self, data: bytes) -> None:
        """Write all of ``data``. Raises ``WriteError`` / ``ConnectionClosed``."""
        ...

    def close(self) -> None:
        """Close the stream; idempotent."""
        ...


class Backend(Protocol):
    """Opens streams for leaf URIs (``amqtransport.uri.LeafUri``)."""

    def connect(self, leaf: Any, timeout: float) -> NetworkStream:
        """Connect to ``leaf`` within ``timeout`` seconds or raise ``ConnectError``."""
        ...


def leaf_address(leaf: Any) -> str:
    """``scheme://host:port`` for a leaf (``vm://name`` for vm leaves)."""
    address = getattr(leaf, "address", None)
    if isinstance(address, str):
        return address
    scheme = getattr(leaf, "scheme", "tcp")
    if scheme == "vm":
        return f"vm://{getattr(leaf, 'name', '') or getattr(leaf, 'host', '')}"
    return f"{scheme}://{leaf.host}:{leaf.port}"
