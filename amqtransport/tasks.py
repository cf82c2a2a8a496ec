"""Ending asyncio tasks for sure: :func:`cancel_and_wait`.

Theory of operation
-------------------
``task.cancel()`` asks once. The task sees a ``CancelledError`` at its next ``await``
and almost always ends. Not always, on Python 3.11: ``asyncio.wait_for`` that is
cancelled in the very turn its inner future finished returns that future's result
(or raises its exception) instead of the ``CancelledError`` (CPython gh-86296; 3.12
rewrote ``wait_for``). A task that loops around such a call -- a probe whose
connection is refused the moment it is cancelled, then ``except OSError`` -- goes on
as if nobody had asked, and whoever awaits it after one ``cancel()`` waits forever.
Found by the nemesis: a shared-store standby took the store lock, cancelled the task
that watched for a master (the master had just died: its port refused at once), and
waited for that task with the lock held, as a slave, for good; the pair had no master.

:func:`cancel_and_wait` cancels again every ``every`` seconds until each task is done.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(*tasks: asyncio.Future[Any], every: float = 0.05) -> None:
    """Cancel ``tasks`` and return once every one has ended, cancelling again those
    that swallowed the cancel (see the module docstring). What they raised or returned
    is dropped (retrieved, so asyncio does not log it as never retrieved). Cancelling
    the caller meanwhile cancels the caller; the tasks are then still being cancelled."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=every)
    for task in tasks:
        if not task.cancelled():
            with contextlib.suppress(BaseException):
                task.exception()
