"""What the sync client does its own way: the seams of the one client source.

The sync client (:mod:`amqtransport._sync.connection`) is generated from the asyncio
one (:mod:`amqtransport.aio.connection`) by ``scripts/async_to_sync.py``; what cannot
be written once lives here and in :mod:`amqtransport.aio.flavour`, with the same names
(see that module): :class:`Inbox`, :data:`Interrupted`, :data:`Driver`, :data:`Lock`.
"""

from __future__ import annotations

import queue
import threading
from typing import Generic, TypeVar

from amqtransport.transports.base import Transport

__all__ = ["Driver", "Inbox", "Interrupted", "Lock"]

T = TypeVar("T")

#: the transport a sync connection drives: ``DirectTransport`` for a ``tcp://`` leaf,
#: ``FailoverTransport`` for ``failover:``/``static:``/``masterslave:``
Driver = Transport
#: a wait abandoned by its caller (Ctrl-C in the waiting thread)
Interrupted = KeyboardInterrupt
#: a lock between the threads sharing a connection
Lock = threading.Lock


class Inbox(Generic[T]):
    """A subscription's received messages, in order (a thread-safe :class:`queue.Queue`)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[T] = queue.Queue()

    def put(self, item: T) -> None:
        """Never blocks (called by the transport's reader thread)."""
        self._queue.put(item)

    def get(self, timeout: float | None) -> T | None:
        """The next item, or None after ``timeout`` seconds (0: only what is here)."""
        try:
            if timeout is None or timeout > 0:
                return self._queue.get(timeout=timeout)
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def qsize(self) -> int:
        return self._queue.qsize()
