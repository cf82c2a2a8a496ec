"""The background threads of a transport or agent, started and joined in one place.

A thread is put in the set only once it has started, under the set's lock: ``join_all``
(called by ``close()``/``stop()`` from another thread) never sees a thread that was
created but not started yet (``Thread.join`` raises on one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["ThreadFactory", "ThreadSet"]

#: ``factory(target, name)``: an unstarted daemon thread
ThreadFactory = Callable[[Callable[[], None], str], threading.Thread]


def _daemon(target: Callable[[], None], name: str) -> threading.Thread:
    return threading.Thread(target=target, name=name, daemon=True)


class ThreadSet:
    """Daemon threads started with :meth:`spawn`, joined by :meth:`join_all`."""

    def __init__(self, factory: ThreadFactory = _daemon) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def spawn(self, target: Callable[[], None], name: str) -> None:
        """Start ``target`` in a new daemon thread called ``name``."""
        t = self._factory(target, name)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            t.start()
            self._threads.append(t)

    def join_all(self, timeout: float = 5.0) -> None:
        """Join every thread started so far (but the calling one), each for up to ``timeout`` s."""
        with self._lock:
            threads = list(self._threads)
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join(timeout=timeout)
