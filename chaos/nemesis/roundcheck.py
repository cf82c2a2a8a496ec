"""The round's quick look in a process of its own.

After each round the nemesis runs the checker on the last minute of history
(:mod:`chaos.nemesis.runner`, step 5). In the workload's own process its half second of
pure Python held the GIL against the clients' and the proxies' threads, which then moved
no byte for up to two seconds: receipts stopped, clients and brokers each took the other
for silent, and the next round's first windows counted as unavailable. So the look runs
in one child process, started once (``spawn``: a fork of the many-threaded workload is
unsafe) and reused, the history going over as its JSON form. A child that cannot start
or dies costs nothing but time: the look is then taken here, never a verdict lost.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from chaos.nemesis.checker import Violation, check
from chaos.nemesis.history import History

__all__ = ["RoundCheck"]

log = logging.getLogger("chaos.nemesis.runner")  # the runner's logger, as before the move


def _check_json(data: dict[str, Any]) -> tuple[int, list[Violation]]:
    """:class:`RoundCheck`'s child: (its pid, the quick look's violations)."""
    return os.getpid(), check(History.from_json(data), complete=False).violations


class RoundCheck:
    """The round's quick look (module docstring, step 5) in a child process, started once
    (``spawn``: a fork of this many-threaded process is unsafe) and reused; the history
    goes over as its JSON form. A child that cannot start or dies: the look runs here."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self.pid: int | None = None  # the child the last look ran in (None: here)

    def violations(self, h: History, timeout: float = 300.0) -> list[Violation]:
        data = h.to_json()
        try:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            self.pid, found = self._pool.submit(_check_json, data).result(timeout)
            return found
        except Exception as exc:  # noqa: BLE001 - a look lost is a look taken here, never a verdict lost
            log.warning("the round check's process failed (%r): checking in this process", exc)
            self.close()
            self.pid = None
            return check(h, complete=False).violations

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
