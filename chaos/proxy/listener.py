"""A TCP accept loop that can be closed at any moment without losing a socket.

Why not ``asyncio.start_server``: in Python 3.11, closing an ``asyncio.Server`` in
the loop iteration in which it accepted a connection makes the transport creation
fail (``Server._attach`` asserts) and leaks the accepted socket, so the client stays
connected to nothing until garbage collection. Disabling a proxy while clients
reconnect in a tight loop hits exactly that window.

Here the listening socket is watched with ``loop.add_reader``; each accepted socket
is wrapped into streams by a small task that is never cancelled: if the listener was
closed meanwhile, that task aborts the new connection itself. :meth:`Listener.close`
removes the reader and closes the listening socket synchronously, so a connect made
after it returns is refused.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

__all__ = ["Listener", "ConnectionCallback"]

log = logging.getLogger(__name__)

ConnectionCallback = Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]

_ACCEPTS_PER_WAKEUP = 64


class Listener:
    """Accept connections on a bound, listening socket; hand each to ``on_connection``.

    ``on_connection(reader, writer)`` is a plain function called on the loop; it owns
    the connection from then on.
    """

    def __init__(
        self, sock: socket.socket, on_connection: ConnectionCallback, limit: int = 2**16
    ) -> None:
        self.sock = sock
        self.on_connection = on_connection
        self.limit = limit
        self.closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._setups: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        name = self.sock.getsockname()
        return name[0], name[1]

    def start(self) -> None:
        self.sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            if self.closed:
                return
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: leave it in the backlog for now
                log.warning("accept on %s failed: %s", self.address, exc)
                return
            conn.setblocking(False)
            assert self._loop is not None
            task = self._loop.create_task(self._setup(conn))
            self._setups.add(task)
            task.add_done_callback(self._setups.discard)

    async def _setup(self, conn: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=self.limit)
        except OSError as exc:
            log.debug("could not set up an accepted connection: %s", exc)
            conn.close()
            return
        if self.closed:
            writer.transport.abort()
            return
        try:
            self.on_connection(reader, writer)
        except Exception:  # a bug in the callback must not leave the socket open
            log.exception("connection callback failed")
            writer.transport.abort()

    def close(self) -> None:
        """Stop accepting now: new connects are refused once this returns."""
        if self.closed:
            return
        self.closed = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()

    async def wait_setups(self) -> None:
        """Wait until connections accepted before :meth:`close` are handed over or closed."""
        if self._setups:
            await asyncio.wait(list(self._setups), timeout=5)
