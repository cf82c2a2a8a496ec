"""The connect attempts of one reconnect, as a pure plan (the first piece of the
failover core without I/O).

Theory of operation
-------------------
A reconnect walks the pure schedule (``backoff.failover_schedule``: endpoints and the
delay before each). :class:`ReconnectPlan` turns it into steps for a driver: *wait
``delay`` seconds (probing the endpoints or not), then connect to ``endpoint``*. The
driver does the waiting and the connecting and reports back:

- :meth:`ReconnectPlan.cut_short`: a probe found an endpoint that accepts during the
  wait (``probe.py``); the step's connect goes there instead;
- :meth:`ReconnectPlan.failed`: the connect failed. When that connect was the one a
  probe triggered, the next wait is not probed (it runs whole): a port that accepts
  TCP but refuses the handshake (a proxy whose upstream is dead, a broker refusing the
  login) cannot turn the back-off into a loop of reconnects one probe apart.

The plan ends (``next_step()`` returns None) when the schedule does; ``attempts``
counts the connects it asked for. No socket, thread or clock here: the thread driver
(``failover.py``) runs it, an asyncio driver can run the same plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from amqtransport.backoff import Attempt

__all__ = ["ConnectStep", "ReconnectPlan"]

T = TypeVar("T")


@dataclass(frozen=True)
class ConnectStep(Generic[T]):
    """Wait ``delay`` seconds (probing the endpoints while waiting when ``probe``),
    then connect to ``endpoint``."""

    endpoint: T
    delay: float
    probe: bool
    pass_number: int


class ReconnectPlan(Generic[T]):
    """See the module docstring."""

    def __init__(self, attempts: Iterator[Attempt[T]]) -> None:
        self._attempts = attempts
        self._probe_next_wait = True
        self._cut = False
        #: connects asked for so far
        self.attempts = 0

    def next_step(self) -> ConnectStep[T] | None:
        """The next step, or None when the schedule is exhausted."""
        attempt = next(self._attempts, None)
        if attempt is None:
            return None
        probe = False
        if attempt.delay > 0:
            probe, self._probe_next_wait = self._probe_next_wait, True
        self._cut = False
        self.attempts += 1
        return ConnectStep(attempt.endpoint, attempt.delay, probe, attempt.pass_number)

    def cut_short(self, endpoint: T) -> T:
        """A probe saw ``endpoint`` accept during the step's wait: connect there now."""
        self._cut = True
        return endpoint

    def failed(self) -> None:
        """The step's connect failed."""
        if self._cut:
            self._probe_next_wait = False
