"""What the asyncio client does its own way: the seams of the one client source.

The public client is written once, in :mod:`amqtransport.aio.connection`;
``scripts/async_to_sync.py`` generates the sync client (:mod:`amqtransport._sync.connection`)
from it by dropping ``async``/``await`` and renaming (``AsyncConnection`` ->
``Connection``, ``amqtransport.aio.flavour`` -> ``amqtransport._sync.flavour``, ...).
What cannot be written once lives here and in :mod:`amqtransport._sync.flavour`, with
the same names:

- :class:`Inbox`: a subscription's queue of received messages, filled by the transport
  (the link's protocol callbacks here, reader threads there) and read by ``receive(timeout)``;
- :data:`Interrupted`: the exception of a wait that was abandoned, not answered
  (a cancelled task here); it leaves a producer's receipt outstanding;
- :data:`Driver`: the transport type the connection drives;
- :data:`Lock`: a lock held across awaits (``async with``) here, a thread lock there.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from amqtransport.aio.failover import AsyncFailoverTransport

__all__ = ["Driver", "Inbox", "Interrupted", "Lock"]

T = TypeVar("T")

#: the failover driver every asyncio connection runs (a ``tcp://`` leaf is a failover
#: over one endpoint that never reconnects)
Driver = AsyncFailoverTransport
#: a wait abandoned by its caller (the task was cancelled)
Interrupted = asyncio.CancelledError
#: a lock between the tasks of one event loop
Lock = asyncio.Lock


class Inbox(Generic[T]):
    """A subscription's received messages, in order (an :class:`asyncio.Queue`)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[T] = asyncio.Queue()

    def put(self, item: T) -> None:
        """Never blocks (called by the transport)."""
        self._queue.put_nowait(item)

    async def get(self, timeout: float | None) -> T | None:
        """The next item, or None after ``timeout`` seconds (0: only what is here)."""
        if timeout is not None and timeout <= 0 and self._queue.empty():
            return None
        try:
            async with asyncio.timeout(timeout):
                return await self._queue.get()
        except TimeoutError:
            return None

    def qsize(self) -> int:
        return self._queue.qsize()
