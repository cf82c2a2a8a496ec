"""LoopThread: an asyncio service on its own event loop in a daemon thread.

Theory of operation: sync code (tests, examples, ``vm://`` brokers, the chaos
proxy) wants an asyncio server without ever seeing a loop. :meth:`LoopThread.start`
spawns a daemon thread that creates a fresh loop and runs ``open()`` on it; ``start``
blocks until ``open()`` returned (the service is up) or raises what ``open()``
raised. The loop then waits for :meth:`LoopThread.stop`, which sets an event through
``call_soon_threadsafe``; the thread runs ``close()`` and ends. :meth:`call` runs a
plain function on the loop (to read state that only the loop may touch).

A crash after start-up is logged (nobody is waiting for it). With
``cancel_pending=True`` tasks still pending after ``close()`` are cancelled and
awaited and the default executor shut down before the loop closes (``asyncio.run``
semantics); otherwise the loop just closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .tasks import cancel_and_wait

__all__ = ["LoopThread"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopThread:
    """One asyncio service on a background thread: ``start(open, close)`` ... ``stop()``."""

    def __init__(self, name: str, *, cancel_pending: bool = False) -> None:
        self.name = name
        self._cancel_pending = cancel_pending
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    @property
    def started(self) -> bool:
        """True from :meth:`start` until :meth:`stop` (or a failed start)."""
        return self._thread is not None

    def start(
        self,
        open: Callable[[], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
        timeout: float = 30.0,
    ) -> None:
        """Run ``open()`` on a new loop thread; return once it returned, raise what it raised.

        ``close()`` runs on the loop when :meth:`stop` is called (only if ``open()``
        succeeded). A no-op when already started.
        """
        if self._thread is not None:
            return
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(open, close, ready), name=self.name, daemon=True)
        self._thread.start()
        try:
            ready.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self.name} did not start within {timeout} s") from None
        except BaseException:
            self._thread.join(5)
            self._thread = None
            raise

    def _run(
        self,
        open: Callable[[], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
        ready: concurrent.futures.Future[None],
    ) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main(open, close, ready))
        except BaseException:  # noqa: BLE001 - nobody waits for it any more
            log.exception("%s crashed", self.name)
        finally:
            if not ready.done():
                ready.set_exception(RuntimeError(f"{self.name} ended before it started"))
            try:
                if self._cancel_pending:
                    _cancel_all_tasks(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                if self._cancel_pending:
                    loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    async def _main(
        self,
        open: Callable[[], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
        ready: concurrent.futures.Future[None],
    ) -> None:
        self._stopping = asyncio.Event()
        try:
            await open()
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        try:
            await self._stopping.wait()
        finally:
            await close()

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 10.0) -> T:
        """Run ``fn(*args)`` on the loop and return its result."""
        loop = self._loop
        if loop is None or self._thread is None:
            raise RuntimeError(f"{self.name} is not started")

        async def run() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> bool:
        """Ask the loop to run ``close()``, join the thread; False if it is still alive after ``timeout``."""
        thread = self._thread
        if thread is None:
            return True
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout)
        self._thread = None
        return not thread.is_alive()


def _cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel and await every pending task (what ``asyncio.run`` does on the way out)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if tasks:
        loop.run_until_complete(cancel_and_wait(*tasks))
