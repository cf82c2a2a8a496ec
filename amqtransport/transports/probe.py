"""Cut a reconnect back-off, or an unanswered CONNECT, short when a broker starts
accepting connections.

Theory of operation
-------------------
Between two connect passes the failover transport sleeps its back-off (exponential:
up to ``maxReconnectDelay``). After a master dies, the slave binds its client port
only when it has taken over, so the wait, not the takeover, decided how long a client
stayed disconnected. While it waits, the transport now tries a bare TCP connect to
each endpoint every ``probeInterval`` ms (100 by default, ``probeInterval=0`` turns
it off): the first endpoint that accepts ends the wait and is tried at once. The
client reconnects about one probe after the takeover.

A probe proves that a port accepts (and does not close the connection within
:data:`PROBE_SETTLE`: a proxy accepts first and closes once its upstream refused),
not that the STOMP handshake will succeed (a broker that refuses our login accepts
TCP). So a probe-cut attempt that fails
disables the probe for the wait that follows: the back-off then runs whole, and a
broker that accepts and refuses cannot turn the back-off into a loop of 100 ms
reconnects.

*While a CONNECT goes unanswered.* A frozen or isolated master still accepts TCP (its
kernel, or the proxy in front of it, does) but never answers the STOMP CONNECT, so an
attempt there costs the whole connect timeout (``connectTimeout``). The standby that
refused a moment before in the same pass (its port closed: it listens only once it
has taken over) may be serving long before that. So while an attempt to endpoint E is
pending (TCP connecting, or connected with no CONNECTED yet), the transport probes,
every ``probeInterval`` ms, the endpoints whose last attempt in this reconnect was
*refused* (``ConnectRefused``: a closed port, or a connection closed or reset before
any byte of an answer, which is how a proxy in front of a refusing broker refuses;
not E, not one that timed out or failed its handshake: a probe could not tell those
apart from their last failure). The
first that accepts TCP ends the attempt on E: its socket is closed, the attempt counts
as E's failed attempt of the pass ("abandoned: X accepts connections"), and X is
connected to at once; the schedule then goes on where it was. The same guard as the
back-off's: when an attempt a probe chose (either probe) fails, no pending CONNECT is
cut again until the next pass, so a port that accepts and then fails the handshake
cannot loop. ``probeInterval=0`` turns both probes off.

:class:`ProbingWait` is the timing rule, pure (the clock is injected): it says how
long to sleep next and which endpoints to probe then; a pending CONNECT is a wait as
long as its connect timeout that ends early when the attempt does. :class:`ConnectRace`
is the rest of the second rule, pure too: which endpoints refused in this reconnect,
which to probe beside an attempt, and the guard; the reconnect plan
(``reconnect.ReconnectPlan``) holds one per reconnect and feeds it each attempt's
outcome. :func:`wait_probing` runs a wait with an injected blocking sleep and probe
(the thread driver sleeps on an event that ``close()`` sets); the asyncio driver runs
the same rules with ``await``; each driver runs a pending CONNECT beside its probes
and abandons it when a probe wins (``failover.py``, ``aio/failover.py``).
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from amqtransport.errors import ConnectionClosed
from amqtransport.uri import LeafUri

__all__ = ["DEFAULT_PROBE_INTERVAL", "PROBE_SETTLE", "ConnectRace", "Opening", "Probe", "ProbingWait", "open_probing", "settle_time",
           "tcp_probe", "wait_probing"]

T = TypeVar("T")

#: seconds between two probes of the endpoints (the URI's ``probeInterval``, ms)
DEFAULT_PROBE_INTERVAL = 0.1

#: seconds (at most) a probe's connection must stay open: a proxy in front of a broker
#: that refuses accepts the probe and closes it (at once, once its own connect failed)
PROBE_SETTLE = 0.05

#: ``probe(endpoint, timeout)``: True when a TCP connect to it succeeds in time
Probe = Callable[[LeafUri, float], bool]


class ProbingWait(Generic[T]):
    """The rule of a probing wait, for any driver: sleep :meth:`next_sleep` seconds, then
    probe :meth:`slept`'s endpoints in order; the first that accepts ends the wait."""

    def __init__(self, delay: float, endpoints: Sequence[T], *, probing: bool, every: float,
                 clock: Callable[[], float]) -> None:
        self._delay = delay
        self._endpoints = list(endpoints) if probing and every > 0 else []
        self._every = every
        self._clock = clock
        self._deadline = clock() + delay
        self._slept = 0.0
        self._plain = not self._endpoints
        self._plain_done = False

    def _left(self) -> float:
        # over when the clock says so or the sleeps add up to it (an injected sleep
        # that returns at once must not make this a busy loop on a real clock)
        return min(self._deadline - self._clock(), self._delay - self._slept)

    def next_sleep(self) -> float | None:
        """Seconds to sleep next, or None when the wait is over. Without probing: the
        whole delay, once."""
        if self._plain:
            return None if self._plain_done else self._delay
        left = self._left()
        return None if left <= 0 else min(self._every, left)

    def slept(self, seconds: float) -> Sequence[T]:
        """``seconds`` were slept: the endpoints to probe now (none once the wait is over)."""
        self._slept += seconds
        self._plain_done = self._plain
        if self._plain or self._left() <= 0:
            return ()
        return self._endpoints


