"""``priorityBackup`` and the ``backup`` pool, for the thread failover driver.

Theory of operation
-------------------
With ``priorityBackup`` a **priority** thread keeps trying the priority endpoints
(the first URI, or ``priorityURIs``) while the transport is connected elsewhere, on
the failover schedule without an end, and switches back when one answers: the link
is installed only if the current one is still the link it started from (the core's
``link_up(expect_gen=...)``), and the previous link is then retired. With ``backup``
a thread fills a pool of ``backupPoolSize`` pre-connected links (to leaves not in
use), which the next reconnect takes first (``FailoverCore.take_backup``). Both start
after each successful connect (:meth:`BackupLinks._after_connect`).

:class:`BackupLinks` is mixed into
:class:`~amqtransport.transports.failover.FailoverTransport`; it uses the driver's
lock, core, thread set, schedule and link opener, declared below.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator

from amqtransport._backends.base import leaf_address
from amqtransport.backoff import Attempt
from amqtransport.errors import BrokerError, TransportError
from amqtransport.options import FailoverOptions
from amqtransport.transports.core import FailoverCore, Install
from amqtransport.transports.endpoints import is_priority, priority_attempts
from amqtransport.transports.link import StompConnection
from amqtransport.transports.threads import ThreadSet
from amqtransport.uri import LeafUri

__all__ = ["BackupLinks"]

log = logging.getLogger("amqtransport.transports.failover")


class BackupLinks:
    """The priority and backup-pool threads of the thread driver (module docstring)."""

    # what the driver provides
    leaves: list[LeafUri]
    options: FailoverOptions
    _lock: threading.RLock
    _core: FailoverCore[StompConnection]
    _threads: ThreadSet
    _schedule: Callable[..., Iterator[Attempt[LeafUri]]]
    _rng: random.Random | None
    _sleep: Callable[[float], object]
    _closed: bool
    _probing: bool
    _notify: Callable[..., None]  # Transport._notify (an annotation only: not shadowed here)

    def _open(self, leaf: LeafUri) -> StompConnection:
        raise NotImplementedError

    def _install(self, conn: StompConnection, *, expect_gen: int | None = None) -> Install[StompConnection] | None:
        raise NotImplementedError

    def _after_connect(self) -> None:
        if self.options.priority_backup and not self._is_priority(self._core.link):
            self._start_probe()
        if self.options.backup:
            self._threads.spawn(self._fill_backups, "amq-failover-backup")

    def _is_priority(self, conn: StompConnection | None) -> bool:
        return conn is not None and is_priority(conn.address, self.leaves, self.options)

    def _start_probe(self) -> None:
        with self._lock:
            if self._probing:
                return
            self._probing = True
        self._threads.spawn(self._probe, "amq-failover-priority")

    def _wanted(self, gen: int) -> bool:
        with self._lock:
            return not self._closed and self._core.priority_wanted(gen, self._is_priority(self._core.link))

    def _probe(self) -> None:
        gen = self._core.generation
        try:
            for attempt in priority_attempts(self.leaves, self.options, self._schedule, self._rng):
                if not self._wanted(gen):
                    return  # closed, moved (_after_connect starts a new probe) or back on priority
                if attempt.delay > 0:
                    self._sleep(attempt.delay)
                if not self._wanted(gen):
                    return
                try:
                    conn = self._open(attempt.endpoint)
                except (TransportError, BrokerError) as exc:
                    log.debug("failover: priority endpoint %s still down: %s", leaf_address(attempt.endpoint), exc)
                    continue
                if self._install(conn, expect_gen=gen) is not None:
                    log.info("failover: back on priority endpoint %s", conn.address)
                    self._notify("on_resumed", conn.address)
                    return
        finally:
            with self._lock:
                self._probing = False

    def _fill_backups(self) -> None:
        size = self.options.backup_pool_size
        for leaf in self.leaves:
            with self._lock:
                if self._closed or not self._core.backup_room(size):
                    return
                taken = {c.address for c in self._core.backups}
                if self._core.link is not None:
                    taken.add(self._core.link.address)
            if leaf_address(leaf) in taken:
                continue
            try:
                conn = self._open(leaf)
            except (TransportError, BrokerError):
                continue
            with self._lock:
                added = self._core.add_backup(conn)
            if not added:
                conn.close()
                return
