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

*Replay order on a new link* (``_install``, under the lock, before the state becomes
``connected``): (1) SUBSCRIBE for every live subscription, with the same ids and
headers; (2) every request still waiting for its receipt, in the order it was first
sent, with the same receipt id and the same idempotency key (the broker drops a copy
it already stored and still answers with the receipt); (3) with ``trackMessages``,
the cache of recent fire-and-forget sends (bounded by ``maxCacheSize`` bytes), again
with their idempotency keys. Requests belonging to a transaction whose state the
broker had already acknowledged on the dead link are *not* replayed: they fail with
``TransactionRolledBack``, as does a COMMIT that was written on the dead link (its
outcome is unknown), and any later use of that transaction.

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

import logging
import random
import threading
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from amqtransport._backends.base import Backend, leaf_address
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
from amqtransport.stomp import Frame
from amqtransport.transports.stomp import (
    Clock,
    ConnectParams,
    Receipt,
    StompConnection,
    Transport,
    with_receipt,
)

__all__ = ["FailoverTransport"]

log = logging.getLogger(__name__)

Sleep = Callable[[float], Any]
ScheduleFn = Callable[..., Iterator[Any]]


class _Tx:
    __slots__ = ("acked_gen", "rolled_back")

    def __init__(self) -> None:
        self.acked_gen: int | None = None
        self.rolled_back = False