class ConnectRace(Generic[T]):
    """Which endpoints to probe while a CONNECT is unanswered, over one reconnect (the
    module docstring's second rule). The plan reports every failed attempt
    (:meth:`failed`); :meth:`targets` are the endpoints to probe beside an attempt."""

    def __init__(self, *, enabled: bool) -> None:
        self._enabled = enabled
        #: endpoints whose last attempt in this reconnect was refused, in refusal order
        self._refused: list[T] = []
        self._off_in_pass: int | None = None

    def failed(self, endpoint: T, pass_number: int, *, refused: bool, chosen: bool) -> None:
        """The attempt to ``endpoint`` in pass ``pass_number`` failed; ``refused``: its
        TCP connect was refused; ``chosen``: a probe had chosen it (no cut for the rest
        of the pass)."""
        self._refused = [e for e in self._refused if e != endpoint]
        if refused:
            self._refused.append(endpoint)
        if chosen:
            self._off_in_pass = pass_number

    def targets(self, endpoint: T, pass_number: int) -> list[T]:
        """The endpoints to probe while the attempt to ``endpoint`` (pass
        ``pass_number``) is unanswered; empty: none (probing off, or after a chosen
        attempt failed in this pass)."""
        if not self._enabled or self._off_in_pass == pass_number:
            return []
        return [e for e in self._refused if e != endpoint]


def wait_probing(
    delay: float,
    endpoints: Sequence[T],
    probe: Callable[[T, float], bool] | None,
    *,
    every: float,
    sleep: Callable[[float], object],
    clock: Callable[[], float],
    stop: Callable[[], bool] = lambda: False,
) -> T | None:
    """Sleep ``delay`` seconds, probing ``endpoints`` every ``every`` seconds; the first
    endpoint that accepts, at once, else None when the delay is over (or ``stop()``).
    No probe (None, or ``every`` <= 0): one plain ``sleep(delay)``. The blocking driver
    of :class:`ProbingWait`."""
    wait = ProbingWait(delay, endpoints, probing=probe is not None, every=every, clock=clock)
    while (step := wait.next_sleep()) is not None:
        if stop():
            return None
        sleep(step)
        if stop():
            return None
        for endpoint in wait.slept(step):
            assert probe is not None
            if probe(endpoint, every):
                return endpoint
    return None


class Opening(Protocol):
    """A link :func:`open_probing` can open and abandon: ``close`` from another thread
    makes a running ``open`` fail (or closes what it opened)."""

    def open(self) -> object: ...

    def close(self, *, disconnect: bool = True) -> None: ...


LinkT = TypeVar("LinkT", bound=Opening)


class _PendingOpen(Generic[LinkT]):
    """``link.open()`` on a thread of its own, which may be abandoned while it runs: the
    link is closed then (a thread still in its TCP connect closes what it gets)."""

    def __init__(self, link: LinkT) -> None:
        self.link = link
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._finished = self._abandoned = False
        threading.Thread(target=self._run, name="amq-failover-open", daemon=True).start()

    def _run(self) -> None:
        try:
            self.link.open()
        except BaseException as exc:  # noqa: BLE001 - raised by result()
            self._error = exc
        with self._lock:
            self._finished = True
            if self._abandoned:
                self.link.close(disconnect=False)
        self.done.set()

    def abandon(self) -> bool:
        """Close the link being opened; False when its open had finished already."""
        with self._lock:
            if self._finished:
                return False
            self._abandoned = True
            self.link.close(disconnect=False)
            return True

    def result(self) -> LinkT:
        """The opened link, or the open's error (waits for the open to end)."""
        self.done.wait()
        if self._error is not None:
            raise self._error
        return self.link


def open_probing(
    link: LinkT,
    targets: Sequence[T],
    probe: Callable[[T, float], bool],
    *,
    every: float,
    timeout: float,
    clock: Callable[[], float],
    stop: Callable[[], bool] = lambda: False,
) -> tuple[LinkT | None, T | None]:
    """Open ``link`` (its ``open`` bounded by ``timeout`` seconds) on a thread of its own
    and, while it is unanswered, probe ``targets`` every ``every`` seconds: ``(link,
    None)`` once opened (or the open's error), ``(None, target)`` when ``target``
    accepted first and the open was abandoned. ``stop()``: abandon and raise
    ``ConnectionClosed``. The blocking driver of a pending CONNECT (the module docstring)."""
    pending = _PendingOpen(link)
    wait = ProbingWait(timeout, targets, probing=True, every=every, clock=clock)
    while (pause := wait.next_sleep()) is not None and not pending.done.wait(pause):
        if stop():
            if not pending.abandon():
                link.close(disconnect=False)
            raise ConnectionClosed("connection closed while connecting")
        for target in wait.slept(pause):
            if not pending.done.is_set() and probe(target, every):
                if pending.abandon():
                    return None, target
                break
    return pending.result(), None


def settle_time(timeout: float) -> float:
    """How long a probe's connection must stay open to count (see :func:`tcp_probe`)."""
    return min(PROBE_SETTLE, max(timeout, 0.0) / 2)


def tcp_probe(leaf: LeafUri, timeout: float) -> bool:
    """True when a bare TCP connect to ``leaf`` succeeds within ``timeout`` and the peer
    does not close it within :func:`settle_time` (a proxy accepts first and closes when
    its upstream refuses: that is no broker). vm:// and ssl:// leaves are probed on
    their TCP port; nothing is written."""
    if leaf.scheme == "vm":
        return False
    try:
        with socket.create_connection((leaf.host, leaf.port), timeout=max(timeout, 0.05)) as sock, \
                selectors.DefaultSelector() as waiting:  # not select.select(): fds >= 1024 (ValueError)
            waiting.register(sock, selectors.EVENT_READ)
            readable = waiting.select(settle_time(timeout))
            return not readable or sock.recv(1, socket.MSG_PEEK) != b""
    except OSError:
        return False
