"""The failover transport: ActiveMQ's ``failover:`` over STOMP links, the thread driver
of :class:`~amqtransport.transports.core.FailoverCore`.

Theory of operation
-------------------
Every failover rule (states, the request map, the replay, trackMessages, transactions,
refusals, when to give up) lives in the sans-IO core (``core.py``, whose docstring has
them). This module owns what the core does not: sockets, threads, the clock and the
waiting. It feeds the core one event at a time under its one lock and carries out the
actions the core returns (:meth:`_run`).

*Who runs what.* ``start()`` connects in the caller's thread (the startup schedule:
``startupMaxReconnectAttempts`` or ``maxReconnectAttempts``). Afterwards each link has
its own reader thread (``StompConnection``), which feeds frames (:meth:`_on_frame`) and
the link's loss (:meth:`_lost`). When the core answers a loss with ``Reconnect`` a
**supervisor** thread (one at a time: the core asks for one) tells listeners
``on_interrupted(error)``, walks the core's connect steps (waiting each step's delay
through :func:`~amqtransport.transports.probe.wait_probing` with the injected
``sleep``), installs the first link that completes the STOMP handshake, then calls
``on_resumed(address)``. While the core names endpoints to probe beside a connect
(``core.connect_race``: ones that refused in this reconnect), the open runs on a
thread of its own and the loop probes them every ``probeInterval``
(:func:`~amqtransport.transports.probe.open_probing`); the first that accepts
abandons the open (``core.connect_abandoned``). The ``priorityBackup`` thread and the
``backup`` pool's thread are in ``failover_backup.py``. A ``threading.Timer``
runs the trackMessages idle barrier. Listeners are called from these threads, wrapped:
a raising listener is logged and cannot stop the reconnect loop. Threads are started
and joined through one :class:`~amqtransport.transports.threads.ThreadSet`.

*Locks.* One re-entrant lock (``self._lock``, with a condition) serializes every call
into the core. Network writes of ordinary requests happen *outside* the lock (so a slow
socket never blocks the reader's dispatch); the replay after a reconnect is written
*inside* it, so nothing new can overtake it on the new link. Requests are settled and
listeners told outside the lock.

*Waiting.* ``timeout`` (ms, -1 = forever) bounds how long a caller waits while the
transport is disconnected: past it the request is withdrawn from the core and
``SendTimeout`` is raised (it may or may not have reached a broker; re-sending it with
the same idempotency key is safe on brokers that honour the key). A fire-and-forget
frame (``receipt=False``) waits for a link (same ``timeout``) and is retried once per
new link until one write succeeds; ACK/NACK are never replayed: the broker redelivers
unacknowledged messages and the client's duplicate filter copes. After a refusal the
stepwise replay (``replay.py``) writes one request at a time and waits up to
:data:`STEPWISE_WAIT` for each outcome.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from amqtransport._backends.base import Backend, leaf_address
from amqtransport.backoff import Attempt, failed_last
from amqtransport.errors import (
    AmqTransportError,
    AuthenticationError,
    ConnectionClosed,
    ReconnectExhausted,
    SendTimeout,
    TransportError,
)
from amqtransport.options import FailoverOptions
from amqtransport.stomp import Frame
from amqtransport.transports.base import Link, Receipt, Transport, with_receipt
from amqtransport.transports.core import (
    STEPWISE_WAIT,
    UNEXPECTED_PAUSE,
    Action,
    ArmIdleTimer,
    Close,
    FailoverCore,
    Install,
    Notify,
    Reconnect,
    Settle,
    Write,
)
from amqtransport.transports.core_actions import Refused, Skip, StopReplay
from amqtransport.transports.core_view import CoreStatus
from amqtransport.transports.endpoints import UriParser, endpoints
from amqtransport.transports.failover_backup import BackupLinks
from amqtransport.transports.link import Clock, ConnectParams, StompConnection, connect_timeout_for
from amqtransport.transports.probe import Probe, open_probing, wait_probing
from amqtransport.transports.replay import TRACK_IDLE_SECONDS
from amqtransport.transports.threads import ThreadSet
from amqtransport.transports.waiting import ReceiptWait, send_timeout
from amqtransport.uri import LeafUri

__all__ = ["FailoverTransport"]

log = logging.getLogger(__name__)

Sleep = Callable[[float], object]
ScheduleFn = Callable[..., Iterator[Attempt[LeafUri]]]
Conn = StompConnection

#: how long a link that died under it may take to deliver the broker's last words
STEPWISE_READER_WAIT = 2.0


class FailoverTransport(CoreStatus[StompConnection], BackupLinks, Transport):
    """``failover:(u1,u2,...)?options`` — see the module docstring."""

    def __init__(
        self,
        leaves: Sequence[LeafUri],
        options: FailoverOptions,
        params: ConnectParams = ConnectParams(),  # noqa: B008 - frozen
        *,
        backend: Backend,
        sleep: Sleep | None = None,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        schedule: ScheduleFn | None = None,
        uri_parser: UriParser | None = None,
        probe: Probe | None = None,
        threads: ThreadSet | None = None,
    ) -> None:
        super().__init__()
        if not leaves:
            raise ValueError("failover needs at least one endpoint")
        self.leaves: list[LeafUri] = list(leaves)
        self.options = options
        self._params = params
        self._backend = backend
        self._closed_event = threading.Event()
        self._sleep: Sleep = sleep if sleep is not None else self._closed_event.wait
        self._clock = clock
        self._rng = rng
        from amqtransport.backoff import failover_schedule

        if schedule is None:
            schedule = failover_schedule
        #: a ``failover:`` schedule tries the lost broker last; ``static:`` / ``masterslave:``
        #: keep their order (ActiveMQ builds a new failover transport for each of their passes)
        self._lost_last = schedule is failover_schedule
        self._schedule = schedule
        self._uri_parser = uri_parser
        #: the bare TCP probe run while a back-off sleeps (None: never; probe.py)
        self._tcp_probe = probe
        self._cond = threading.Condition(self._lock)
        self._core: FailoverCore[Conn] = FailoverCore(options, self.next_id)
        self._pending = self._core.pending  # one request map: Transport._on_error reads it too
        self._idle_timer: threading.Timer | None = None
        self._probing = False
        self._threads = threads if threads is not None else ThreadSet()
        self._timeout_ms = options.timeout
        #: the address of the link lost last: a reconnect tries it last (``backoff.failed_last``)
        self._failed_address: str | None = None

    # -- running the core's actions ---------------------------------------------------------

    def _run(self, actions: Sequence[Action[Conn]]) -> None:
        """Carry out ``actions`` in order (the lock is not held: they write, close and call out)."""
        for action in actions:
            if isinstance(action, Settle):
                if action.error is not None:
                    action.request.set_error(action.error)
                else:
                    assert action.result is not None
                    action.request.set_result(action.result)
            elif isinstance(action, Write):
                self._write(action)
            elif isinstance(action, Close):
                action.link.close(disconnect=action.disconnect)
            elif isinstance(action, Notify):
                self._notify(action.event, action.arg)
            elif isinstance(action, Reconnect):
                self._threads.spawn(functools.partial(self._supervise, action.error), "amq-failover-supervisor")
            elif isinstance(action, ArmIdleTimer):
                self._arm_idle_timer(action.delay)

    @staticmethod
    def _write(action: Write[Conn]) -> bool:
        """Write; a failed write kills the link (its reader then reports the loss)."""
        link = action.link
        try:
            if len(action.frames) == 1:
                link.write(action.frames[0])
            else:
                link.write_many(action.frames)
            return True
        except TransportError as exc:
            link.kill(exc)
            return False

    def _arm_idle_timer(self, delay: float = TRACK_IDLE_SECONDS) -> None:
        with self._lock:
            if self._idle_timer is not None or self._core.closed:
                return
            self._idle_timer = threading.Timer(delay, self._idle_barrier)
            self._idle_timer.daemon = True
            self._idle_timer.start()

    def _idle_barrier(self) -> None:
        """The trackMessages idle timer fired: write the barrier the core asks for."""
        with self._lock:
            self._idle_timer = None
            barrier = self._core.barrier()
        if barrier is None:
            return
        write, rid = barrier
        self._write(write)
        with self._lock:
            self._core.barrier_written(rid, write.generation)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            self._core.start()
        while True:
            try:
                conn = self._connect_loop(startup=True, last_error=None)
            except (ReconnectExhausted, AuthenticationError) as exc:
                with self._lock:
                    actions = self._core.startup_failed(exc)
                self._run(actions)
                raise
            if self._install(conn) is not None:
                break
        self._after_connect()

    def close(self) -> None:
        with self._lock:
            if self._core.closed:
                return
            actions = self._core.close()
            self._closed = True
            self._cond.notify_all()
            timer, self._idle_timer = self._idle_timer, None
        if timer is not None:
            timer.cancel()
        self._closed_event.set()
        self._run(actions)
        self._threads.join_all()

    # -- connecting -----------------------------------------------------------------------

    def _endpoints(self) -> list[LeafUri]:
        return endpoints(self.leaves, self.options.update_uris_url, self._uri_parser)

    def _open(self, leaf: LeafUri) -> StompConnection:
        conn = StompConnection(leaf, backend=self._backend, params=self._params, clock=self._clock,
                               on_frame=self._on_frame, on_lost=self._lost)
        conn.open()
        return conn

    def _connect_loop(self, *, startup: bool, last_error: BaseException | None) -> StompConnection:
        """Walk the core's connect steps until one link completes its handshake (the
        policy is the core's: this waits and connects)."""
        with self._lock:
            backup = self._core.take_backup(lambda c: c.alive)
        if backup is not None:
            log.info("failover: using pre-connected backup %s", backup.address)
            return backup
        endpoints = self._endpoints()
        with self._lock:
            attempts = self._schedule(endpoints, self.options, startup=startup, rng=self._rng)
            self._core.begin_connect(endpoints, failed_last(attempts, self._failed_address if self._lost_last and not startup else None),
                                     startup=startup, last_error=last_error)
        while True:
            with self._lock:
                step = self._core.next_connect()
            probed = None
            if step.delay > 0:
                log.debug("failover: sleeping %.3fs before pass %d", step.delay, step.pass_number)
                probed = wait_probing(step.delay, endpoints, self._tcp_probe if step.probe else None,
                                      every=self.options.probe_interval / 1000.0, sleep=self._sleep,
                                      clock=self._clock, stop=lambda: self._closed)
                if probed is not None:
                    log.info("failover: %s accepts connections: connecting now", leaf_address(probed))
            with self._lock:
                endpoint = self._core.connect_to(step, probed)
            conn: StompConnection | None = None
            while conn is None:
                with self._lock:
                    race = self._core.connect_race()
                try:
                    conn, won = self._open_racing(endpoint, race)
                except AmqTransportError as exc:
                    with self._lock:
                        self._core.connect_failed(leaf_address(endpoint), exc)
                    break
                if won is not None:  # a probe saw a refusing endpoint accept: go there now
                    with self._lock:
                        endpoint = self._core.connect_abandoned(endpoint, won)
            if conn is None:
                continue
            server = conn.connected_frame.get("server") if conn.connected_frame is not None else None
            with self._lock:
                self._core.connect_succeeded(f"{conn.address} ({server or 'no server header'}, "
                                             f"dialect {conn.dialect.name})")
            return conn

    def _open_racing(self, leaf: LeafUri, race: Sequence[LeafUri]) -> tuple[StompConnection | None, LeafUri | None]:
        """Open ``leaf``; while it is unanswered, probe ``race``: the link, or (None, the
        endpoint that accepted) when a probe won and the open was abandoned."""
        if not race or self._tcp_probe is None:
            return self._open(leaf), None
        conn = StompConnection(leaf, backend=self._backend, params=self._params, clock=self._clock,
                               on_frame=self._on_frame, on_lost=self._lost)
        return open_probing(conn, race, self._tcp_probe, every=self.options.probe_interval / 1000.0,
                            timeout=connect_timeout_for(leaf, self._params), clock=self._clock,
                            stop=lambda: self._closed)

    def _install(self, conn: StompConnection, *, expect_gen: int | None = None) -> Install[Conn] | None:
        """Make ``conn`` the current link and write its replay (under the lock, so nothing
        overtakes it); the install, or None when the link was not installed.

        ``expect_gen`` (priority switch): only if the current link is still that one. When
        the plan has ``stepwise`` requests the state is ``replaying`` and the caller runs
        :meth:`_replay_stepwise` next."""
        with self._lock:
            install = self._core.link_up(conn, expect_gen=expect_gen)
            if install is None:
                conn.close()
                return None
            if self._core.closed:
                actions: list[Action[Conn]] | None = install.actions
            else:
                conn.tag = install.generation
                plan = install.plan
                try:
                    conn.write_many(plan.batch)
                    ok = True
                except TransportError as exc:
                    log.info("failover: %s died during replay: %s", conn.address, exc)
                    ok = False
                previous = install.previous
                actions = self._core.replay_written(install, ok=ok, alive=conn.alive,
                                                    previous_alive=previous is not None and previous.alive)
                if actions is None:
                    conn.close(disconnect=False)
                else:
                    self._cond.notify_all()
                    if plan.batch or plan.stepwise:
                        log.info("failover: replayed %d frame(s) on %s (%d subscription(s))%s", len(plan.batch),
                                 conn.address, len(self._core.subs),
                                 f"; {len(plan.stepwise)} request(s) follow one at a time" if plan.stepwise else "")
        if actions is None:
            return None
        self._run(actions)
        return install

    def _replay_stepwise(self, conn: StompConnection, install: Install[Conn]) -> bool:
        """Write the plan's ``stepwise`` requests one at a time after a refusal (module
        docstring of ``replay.py``); True once the link is ``connected``, False when it was lost."""
        gen = install.generation
        for rec in install.plan.stepwise:
            with self._lock:
                step = self._core.stepwise_next(conn, rec, gen)
            if isinstance(step, StopReplay):
                return False
            if isinstance(step, Skip):
                continue  # settled meanwhile
            try:
                conn.write(rec.frame)
            except TransportError as exc:
                # the broker may have refused it and closed: read its ERROR before judging
                conn.wait_reader(STEPWISE_READER_WAIT)
                conn.kill(exc)
            else:
                if rec.tx is not None and rec.frame.command == "SEND":
                    continue  # some brokers answer a transactional SEND only after its COMMIT
                deadline = self._clock() + STEPWISE_WAIT
                while not rec.wait_event(0.05):
                    with self._lock:
                        if not self._core.still_replaying(conn):
                            break
                    if self._clock() >= deadline:
                        log.warning("failover: no answer to %s within %.0f s; replaying the rest at once",
                                    rec.frame.command, STEPWISE_WAIT)
                        break
            if not rec.done and not conn.alive:
                conn.wait_reader(STEPWISE_READER_WAIT)
            with self._lock:
                blamed = self._core.stepwise_blame(conn, rec, conn.error_frame)
            if isinstance(blamed, StopReplay):
                return False  # lost for another reason: try again on the next link
            if isinstance(blamed, Refused):
                log.error("failover: the broker refuses a %s: %s", rec.frame.command, blamed.error)
                rec.set_error(blamed.error)
                return False
            if not rec.done:
                break  # no answer in time: give up the stepwise mode for this link
        with self._lock:
            rest = self._core.stepwise_done(conn, install)
            if rest is None:
                return False
            self._run(self._core.arm_idle())
            if not self._write(rest):
                return False
            self._core.stepwise_connected()
            self._cond.notify_all()
        return True

    # -- losing a link --------------------------------------------------------------------

    def _lost(self, conn: StompConnection, error: TransportError) -> None:
        with self._lock:
            actions = self._core.link_lost(conn, error)
            if any(isinstance(action, Reconnect) for action in actions):
                self._failed_address = conn.address
        self._run(actions)

    def _supervise(self, error: BaseException) -> None:
        log.warning("failover: link lost (%s); reconnecting", error)
        self._notify("on_interrupted", error)
        while True:
            with self._lock:
                hopeless = self._core.give_up_now(error)
            if hopeless is not None:
                self._fail(hopeless)
                return
            try:
                conn = self._connect_loop(startup=False, last_error=error)
            except ConnectionClosed:  # closed meanwhile
                return
            except (ReconnectExhausted, AuthenticationError) as exc:
                self._fail(exc)
                return
            except Exception:  # a bug: log it, and never let it end the reconnecting for good
                log.exception("failover: reconnecting failed unexpectedly; trying again in %.2fs", UNEXPECTED_PAUSE)
                self._sleep(UNEXPECTED_PAUSE)
                if self._closed:
                    return
                continue
            install = self._install(conn)
            if install is None:
                continue
            if install.plan.stepwise and not self._replay_stepwise(conn, install):
                continue
            self._notify("on_resumed", conn.address)
            with self._lock:
                if not self._core.resumed():  # lost again before we got here
                    continue
                break
        self._after_connect()

    def _fail(self, error: AmqTransportError) -> None:
        with self._lock:
            actions = self._core.fail(error)
            self._cond.notify_all()
        if actions:
            log.error("failover: giving up: %s", error)
        self._run(actions)

    # -- frames from links -----------------------------------------------------------------

    def _on_frame(self, conn: StompConnection, frame: Frame) -> None:
        gen = conn.tag
        if frame.command == "RECEIPT":
            with self._lock:
                rec = self._core.on_receipt(frame.get("receipt-id"), gen)
            if rec is not None:
                rec.set_result(frame)
            return
        if frame.command == "MESSAGE" and not self._core.message_is_current(conn):
            return  # from a retired link: the broker redelivers on the current one
        self._dispatch(frame, gen, conn)

    def _on_error(self, conn: Link | None, frame: Frame) -> None:
        with self._lock:
            own = self._core.on_error(frame, link_error_frame=conn.error_frame if conn is not None else None,
                                      has_link=conn is not None)
        if not own:
            super()._on_error(conn, frame)

    def _request_refused(self, rec: Receipt) -> None:
        with self._lock:
            self._core.request_refused(rec)

    # -- requests ----------------------------------------------------------------------------

    def _wait_connected(self, started: float) -> StompConnection:
        """Block until connected (bounded by ``timeout``); return the link."""
        timeout_ms = self.options.timeout
        with self._lock:
            while True:
                self._core.check_usable()
                target = self._core.current()
                if target is not None:
                    return target[0]
                if timeout_ms >= 0:
                    remaining = timeout_ms / 1000.0 - (self._clock() - started)
                    if remaining <= 0:
                        raise send_timeout(f"failover: not connected within timeout={timeout_ms} ms")
                    self._cond.wait(min(remaining, 0.1))
                else:
                    self._cond.wait(0.5)

    def request(self, frame: Frame, *, receipt: bool = True) -> Receipt | None:
        if not receipt:
            self._oneway(frame)
            return None
        rid = self.next_id("r")
        rec = Receipt(rid, with_receipt(frame, rid), tx=frame.get("transaction"))
        with self._lock:
            write = self._core.request(rec)
        if write is not None:
            self._write(write)  # a failed write leaves it pending: replayed on the next link
        return rec

    def request_many(self, frames: Sequence[Frame]) -> list[Receipt]:
        """Receipted requests for ``frames``, in order, written in one system call when
        connected (a producer's window); each is pending like one from :meth:`request`."""
        recs = []
        for frame in frames:
            rid = self.next_id("r")
            recs.append(Receipt(rid, with_receipt(frame, rid), tx=frame.get("transaction")))
        writes: list[Write[Conn]] = []
        try:
            with self._lock:
                for rec in recs:  # a request the core refuses (a rolled-back transaction) raises here
                    write = self._core.request(rec)
                    if write is not None:
                        writes.append(write)
        finally:
            if writes:  # all on the same link: made under one holding of the lock
                self._write(Write(writes[0].link, [f for w in writes for f in w.frames], writes[0].generation))
        return recs

    def _oneway(self, frame: Frame) -> None:
        started = self._clock()
        with self._lock:
            frame, key = self._core.track(frame)
        while True:
            try:
                conn = self._wait_connected(started)
            except SendTimeout as exc:
                raise send_timeout(str(exc), frame=frame) from None
            with self._lock:
                gen = self._core.generation
                receipt_position = self._core.oneway_position(frame)
            try:
                conn.write(frame)
            except TransportError as exc:
                conn.kill(exc)
                if key is not None:
                    return  # in the cache: replayed on the next link
                continue
            if key is not None:
                with self._lock:
                    actions = self._core.tracked_written(key, gen, receipt_position)
                self._run(actions)
            return

    def wait(self, receipt: Receipt, timeout: float | None = None) -> Frame:
        if not receipt.done:
            if self._timeout_ms < 0 and timeout is None:
                receipt.wait_event(None)  # failed with the error on close / give-up
            else:
                self._wait_bounded(receipt, timeout)
        if receipt.error is not None:
            raise receipt.error
        assert receipt.result is not None
        return receipt.result

    def _wait_bounded(self, receipt: Receipt, timeout: float | None) -> None:
        rule = ReceiptWait(self._timeout_ms, timeout, self._clock())
        while not receipt.wait_event(rule.slice):
            verdict = rule.verdict(self._clock(), self.is_connected)
            if verdict == "deadline":
                self._withdraw(receipt)
                raise send_timeout(f"no receipt for {receipt.receipt_id} within {timeout}s", receipt)
            if verdict == "disconnected" and self._withdraw(receipt):
                raise send_timeout(f"failover: disconnected for longer than timeout={self._timeout_ms} ms "
                                   f"while waiting for receipt {receipt.receipt_id}", receipt)

    def _withdraw(self, receipt: Receipt) -> bool:
        with self._lock:
            return self._core.withdraw(receipt.receipt_id)

    def write_if_current(self, frame: Frame, generation: int) -> bool:
        return self.write_many_if_current([frame], generation)

    def write_many_if_current(self, frames: list[Frame], generation: int) -> bool:
        with self._lock:
            conn = self._core.link_of(generation)
        if conn is None:
            return False
        return self._write(Write(conn, frames, generation))

    # -- subscriptions and transactions ------------------------------------------------------

    def subscribe(self, sub_id: str, frame: Frame) -> Receipt:
        with self._lock:
            self._core.subscribe(sub_id, frame)
        rec = self.request(frame)
        assert rec is not None
        return rec

    def unsubscribe(self, sub_id: str, frame: Frame) -> Receipt | None:
        with self._lock:
            if not self._core.unsubscribe(sub_id):
                return None
        return self.request(frame)

    def begin(self, tx_id: str) -> Receipt:
        with self._lock:
            self._core.begin(tx_id)
        rec = self.request(Frame.make("BEGIN", {"transaction": tx_id}))
        assert rec is not None
        return rec

    def commit(self, tx_id: str) -> Receipt:
        with self._lock:
            self._core.commit(tx_id)
        rec = self.request(Frame.make("COMMIT", {"transaction": tx_id}))
        assert rec is not None
        return rec

    def tx_done(self, tx_id: str) -> None:
        with self._lock:
            self._core.tx_done(tx_id)

    def abort(self, tx_id: str) -> None:
        with self._lock:
            write = self._core.abort(tx_id)
        if write is not None:
            self._write(write)