class FailoverTransport(Transport):
    """``failover:(u1,u2,...)?options`` — see the module docstring."""

    def __init__(
        self,
        leaves: Sequence[Any],
        options: Any,
        params: ConnectParams = ConnectParams(),  # noqa: B008 - frozen
        *,
        backend: Backend,
        sleep: Sleep | None = None,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        schedule: ScheduleFn | None = None,
        uri_parser: Callable[[str], Any] | None = None,
    ) -> None:
        super().__init__()
        if not leaves:
            raise ValueError("failover needs at least one endpoint")
        self.leaves: list[Any] = list(leaves)
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
        self._cond = threading.Condition(self._lock)
        self._state = "new"
        self._conn: StompConnection | None = None
        self._error: AmqTransportError | None = None
        self._subs: OrderedDict[str, Frame] = OrderedDict()
        self._txs: dict[str, _Tx] = {}
        self._cache: OrderedDict[str, Frame] = OrderedDict()
        self._cache_bytes = 0
        self._supervising = False
        self._probing = False
        self._backups: list[StompConnection] = []
        self._threads: list[threading.Thread] = []
        self._timeout_ms = int(getattr(options, "timeout", -1))
        self.failed_attempts = 0  # connect attempts that failed since the last success
        self.reconnects = 0

    # -- properties ------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

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
            if self._install(conn):
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

    def _endpoints(self) -> list[Any]:
        leaves = list(self.leaves)
        url = getattr(self.options, "update_uris_url", None)
        if url:
            for leaf in self._read_update_uris(url):
                if all(leaf_address(leaf) != leaf_address(x) for x in leaves):
                    leaves.append(leaf)
        return leaves

    def _read_update_uris(self, url: str) -> list[Any]:
        """``updateURIsURL``: a file path, ``file://`` or ``http(s)://`` URL holding a
        comma-separated list of leaf URIs, read before each reconnect."""
        try:
            if url.startswith(("http://", "https://", "file://")):
                with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - user-configured URL
                    text = resp.read().decode("utf-8")
            else:
                with open(url, encoding="utf-8") as fh:
                    text = fh.read()
        except (OSError, ValueError) as exc:
            log.warning("updateURIsURL %s: cannot read: %s", url, exc)
            return []
        parser = self._uri_parser
        if parser is None:
            from amqtransport.uri import parse_uri

            parser = parse_uri
        out = []
        for part in text.replace("\n", ",").split(","):
            part = part.strip()
            if not part:
                continue
            try:
                node = parser(part)
            except ValueError as exc:
                log.warning("updateURIsURL %s: ignoring %r: %s", url, part, exc)
                continue
            if hasattr(node, "components"):
                log.warning("updateURIsURL %s: ignoring composite %r", url, part)
                continue
            out.append(node)
        return out

    def _open(self, leaf: Any) -> StompConnection:
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
        attempts = 0
        warn_every = int(getattr(self.options, "warn_after_reconnect_attempts", 10) or 0)
        for attempt in self._schedule(endpoints, self.options, startup=startup, rng=self._rng):
            if self._closed:
                raise ConnectionClosed("connection closed while reconnecting")
            if attempt.delay > 0:
                log.debug("failover: sleeping %.3fs before pass %d", attempt.delay, attempt.pass_number)
                self._sleep(attempt.delay)
                if self._closed:
                    raise ConnectionClosed("connection closed while reconnecting")
            attempts += 1
            address = leaf_address(attempt.endpoint)
            try:
                conn = self._open(attempt.endpoint)
            except AuthenticationError:
                raise
            except (TransportError, BrokerError) as exc:
                last_error = exc
                self.failed_attempts += 1
                if warn_every > 0 and self.failed_attempts % warn_every == 0:
                    log.warning("failover: %d failed connect attempts so far (last: %s: %s)",
                                self.failed_attempts, address, exc)
                else:
                    log.debug("failover: attempt %d to %s failed: %s", attempts, address, exc)
                continue
            self.failed_attempts = 0
            log.info("failover: connected to %s", conn.address)
            return conn
        which = "startupMaxReconnectAttempts" if startup and getattr(
            self.options, "startup_max_reconnect_attempts", -1) != -1 else "maxReconnectAttempts"
        raise ReconnectExhausted(
            f"failover: gave up after {attempts} connect attempts over {len(endpoints)} endpoint(s) "
            f"({which} exhausted); last error: {last_error}",
            attempts=attempts, last_error=last_error,
        )

    def _install(self, conn: StompConnection, *, expect_gen: int | None = None) -> bool:
        """Make ``conn`` the current link and replay state on it (see module docstring).

        ``expect_gen`` (priority switch): only if the current link is still that one."""
        rolled: list[tuple[Receipt, BaseException | None]] = []
        with self._lock:
            if self._closed:
                conn.close()
                return True
            if expect_gen is not None and (expect_gen != self.generation or self._state != "connected"):
                conn.close()
                return False
            self.generation += 1
            gen = self.generation
            conn.tag = gen
            old, self._conn = self._conn, conn
            frames: list[Frame] = []
            # transactions the broker had acknowledged on a dead link are gone
            for open_tx in self._txs.values():
                if open_tx.acked_gen is not None and open_tx.acked_gen < gen:
                    open_tx.rolled_back = True
            pending_sub: dict[str | None, str] = {}
            for rid, rec in list(self._pending.items()):
                f = rec.frame
                if rec.tx is not None:
                    tx = self._txs.get(rec.tx)
                    if tx is not None and tx.rolled_back:
                        del self._pending[rid]
                        rolled.append((rec, TransactionRolledBack(
                            f"transaction {rec.tx} was open across a failover: rolled back by the broker")))
                        continue
                    if f.command == "COMMIT" and rec.generation and rec.generation < gen:
                        del self._pending[rid]
                        if tx is not None:
                            tx.rolled_back = True
                        rolled.append((rec, TransactionRolledBack(
                            f"link lost while committing transaction {rec.tx}: outcome unknown, treat as rolled back")))
                        continue
                if f.command == "SUBSCRIBE":
                    pending_sub[f.get("id")] = rid
                elif f.command == "UNSUBSCRIBE":
                    del self._pending[rid]
                    rolled.append((rec, None))
            for sub_id, sub_frame in self._subs.items():
                sub_rid = pending_sub.pop(sub_id, None)
                if sub_rid is not None:
                    frames.append(self._pending[sub_rid].frame)
                    self._pending[sub_rid].generation = gen
                else:
                    frames.append(sub_frame)
            for rid in pending_sub.values():  # subscribe then unsubscribe while down
                rec = self._pending.pop(rid)
                rolled.append((rec, None))
            for rec in self._pending.values():
                if rec.frame.command == "SUBSCRIBE":
                    continue
                frames.append(rec.frame)
                rec.generation = gen
            if getattr(self.options, "track_messages", False):
                frames.extend(self._cache.values())
            try:
                conn.write_many(frames)
            except TransportError as exc:
                log.info("failover: %s died during replay: %s", conn.address, exc)
                self._conn = old if old is not None and old.alive else None
                self.generation = gen  # keep counting; a stale tag is harmless
                conn.close(disconnect=False)
                ok = False
            else:
                ok = True
                self._state = "connected"
                self._error = None
                self._cond.notify_all()
                if frames:
                    log.info("failover: replayed %d frame(s) on %s (%d subscription(s))",
                             len(frames), conn.address, len(self._subs))
        for rec, err in rolled:
            if err is None:
                rec.set_result(Frame.make("RECEIPT", {"receipt-id": rec.receipt_id}))
            else:
                rec.set_error(err)
        if ok and old is not None and old is not conn:
            old.close()  # a priority switch: retire the previous link
        return ok

    def _after_connect(self) -> None:
        if getattr(self.options, "priority_backup", False) and not self._is_priority(self._conn):
            self._start_probe()
        if getattr(self.options, "backup", False):
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
            if int(getattr(self.options, "max_reconnect_attempts", -1)) == 0:
                self._fail(ReconnectExhausted(
                    f"failover: link lost and maxReconnectAttempts=0, not reconnecting: {error}",
                    attempts=0, last_error=error))
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
            if not self._install(conn):
                continue
            self._notify("on_resumed", conn.address)
            with self._lock:
                if self._state == "reconnecting":  # lost again before we got here
                    continue
                self._supervising = False
                break
        self._after_connect()

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

    def _priority_leaves(self) -> list[Any]:
        uris = tuple(getattr(self.options, "priority_uris", ()) or ())
        if not uris:
            return [self.leaves[0]]
        wanted = set()
        for text in uris:
            addr = text.split("?", 1)[0].rstrip("/")
            addr = addr.replace("stomp+ssl://", "ssl://").replace("stomp://", "tcp://")
            wanted.add(addr)
        found = [leaf for leaf in self.leaves if leaf_address(leaf) in wanted]
        return found or [self.leaves[0]]

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
                ok = self._install(conn, expect_gen=gen)
                if ok:
                    log.info("failover: back on priority endpoint %s", conn.address)
                    self._notify("on_resumed", conn.address)
                    return
        finally:
            with self._lock:
                self._probing = False

    def _fill_backups(self) -> None:
        size = int(getattr(self.options, "backup_pool_size", 1))
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
                if rec is not None and rec.tx is not None:
                    tx = self._txs.get(rec.tx)
                    if tx is not None and tx.acked_gen is None:
                        tx.acked_gen = gen
            if rec is not None:
                rec.set_result(frame)
            return
        if frame.command == "MESSAGE" and conn is not self._conn:
            return  # from a retired link: the broker redelivers on the current one
        self._dispatch(frame, gen)

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
        timeout_ms = int(getattr(self.options, "timeout", -1))
        with self._lock:
            while True:
                self._check_usable()
                if self._state == "connected" and self._conn is not None:
                    return self._conn
                if timeout_ms >= 0:
                    remaining = timeout_ms / 1000.0 - (self._clock() - started)
                    if remaining <= 0:
                        raise SendTimeout(f"failover: not connected within timeout={timeout_ms} ms")
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
                    raise TransactionRolledBack(f"transaction {tx_id} was rolled back by a failover")
            self._pending[rid] = rec
            conn = self._conn if self._state == "connected" else None
            if conn is not None:
                rec.generation = self.generation
        if conn is not None:
            try:
                conn.write(rec.frame)
            except TransportError as exc:
                conn.kill(exc)  # stays pending: replayed on the next link
        return rec

    def _oneway(self, frame: Frame) -> None:
        started = self._clock()
        track = frame.command == "SEND" and getattr(self.options, "track_messages", False)
        if track:
            self._cache_put(frame)
        while True:
            conn = self._wait_connected(started)
            try:
                conn.write(frame)
                return
            except TransportError as exc:
                conn.kill(exc)
                if track:
                    return  # in the cache: replayed on the next link

    def _cache_put(self, frame: Frame) -> None:
        from amqtransport.stomp import IDEMPOTENCY_HEADER

        key = frame.get(IDEMPOTENCY_HEADER) or f"anon-{id(frame)}"
        size = len(frame.body) + sum(len(k) + len(v) for k, v in frame.headers)
        limit = int(getattr(self.options, "max_cache_size", 131072))
        with self._lock:
            if key in self._cache:
                return
            self._cache[key] = frame
            self._cache_bytes += size
            while self._cache and self._cache_bytes > limit:
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= len(old.body) + sum(len(k) + len(v) for k, v in old.headers)

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
                raise SendTimeout(f"no receipt for {receipt.receipt_id} within {timeout}s")
            if timeout_ms >= 0:
                if self._state != "connected":
                    if down_since is None:
                        down_since = now
                    if (now - down_since) * 1000 >= timeout_ms:
                        if self._withdraw(receipt):
                            raise SendTimeout(
                                f"failover: disconnected for longer than timeout={timeout_ms} ms while "
                                f"waiting for receipt {receipt.receipt_id}")
                else:
                    down_since = None

    def _withdraw(self, receipt: Receipt) -> bool:
        with self._lock:
            return self._pending.pop(receipt.receipt_id, None) is not None

    def write_if_current(self, frame: Frame, generation: int) -> bool:
        with self._lock:
            if generation != self.generation or self._state != "connected" or self._conn is None:
                return False
            conn = self._conn
        try:
            conn.write(frame)
            return True
        except TransportError as exc:
            conn.kill(exc)
            return False

    def write_many_if_current(self, frames: list[Frame], generation: int) -> bool:
        with self._lock:
            if generation != self.generation or self._state != "connected" or self._conn is None:
                return False
            conn = self._conn
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
            self._txs[tx_id] = _Tx()
        rec = self.request(Frame.make("BEGIN", {"transaction": tx_id}))
        assert rec is not None
        return rec

    def commit(self, tx_id: str) -> Receipt:
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is not None and (tx.rolled_back or (tx.acked_gen is not None and tx.acked_gen != self.generation)):
                self._txs.pop(tx_id, None)
                raise TransactionRolledBack(
                    f"transaction {tx_id} was open across a failover: the broker rolled it back")
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
