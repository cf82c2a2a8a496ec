"""``priorityBackup`` and the ``backup`` pool, for the asyncio failover driver.

Theory of operation
-------------------
The same rules as the thread driver's ``transports/failover_backup.py`` (the core's
``priority_wanted``/``backup_room``, ``endpoints.priority_attempts``), run as tasks on
the driver's event loop instead of threads. With ``priorityBackup`` a **priority**
task keeps trying the priority endpoints (the first URI, or ``priorityURIs``) while
the transport is connected elsewhere, on the failover schedule without an end, and
switches back when one answers: the link is installed only if the current one is
still the link it started from (the core's ``link_up(expect_gen=...)``). With
``backup`` a task fills a pool of ``backupPoolSize`` pre-connected links (to leaves
not in use), which the next reconnect takes first (``FailoverCore.take_backup``).
Both start after each successful connect (:meth:`AsyncBackupLinks._after_connect`).
Everything runs on the one loop, so no lock: each core call is one synchronous step.

:class:`AsyncBackupLinks` is mixed into
:class:`~amqtransport.aio.failover.AsyncFailoverTransport`; it uses the driver's core,
task set, schedule and link opener, declared below.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterator

from amqtransport._backends.base import leaf_address
from amqtransport.backoff import Attempt
from amqtransport.errors import BrokerError, TransportError
from amqtransport.options import FailoverOptions
from amqtransport.stomp import Frame
from amqtransport.transports.aio_link import AsyncLink, FrameHandler, LostHandler
from amqtransport.transports.core import FailoverCore, Install
from amqtransport.transports.endpoints import is_priority, priority_attempts
from amqtransport.transports.link import ConnectParams
from amqtransport.uri import LeafUri

__all__ = ["AsyncBackupLinks"]

log = logging.getLogger("amqtransport.aio.failover")


class AsyncBackupLinks:
    """The priority and backup-pool tasks of the asyncio driver (module docstring)."""

    # what the driver provides
    leaves: list[LeafUri]
    options: FailoverOptions
    _params: ConnectParams
    _core: FailoverCore[AsyncLink]
    _open_link: Callable[[LeafUri, ConnectParams, FrameHandler, LostHandler], Awaitable[AsyncLink]]  # LinkOpener
    _schedule: Callable[..., Iterator[Attempt[LeafUri]]]
    _rng: random.Random | None
    _sleep: Callable[[float], Awaitable[object]]
    _probing: bool

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        raise NotImplementedError

    def _notify(self, event: str, arg: object) -> None:
        raise NotImplementedError

    def _install(self, link: AsyncLink, *, expect_gen: int | None = None) -> Install[AsyncLink] | None:
        raise NotImplementedError

    def _on_frame(self, link: AsyncLink, frame: Frame) -> None:
        raise NotImplementedError

    def _lost(self, link: AsyncLink, error: TransportError) -> None:
        raise NotImplementedError

    def _after_connect(self) -> None:
        if self.options.priority_backup and not self._is_priority(self._core.link) and not self._probing:
            self._probing = True
            self._spawn(self._priority_probe(), "amq-aio-failover-priority")
        if self.options.backup:
            self._spawn(self._fill_backups(), "amq-aio-failover-backup")

    def _is_priority(self, link: AsyncLink | None) -> bool:
        return link is not None and is_priority(link.address, self.leaves, self.options)

    async def _priority_probe(self) -> None:
        gen = self._core.generation
        try:
            for attempt in priority_attempts(self.leaves, self.options, self._schedule, self._rng):
                if not self._core.priority_wanted(gen, self._is_priority(self._core.link)):
                    return
                if attempt.delay > 0:
                    await self._sleep(attempt.delay)
                if not self._core.priority_wanted(gen, self._is_priority(self._core.link)):
                    return
                try:
                    link = await self._open_link(attempt.endpoint, self._params, self._on_frame, self._lost)
                except (TransportError, BrokerError) as exc:
                    log.debug("failover: priority endpoint %s still down: %s", attempt.endpoint.host, exc)
                    continue
                if self._install(link, expect_gen=gen) is not None:
                    log.info("failover: back on priority endpoint %s", link.address)
                    self._notify("on_resumed", link.address)
                    return
        finally:
            self._probing = False

    async def _fill_backups(self) -> None:
        for leaf in self.leaves:
            if not self._core.backup_room(self.options.backup_pool_size):
                return
            current = self._core.link
            taken = {b.address for b in self._core.backups} | ({current.address} if current is not None else set())
            if leaf_address(leaf) in taken:
                continue
            try:
                link = await self._open_link(leaf, self._params, self._on_frame, self._lost)
            except (TransportError, BrokerError):
                continue
            if not self._core.add_backup(link):
                link.close()
                return
