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
  login) cannot turn the back-off into a loop of reconnects one probe apart;
- :meth:`ReconnectPlan.race_targets`: the endpoints to probe while the connect is
  unanswered (those that refused in this reconnect: ``probe.ConnectRace``), and
  :meth:`ReconnectPlan.abandoned`: one of them accepted, the pending connect was
  abandoned (reported with :meth:`~ReconnectPlan.failed` first) and the driver
  connects there now, one more connect asked for, out of the schedule.

The plan ends (``next_step()`` returns None) when the schedule does; ``attempts``
counts the connects it asked for.

:class:`ConnectPolicy` is the rest of what both drivers do while connecting, kept once:
which connect errors another attempt may cure (a ``TransportError`` or a
``BrokerError``, not a refused login), the last error, when to warn
(``warnAfterReconnectAttempts``), what is logged, and the
:class:`~amqtransport.errors.ReconnectExhausted` to give up with, naming the option
that ran out. :class:`~amqtransport.transports.core.FailoverCore` holds one and is
what the drivers call. No socket, thread or clock here: the thread driver
(``failover.py``) and the asyncio driver (``aio/failover.py``) only wait and connect.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from amqtransport.backoff import Attempt
from amqtransport.errors import (
    AuthenticationError,
    BrokerError,
    ConnectError,
    ConnectRefused,
    ReconnectExhausted,
    TransportError,
)
from amqtransport.options import FailoverOptions
from amqtransport.transports.probe import ConnectRace

__all__ = ["ConnectPolicy", "ConnectStep", "ReconnectPlan"]

log = logging.getLogger("amqtransport.transports.failover")

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

    def __init__(self, attempts: Iterator[Attempt[T]], *, race: bool = False) -> None:
        self._attempts = attempts
        self._probe_next_wait = True
        self._cut = False
        self._race: ConnectRace[T] = ConnectRace(enabled=race)
        self._endpoint: T | None = None  # the one being connected to
        self._pass = 0
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
        self._endpoint, self._pass = attempt.endpoint, attempt.pass_number
        return ConnectStep(attempt.endpoint, attempt.delay, probe, attempt.pass_number)

    def cut_short(self, endpoint: T) -> T:
        """A probe saw ``endpoint`` accept during the step's wait: connect there now."""
        self._cut = True
        self._endpoint = endpoint
        return endpoint

    def race_targets(self) -> list[T]:
        """The endpoints to probe while the current connect is unanswered (may be none)."""
        return [] if self._endpoint is None else self._race.targets(self._endpoint, self._pass)

    def abandoned(self, probed: T) -> T:
        """A probe saw ``probed`` accept while the current connect was unanswered; that
        connect was abandoned (and reported :meth:`failed`): connect to ``probed`` now."""
        self.attempts += 1
        return self.cut_short(probed)

    def failed(self, *, refused: bool = False) -> None:
        """The current connect failed (``refused``: its TCP connect was refused)."""
        if self._cut:
            self._probe_next_wait = False
        if self._endpoint is not None:
            self._race.failed(self._endpoint, self._pass, refused=refused, chosen=self._cut)


class ConnectPolicy(Generic[T]):
    """One connect (startup) or reconnect at a time: its plan and what is decided about
    each attempt (see the module docstring)."""

    def __init__(self, options: FailoverOptions) -> None:
        self.options = options
        self._plan: ReconnectPlan[T] | None = None
        self._startup = False
        self._endpoints = 0
        #: the error of the last failed attempt (or of the lost link), for ReconnectExhausted
        self.last_error: BaseException | None = None
        #: connect attempts that failed since the last success
        self.failed_attempts = 0

    def begin(self, endpoints: int, attempts: Iterator[Attempt[T]], *, startup: bool,
              last_error: BaseException | None) -> None:
        self._plan = ReconnectPlan(attempts, race=self.options.probe_interval > 0)
        self._startup = startup
        self._endpoints = endpoints
        self.last_error = last_error

    @property
    def plan(self) -> ReconnectPlan[T]:
        assert self._plan is not None, "begin a connect first"
        return self._plan

    @property
    def attempts(self) -> int:
        return self._plan.attempts if self._plan is not None else 0

    def failed(self, address: str, error: BaseException) -> None:
        """The step's connect to ``address`` failed with ``error``: re-raises it when
        another attempt cannot help, else notes and logs it (a warning every
        ``warnAfterReconnectAttempts`` failures)."""
        if isinstance(error, AuthenticationError) or not isinstance(error, (TransportError, BrokerError)):
            raise error
        self.plan.failed(refused=isinstance(error, ConnectRefused))
        self.last_error = error
        self.failed_attempts += 1
        every = self.options.warn_after_reconnect_attempts
        if every > 0 and self.failed_attempts % every == 0:
            log.warning("failover: %d failed connect attempts so far (last: %s: %s)", self.failed_attempts,
                        address, error)
        else:
            log.debug("failover: attempt %d to %s failed: %s", self.attempts, address, error)

    def abandon(self, address: str, probed: T, probed_address: str) -> T:
        """``probed`` accepts connections while the connect to ``address`` is unanswered:
        that attempt failed ("abandoned"), the endpoint to connect to now."""
        log.info("failover: %s accepts connections while the CONNECT to %s is unanswered: connecting there",
                 probed_address, address)
        self.failed(address, ConnectError(f"{address}: abandoned: {probed_address} accepts connections"))
        return self.plan.abandoned(probed)

    def succeeded(self, description: str) -> None:
        self.failed_attempts = 0
        log.info("failover: connected to %s", description)

    def exhausted(self) -> ReconnectExhausted:
        """The error for a schedule that ran out."""
        which = "startupMaxReconnectAttempts" if self._startup and (
            self.options.startup_max_reconnect_attempts != -1) else "maxReconnectAttempts"
        return ReconnectExhausted(
            f"failover: gave up after {self.attempts} connect attempts over {self._endpoints} endpoint(s) "
            f"({which} exhausted); last error: {self.last_error}",
            attempts=self.attempts, last_error=self.last_error,
        )
