"""The failover transport: ActiveMQ's ``failover:`` over STOMP links.

Theory of operation
-------------------
States::

    new --start()--> connecting --ok--> connected --link lost--> reconnecting --ok--> connected
                         |                                           |
                         +--schedule exhausted--> failed <-----------+  (also: maxReconnectAttempts=0
                                                                         after a loss: straight to failed)
    any --close()--> closed

*Who runs what.* ``start()`` connects in the caller's thread (the startup schedule:
``startupMaxReconnectAttempts`` or ``maxReconnectAttempts``). Afterwards each link has
its own reader thread (``StompConnection``). When the *current* link's reader reports
the loss, ``_lost`` switches to ``reconnecting`` and starts one **supervisor** thread
(never two: a flag under the lock). The supervisor tells listeners
``on_interrupted(error)``, walks the pure schedule (``backoff.failover_schedule``: one
pass over the endpoints with no delay inside a pass, the back-off sleep between
passes, via the injected ``sleep``), installs the first link that completes the STOMP
handshake, then calls ``on_resumed(address)``. If the schedule ends (or
``maxReconnectAttempts=0``), every waiter fails with ``ReconnectExhausted`` and
listeners get ``on_failed(error)``. With ``priorityBackup`` a **probe** thread keeps
trying the priority endpoints (first URI, or ``priorityURIs``) while connected
elsewhere, and switches back when one answers. With ``backup`` a pool of
``backupPoolSize`` pre-connected links is kept and tried first on a loss.
Listeners are called from the supervisor/probe threads, wrapped: a raising listener
is logged and cannot stop the reconnect loop.

*Locks.* One re-entrant lock (``self._lock``, with a condition) guards the state,
the current link, the generation counter, the request map (pending receipts, in
send order), the subscription registry, the transaction table and the message
cache. Network writes of ordinary requests happen *outside* the lock (so a slow
socket never blocks the reader's dispatch); the replay after a reconnect is written
*inside* the lock, so nothing new can overtake it on the new link.

*Replay on a new link* (``_install``, under the lock, before the state becomes
``connected``): the plan comes from :func:`~amqtransport.transports.replay.plan_replay`
(pure; its docstring has the rules): SUBSCRIBE for every live subscription (same ids and
headers), then every request still waiting for its receipt in the order it was first
sent (same receipt id, same idempotency key: the broker drops a copy it already stored
and still answers with the receipt), then with ``trackMessages`` the cached
fire-and-forget sends that no receipt has proven yet. A transaction the broker had
acknowledged on a dead link fails with ``TransactionRolledBack``; one whose COMMIT was
in flight fails with ``TransactionInDoubt`` (both carry the keys of its sends).

*Broker ERRORs.* An ERROR carrying a request's ``receipt-id`` fails that request with
``BrokerError``. An ERROR that names no request ends the link (RabbitMQ keeps some
links open after one; STOMP closes them) and is remembered as a *refusal*: the next
link replays the pending requests one at a time (``_replay_stepwise``), so the request
the broker keeps refusing is found and fails with its ``BrokerError`` instead of being
replayed forever. The same refusal three times in a row with nothing but
subscriptions left to replay ends the transport (``on_failed``).

*A send in flight when the link drops.* A receipted send is registered in the
request map *before* it is written. If the link dies before the receipt arrives,
whatever happened on the wire, the request stays in the map and is written again on
the next link (as ActiveMQ's failover does with its request map); the caller simply
keeps waiting for the receipt. ``timeout`` (ms, -1 = forever) bounds how long a
caller waits while the transport is disconnected: past it the request is withdrawn
and ``SendTimeout`` is raised (it may or may not have reached a broker; re-sending it
with the same idempotency key is safe on brokers that honour the key). A
fire-and-forget frame (``receipt=False``) waits for a link (same ``timeout``) and is
retried once per new link until one write succeeds; ACK/NACK are never replayed: the
broker redelivers unacknowledged messages and the client's duplicate filter copes.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

from amqtransport._backends.base import Backend, leaf_address
from amqtransport.backoff import Attempt
from amqtransport.errors import (
    AmqTransportError,
    AuthenticationError,
    BrokerError,
    ConnectionClosed,
    ReconnectExhausted,
    SendTimeout,
    TransactionRolledBack,
    TransportError,
)
from amqtransport.options import FailoverOptions
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.stomp.session import error_from_frame, error_text
from amqtransport.transports.base import Link, Receipt, Transport, with_receipt
from amqtransport.transports.endpoints import UriParser, endpoints, priority_leaves
from amqtransport.transports.probe import Probe, wait_probing
from amqtransport.transports.reconnect import ReconnectPlan
from amqtransport.transports.replay import (
    TRACK_IDLE_SECONDS,
    TRACK_RECEIPT_EVERY,
    ReplayPlan,
    SendCache,
    TxState,
    deletes_durable,
    plan_replay,
    refusal_error,
)
from amqtransport.transports.stomp import Clock, ConnectParams, StompConnection
from amqtransport.uri import LeafUri

__all__ = ["FailoverTransport"]

log = logging.getLogger(__name__)

Sleep = Callable[[float], object]
ScheduleFn = Callable[..., Iterator[Attempt[LeafUri]]]


#: after a refusal, how long a request replayed on its own may go unanswered before
#: the rest is written anyway
STEPWISE_WAIT = 10.0
#: ... and how long a link that died under it may take to deliver the broker's last words
STEPWISE_READER_WAIT = 2.0
#: refusals in a row, with nothing but subscriptions to blame, before giving up
GIVE_UP_REFUSALS = 3


def _error_text(frame: Frame | None) -> str:
    return error_text(frame) if frame is not None else ""


def _timeout(message: str, rec: Receipt | None = None, frame: Frame | None = None) -> SendTimeout:
    frame = frame if frame is not None else (rec.frame if rec is not None else None)
    key = frame.get(IDEMPOTENCY_HEADER) if frame is not None else None
    if key is not None:
        message += f" (idempotency key {key}: send it again with that key)"
    return SendTimeout(message, idempotency_key=key, receipt_id=rec.receipt_id if rec is not None else None)


class FailoverTransport(Transport):
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
        if schedule is None:
            from amqtransport.backoff import failover_schedule

            schedule = failover_schedule
        self._schedule = schedule
        self._uri_parser = uri_parser
        #: the bare TCP probe run while a back-off sleeps (None: never; probe.py)
        self._tcp_probe = probe
        self._cond = threading.Condition(self._lock)
        self._state = "new"
        self._conn: StompConnection | None = None
        self._error: AmqTransportError | None = None
        self._subs: OrderedDict[str, Frame] = OrderedDict()
        self._txs: dict[str, TxState] = {}
        self._cache = SendCache(options.max_cache_size)
        self._track = options.track_messages
        self._tracked_unreceipted = 0  # tracked sends since the last one asking for a receipt
        self._barriers: dict[str, int] = {}  # receipt id -> position, of idle barriers in flight
        self._idle_timer: threading.Timer | None = None
        self._wseq = itertools.count(1)  # positions of writes, see replay.SendCache
        self._refusal: Frame | None = None  # the unmatched ERROR that ended the last link(s)
        self._refusal_streak = 0
        self._supervising = False
        self._probing = False
        self._backups: list[StompConnection] = []
        self._threads: list[threading.Thread] = []
        self._timeout_ms = options.timeout
        self.failed_attempts = 0  # connect attempts that failed since the last success
        self.reconnects = 0

    # -- properties ------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def link(self) -> StompConnection | None:
        return self._conn

    @property
    def connected_address(self) -> str | None:
        conn = self._conn
        return conn.address if conn is not None and self._state == "connected" else None

    @property
    def is_connected(self) -> bool:
        return self._state == "connected"

    @property
    def version(self) -> str:
        conn = self._conn
        return conn.version if conn is not None else "1.2"

    @property
    def last_error(self) -> AmqTransportError | None:
        return self._error

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._state != "new":
                raise RuntimeError(f"start() in state {self._state}")
            self._state = "connecting"
        while True:
            try:
                conn = self._connect_loop(startup=True, last_error=None)
            except (ReconnectExhausted, AuthenticationError) as exc:
                with self._lock:
                    self._state = "failed"
                    self._error = exc
                self._notify("on_failed", exc)
                raise
            if self._install(conn) is not None:
                break
        self._after_connect()

    def close(self) -> None:
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
            self._closed = True
            conn, self._conn = self._conn, None
            backups, self._backups = self._backups, []
            pending = list(self._pending.values())
            self._pending.clear()
            self._cond.notify_all()
            timer, self._idle_timer = self._idle_timer, None
        if timer is not None:
            timer.cancel()
        self._closed_event.set()
        if conn is not None:
            conn.close()
        for b in backups:
            b.close(disconnect=False)
        err = ConnectionClosed("connection closed locally")
        for rec in pending:
            rec.set_error(err)
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout=5)

    # -- connecting -----------------------------------------------------------------------

    def _endpoints(self) -> list[LeafUri]:
        return endpoints(self.leaves, self.options.update_uris_url, self._uri_parser)

    def _open(self, leaf: LeafUri) -> StompConnection:
        conn = StompConnection(leaf, backend=self._backend, params=self._params, clock=self._clock,
                               on_frame=self._on_frame, on_lost=self._lost)
        conn.open()
        return conn

    def _take_backup(self) -> StompConnection | None:
        with self._lock:
            while self._backups:
                conn = self._backups.pop(0)
                if conn.alive:
                    return conn
        return None

    def _connect_loop(self, *, startup: bool, last_error: BaseException | None) -> StompConnection:
        backup = self._take_backup()
        if backup is not None:
            log.info("failover: using pre-connected backup %s", backup.address)
            return backup
        endpoints = self._endpoints()
        warn_every = self.options.warn_after_reconnect_attempts
        plan = ReconnectPlan(self._schedule(endpoints, self.options, startup=startup, rng=self._rng))
        while (step := plan.next_step()) is not None:
            if self._closed:
                raise ConnectionClosed("connection closed while reconnecting")
            endpoint = step.endpoint
            if step.delay > 0:
                log.debug("failover: sleeping %.3fs before pass %d", step.delay, step.pass_number)
                probed = wait_probing(step.delay, endpoints, self._tcp_probe if step.probe else None,
                                      every=self.options.probe_interval / 1000.0, sleep=self._sleep,
                                      clock=self._clock, stop=lambda: self._closed)
                if self._closed:
                    raise ConnectionClosed("connection closed while reconnecting")
                if probed is not None:
                    log.info("failover: %s accepts connections: connecting now", leaf_address(probed))
                    endpoint = plan.cut_short(probed)
            address = leaf_address(endpoint)
            try:
                conn = self._open(endpoint)
            except AuthenticationError:
                raise
            except (TransportError, BrokerError) as exc:
                last_error = exc
                plan.failed()
                self.failed_attempts += 1
                if warn_every > 0 and self.failed_attempts % warn_every == 0:
                    log.warning("failover: %d failed connect attempts so far (last: %s: %s)",
                                self.failed_attempts, address, exc)
                else:
                    log.debug("failover: attempt %d to %s failed: %s", plan.attempts, address, exc)
                continue
            self.failed_attempts = 0
            log.info("failover: connected to %s (%s, dialect %s)", conn.address,
                     (conn.connected_frame.get("server") if conn.connected_frame is not None else None)
                     or "no server header", conn.dialect.name)
            return conn
        which = "startupMaxReconnectAttempts" if startup and (
            self.options.startup_max_reconnect_attempts != -1) else "maxReconnectAttempts"
        raise ReconnectExhausted(
            f"failover: gave up after {plan.attempts} connect attempts over {len(endpoints)} endpoint(s) "
            f"({which} exhausted); last error: {last_error}",
            attempts=plan.attempts, last_error=last_error,
        )

    def _install(self, conn: StompConnection, *, expect_gen: int | None = None) -> ReplayPlan | None:
        """Make ``conn`` the current link and replay state on it (see module docstring);
        the plan, or None when the link was not installed.

        ``expect_gen`` (priority switch): only if the current link is still that one.
        When the plan has ``stepwise`` requests the state is ``replaying`` and the
        caller runs :meth:`_replay_stepwise` next."""
        plan: ReplayPlan | None = None
        with self._lock:
            if self._closed:
                conn.close()
                return ReplayPlan()
            if expect_gen is not None and (expect_gen != self.generation or self._state != "connected"):
                conn.close()
                return None
            self.generation += 1
            gen = self.generation
            conn.tag = gen
            old, self._conn = self._conn, conn
            self._barriers.clear()
            stepwise = self._refusal is not None and expect_gen is None
            if stepwise and self._refusal_streak >= 2 and not self._pending and len(self._cache):
                dropped = self._cache.clear()
                log.error("failover: the broker refuses the replay again (%s): dropping %d cached "
                          "fire-and-forget send(s) of trackMessages", _error_text(self._refusal), dropped)
            plan = plan_replay(subs=self._subs, pending=self._pending.values(), txs=self._txs,
                               cache_frames=self._cache.frames(), gen=gen, stepwise=stepwise,
                               durable_unsubscribe=deletes_durable)
            for tx_id in plan.rolled_back:
                tx = self._txs.get(tx_id)
                if tx is not None:
                    tx.rolled_back = True
            for rec, _ in plan.fail:
                self._pending.pop(rec.receipt_id, None)
            for rec in plan.complete:
                self._pending.pop(rec.receipt_id, None)
            for rec in plan.batch_requests:
                rec.generation = gen
            first = next(self._wseq)
            positions = [next(self._wseq) for _ in plan.batch]
            for rec in plan.batch_requests:
                rec.rseq = first  # after the subscriptions, before any cached send
            n_cached = 0 if plan.stepwise else len(self._cache)
            self._cache.replayed(gen, positions[len(positions) - n_cached:])
            if n_cached:
                self._arm_idle_barrier()
            try:
                conn.write_many(plan.batch)
            except TransportError as exc:
                log.info("failover: %s died during replay: %s", conn.address, exc)
                self._conn = old if old is not None and old.alive else None
                conn.close(disconnect=False)
                plan = None
            else:
                self._state = "replaying" if plan.stepwise else "connected"
                self._error = None
                self._cond.notify_all()
                if plan.batch or plan.stepwise:
                    log.info("failover: replayed %d frame(s) on %s (%d subscription(s))%s", len(plan.batch),
                             conn.address, len(self._subs),
                             f"; {len(plan.stepwise)} request(s) follow one at a time" if plan.stepwise else "")
            # lost between its handshake and now (CONNECTED and the close arrived
            # together): its reader reported it to _lost, which ignored a link that was not
            # current yet. Handled below as a loss right after the install; otherwise the
            # transport would stay "connected" with no reader left to notice.
            dead_on_arrival = plan is not None and not conn.alive
        if plan is None:
            return None
        if dead_on_arrival:
            log.info("failover: %s was lost right after its handshake", conn.address)
            self._lost(conn, ConnectionClosed(f"{conn.address}: connection lost right after the STOMP handshake"))
        for rec, err in plan.fail:
            rec.set_error(err)
        for rec in plan.complete:
            rec.set_result(Frame.make("RECEIPT", {"receipt-id": rec.receipt_id}))
        if old is not None and old is not conn:
            old.close()  # a priority switch: retire the previous link
        return plan

    def _replay_stepwise(self, conn: StompConnection, plan: ReplayPlan) -> bool:
        """Write ``plan.stepwise`` one request at a time after a refusal (module
        docstring); True once the link is ``connected``, False when it was lost."""
        gen = conn.tag
        for rec in plan.stepwise:
            with self._lock:
                if self._conn is not conn or self._state != "replaying":
                    return False
                if self._pending.get(rec.receipt_id) is not rec:
                    continue  # settled meanwhile
                rec.generation = gen
                rec.rseq = next(self._wseq)
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
                        if self._conn is not conn or self._state != "replaying":
                            break
                    if self._clock() >= deadline:
                        log.warning("failover: no answer to %s within %.0f s; replaying the rest at once",
                                    rec.frame.command, STEPWISE_WAIT)
                        break
            if not rec.done and not conn.alive:
                conn.wait_reader(STEPWISE_READER_WAIT)
            blamed: BaseException | None = None
            with self._lock:
                if not rec.done and (self._conn is not conn or self._state != "replaying"):
                    refusal = conn.error_frame
                    if refusal is None or self._pending.get(rec.receipt_id) is not rec:
                        return False  # lost for another reason: try again on the next link
                    del self._pending[rec.receipt_id]
                    if rec.frame.command == "SUBSCRIBE":
                        self._subs.pop(rec.frame.get("id") or "", None)
                    self._refusal, self._refusal_streak = None, 0
                    blamed = refusal_error(refusal, rec.frame.command)
            if blamed is not None:
                log.error("failover: the broker refuses a %s: %s", rec.frame.command, blamed)
                rec.set_error(blamed)
                return False
            if not rec.done:
                break  # no answer in time: give up the stepwise mode for this link
        with self._lock:
            if self._conn is not conn or self._state != "replaying":
                return False
            frames: list[Frame] = []
            first = next(self._wseq)
            for rec in self._pending.values():
                if rec.generation != gen:  # sent while we replayed, or left after a silence
                    rec.generation, rec.rseq = gen, first
                    frames.append(rec.frame)
            positions = [next(self._wseq) for _ in plan.tail]
            self._cache.replayed(gen, positions)
            self._arm_idle_barrier()
            try:
                conn.write_many(frames + plan.tail)
            except TransportError as exc:
                conn.kill(exc)
                return False
            self._refusal, self._refusal_streak = None, 0
            self._state = "connected"
            self._cond.notify_all()
        return True

    def _after_connect(self) -> None:
        if self.options.priority_backup and not self._is_priority(self._conn):
            self._start_probe()
        if self.options.backup:
            self._spawn(self._fill_backups, "amq-failover-backup")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()

    # -- losing a link --------------------------------------------------------------------

    def _lost(self, conn: StompConnection, error: TransportError) -> None:
        with self._lock:
            if conn in self._backups:
                self._backups.remove(conn)
                return
            if conn is not self._conn or self._state in ("closed", "failed"):
                return
            self._conn = None
            self._state = "reconnecting"
            self.reconnects += 1
            if self._supervising:
                return
            self._supervising = True
        self._spawn(lambda: self._supervise(error), "amq-failover-supervisor")

    def _supervise(self, error: BaseException) -> None:
        log.warning("failover: link lost (%s); reconnecting", error)
        self._notify("on_interrupted", error)
        while True:
            if self.options.max_reconnect_attempts == 0:
                self._fail(ReconnectExhausted(
                    f"failover: link lost and maxReconnectAttempts=0, not reconnecting: {error}",
                    attempts=0, last_error=error))
                return
            hopeless = self._hopeless_refusal()
            if hopeless is not None:
                self._fail(hopeless)
                return
            try:
                conn = self._connect_loop(startup=False, last_error=error)
            except ConnectionClosed:
                with self._lock:
                    self._supervising = False
                return
            except (ReconnectExhausted, AuthenticationError) as exc:
                self._fail(exc)
                return
            plan = self._install(conn)
            if plan is None:
                continue
            if plan.stepwise and not self._replay_stepwise(conn, plan):
                continue
            self._notify("on_resumed", conn.address)
            with self._lock:
                if self._state == "reconnecting":  # lost again before we got here
                    continue
                self._supervising = False
                break
        self._after_connect()

    def _hopeless_refusal(self) -> BrokerError | None:
        """The broker refused the replay :data:`GIVE_UP_REFUSALS` times in a row with the
        same ERROR although nothing but subscriptions was left to write: give up."""
        with self._lock:
            frame = self._refusal
            if frame is None or self._refusal_streak < GIVE_UP_REFUSALS or self._pending or len(self._cache):
                return None
            subs = len(self._subs)
        err = error_from_frame(frame)
        return type(err)(f"failover: the broker refused the replay of {subs} subscription(s) "
                         f"{self._refusal_streak} times in a row: {err}", frame=frame)

    def _fail(self, error: AmqTransportError) -> None:
        with self._lock:
            self._supervising = False
            if self._state == "closed":
                return
            self._state = "failed"
            self._error = error
            pending = list(self._pending.values())
            self._pending.clear()
            self._cond.notify_all()
        log.error("failover: giving up: %s", error)
        for rec in pending:
            rec.set_error(error)
        self._notify("on_failed", error)

    # -- priority backup and the backup pool ---------------------------------------------

    def _priority_leaves(self) -> list[LeafUri]:
        return priority_leaves(self.leaves, tuple(self.options.priority_uris))

    def _is_priority(self, conn: StompConnection | None) -> bool:
        if conn is None:
            return False
        return conn.address in {leaf_address(x) for x in self._priority_leaves()}

    def _start_probe(self) -> None:
        with self._lock:
            if self._probing:
                return
            self._probing = True
        self._spawn(self._probe, "amq-failover-priority")

    def _probe(self) -> None:
        opts = self.options.model_copy(update={"max_reconnect_attempts": -1, "startup_max_reconnect_attempts": -1,
                                               "randomize": False})
        gen = self.generation
        try:
            for attempt in self._schedule(self._priority_leaves(), opts, startup=False, rng=self._rng):
                if self._closed or self._state != "connected" or self._is_priority(self._conn):
                    return
                if gen != self.generation:
                    return  # the link changed under us; _after_connect starts a new probe
                if attempt.delay > 0:
                    self._sleep(attempt.delay)
                if self._closed or self._state != "connected":
                    return
                try:
                    conn = self._open(attempt.endpoint)
                except (TransportError, BrokerError) as exc:
                    log.debug("failover: priority endpoint %s still down: %s", leaf_address(attempt.endpoint), exc)
                    continue
                ok = self._install(conn, expect_gen=gen) is not None
                if ok:
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
                if self._closed or len(self._backups) >= size:
                    return
                taken = {c.address for c in self._backups}
                if self._conn is not None:
                    taken.add(self._conn.address)
            if leaf_address(leaf) in taken:
                continue
            try:
                conn = self._open(leaf)
            except (TransportError, BrokerError):
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._backups.append(conn)

    # -- frames from links -----------------------------------------------------------------

    def _on_frame(self, conn: StompConnection, frame: Frame) -> None:
        gen = conn.tag
        if frame.command == "RECEIPT":
            rid = frame.get("receipt-id")
            with self._lock:
                rec = self._pending.pop(rid, None) if rid is not None else None
                if rec is not None:
                    if rec.tx is not None:
                        tx = self._txs.get(rec.tx)
                        if tx is not None and tx.acked_gen is None:
                            tx.acked_gen = gen
                    if rec.generation == gen:
                        self._cache.on_receipt(gen, rec.rseq)
                elif rid is not None:
                    self._own_receipt(rid, gen)
            if rec is not None:
                rec.set_result(frame)
            return
        if frame.command == "MESSAGE" and conn is not self._conn:
            return  # from a retired link: the broker redelivers on the current one
        self._dispatch(frame, gen, conn)

    def _own_receipt(self, rid: str, gen: int) -> None:
        """A receipt the transport asked for itself (trackMessages; lock held)."""
        if rid in self._barriers:
            self._cache.on_receipt(gen, self._barriers.pop(rid))
            return
        found = self._cache.own_receipt(rid)
        if found is not None:
            key, entry_gen, rseq = found
            if entry_gen == gen:
                self._cache.on_receipt(gen, rseq)
                self._cache.discard(key)

    def _on_error(self, conn: Link | None, frame: Frame) -> None:
        rid = frame.get("receipt-id")
        if rid is not None:
            with self._lock:
                own = rid in self._barriers or self._cache.own_receipt(rid) is not None
                if own:
                    self._barriers.pop(rid, None)
                    found = self._cache.own_receipt(rid)
                    if found is not None:
                        self._cache.discard(found[0])
                        log.error("failover: the broker refused a fire-and-forget send (%s): dropped from "
                                  "the trackMessages cache", _error_text(frame))
            if own:
                return
        with self._lock:
            unmatched = rid is None or rid not in self._pending
            if unmatched and conn is not None and conn.error_frame is None:
                # the broker refused something we wrote and did not say what: the next
                # link replays stepwise (replay.py). Noted before the link is ended, so
                # the reconnect that follows sees it.
                same = self._refusal is not None and _error_text(self._refusal) == _error_text(frame)
                self._refusal_streak = self._refusal_streak + 1 if same else 1
                self._refusal = frame
        super()._on_error(conn, frame)

    def _request_refused(self, rec: Receipt) -> None:
        if rec.frame.command == "SUBSCRIBE":
            with self._lock:
                self._subs.pop(rec.frame.get("id") or "", None)

    # -- requests ----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._state == "closed":
            raise ConnectionClosed("connection is closed")
        if self._state == "failed":
            assert self._error is not None
            raise self._error
        if self._state == "new":
            raise RuntimeError("transport not started")

    def _wait_connected(self, started: float) -> StompConnection:
        """Block until connected (bounded by ``timeout``); return the link."""
        timeout_ms = self.options.timeout
        with self._lock:
            while True:
                self._check_usable()
                if self._state == "connected" and self._conn is not None:
                    return self._conn
                if timeout_ms >= 0:
                    remaining = timeout_ms / 1000.0 - (self._clock() - started)
                    if remaining <= 0:
                        raise _timeout(f"failover: not connected within timeout={timeout_ms} ms")
                    self._cond.wait(min(remaining, 0.1))
                else:
                    self._cond.wait(0.5)

    def request(self, frame: Frame, *, receipt: bool = True) -> Receipt | None:
        tx_id = frame.get("transaction")
        if not receipt:
            self._oneway(frame)
            return None
        rid = self.next_id("r")
        rec = Receipt(rid, with_receipt(frame, rid), tx=tx_id)
        with self._lock:
            self._check_usable()
            if tx_id is not None:
                tx = self._txs.get(tx_id)
                if tx is not None and tx.rolled_back:
                    raise TransactionRolledBack(f"transaction {tx_id} was rolled back by a failover",
                                                transaction=tx_id, keys=tx.keys)
                if tx is not None and frame.command == "SEND":
                    tx.keys.append(frame.get(IDEMPOTENCY_HEADER) or "")
            self._pending[rid] = rec
            conn = self._conn if self._state == "connected" else None
            if conn is not None:
                rec.generation = self.generation
                rec.rseq = next(self._wseq)
        if conn is not None:
            try:
                conn.write(rec.frame)
            except TransportError as exc:
                conn.kill(exc)  # stays pending: replayed on the next link
        return rec

    def _oneway(self, frame: Frame) -> None:
        started = self._clock()
        key: str | None = None
        if self._track and frame.command == "SEND":
            key = SendCache.key_of(frame)
            with self._lock:
                self._tracked_unreceipted += 1
                if self._tracked_unreceipted >= TRACK_RECEIPT_EVERY:
                    # a receipt now and then proves (and trims) everything written before
                    self._tracked_unreceipted = 0
                    frame = with_receipt(frame, self.next_id("t"))
                if not self._cache.put(key, frame):
                    key = None  # the same key is already cached: this copy is not tracked
        while True:
            try:
                conn = self._wait_connected(started)
            except SendTimeout as exc:
                raise _timeout(str(exc), frame=frame) from None
            with self._lock:
                gen = self.generation
                rseq = next(self._wseq) if "receipt" in frame else None
            try:
                conn.write(frame)
            except TransportError as exc:
                conn.kill(exc)
                if key is not None:
                    return  # in the cache: replayed on the next link
                continue
            if key is not None:
                with self._lock:
                    self._cache.written(key, gen, next(self._wseq), rseq)
                    self._arm_idle_barrier()
            return

    def _arm_idle_barrier(self) -> None:
        """(lock held) Write a barrier once tracked sends pause (:meth:`_idle_barrier`)."""
        if self._idle_timer is None and not self._closed and len(self._cache):
            self._idle_timer = threading.Timer(TRACK_IDLE_SECONDS, self._idle_barrier)
            self._idle_timer.daemon = True
            self._idle_timer.start()

    def _idle_barrier(self) -> None:
        """Tracked sends stopped for a while: ask the broker for a receipt (an empty
        transaction: BEGIN, receipted ABORT) so the cache can be trimmed."""
        with self._lock:
            self._idle_timer = None
            if self._closed or self._state != "connected" or self._conn is None or not len(self._cache):
                return
            conn, gen = self._conn, self.generation
            tx_id, rid = self.next_id("amq-barrier"), self.next_id("t")
            self._barriers[rid] = next(self._wseq)
            self._tracked_unreceipted = 0
        try:
            conn.write_many([Frame.make("BEGIN", {"transaction": tx_id}),
                             Frame.make("ABORT", {"transaction": tx_id, "receipt": rid})])
        except TransportError as exc:
            conn.kill(exc)
        with self._lock:
            if gen != self.generation:
                self._barriers.pop(rid, None)

    @property
    def cached_sends(self) -> int:
        """How many fire-and-forget sends ``trackMessages`` would replay on a new link."""
        return len(self._cache)

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
        timeout_ms = self._timeout_ms
        start = self._clock()
        deadline = None if timeout is None else start + timeout
        down_since: float | None = None
        while True:
            slice_ = None if (timeout_ms < 0 and deadline is None) else 0.05
            if receipt.wait_event(slice_):
                break
            now = self._clock()
            if deadline is not None and now >= deadline:
                self._withdraw(receipt)
                raise _timeout(f"no receipt for {receipt.receipt_id} within {timeout}s", receipt)
            if timeout_ms >= 0:
                if self._state != "connected":
                    if down_since is None:
                        down_since = now
                    if (now - down_since) * 1000 >= timeout_ms:
                        if self._withdraw(receipt):
                            raise _timeout(
                                f"failover: disconnected for longer than timeout={timeout_ms} ms while "
                                f"waiting for receipt {receipt.receipt_id}", receipt)
                else:
                    down_since = None

    def _withdraw(self, receipt: Receipt) -> bool:
        with self._lock:
            return self._pending.pop(receipt.receipt_id, None) is not None

    def _link_of(self, generation: int) -> StompConnection | None:
        """The current link if it is link ``generation`` and may carry ACKs (lock held)."""
        if generation != self.generation or self._state not in ("connected", "replaying"):
            return None
        return self._conn

    def write_if_current(self, frame: Frame, generation: int) -> bool:
        with self._lock:
            conn = self._link_of(generation)
            if conn is None:
                return False
        try:
            conn.write(frame)
            return True
        except TransportError as exc:
            conn.kill(exc)
            return False

    def write_many_if_current(self, frames: list[Frame], generation: int) -> bool:
        with self._lock:
            conn = self._link_of(generation)
            if conn is None:
                return False
        try:
            conn.write_many(frames)
            return True
        except TransportError as exc:
            conn.kill(exc)
            return False

    # -- subscriptions and transactions ------------------------------------------------------

    def subscribe(self, sub_id: str, frame: Frame) -> Receipt:
        with self._lock:
            self._check_usable()
            self._subs[sub_id] = frame.without_headers("receipt")
        rec = self.request(frame)
        assert rec is not None
        return rec

    def unsubscribe(self, sub_id: str, frame: Frame) -> Receipt | None:
        with self._lock:
            self._subs.pop(sub_id, None)
            if self._state in ("failed", "closed"):
                return None
        return self.request(frame)

    def begin(self, tx_id: str) -> Receipt:
        with self._lock:
            self._check_usable()
            self._txs[tx_id] = TxState()
        rec = self.request(Frame.make("BEGIN", {"transaction": tx_id}))
        assert rec is not None
        return rec

    def commit(self, tx_id: str) -> Receipt:
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is not None and (tx.rolled_back or (tx.acked_gen is not None and tx.acked_gen != self.generation)):
                self._txs.pop(tx_id, None)
                raise TransactionRolledBack(
                    f"transaction {tx_id} was open across a failover: the broker rolled it back",
                    transaction=tx_id, keys=tx.keys)
        rec = self.request(Frame.make("COMMIT", {"transaction": tx_id}))
        assert rec is not None
        return rec

    def tx_done(self, tx_id: str) -> None:
        with self._lock:
            self._txs.pop(tx_id, None)

    def abort(self, tx_id: str) -> None:
        with self._lock:
            tx = self._txs.pop(tx_id, None)
            stale = tx is not None and (tx.rolled_back or (tx.acked_gen is not None and tx.acked_gen != self.generation))
            conn = self._conn if self._state == "connected" else None
        if stale or conn is None:
            return  # the broker already dropped it with the dead link
        try:
            conn.write(Frame.make("ABORT", {"transaction": tx_id}))
        except TransportError as exc:
            conn.kill(exc)
