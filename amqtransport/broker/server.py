"""The broker process inside one asyncio loop: store + core + listening socket.

:class:`BrokerServer` wires the three separable parts together -- the
:class:`~.store.MessageStore` (durability), the :class:`~.core.BrokerCore`
(destinations and dispatch) and :class:`~.protocol.BrokerConnection` (one per
client) -- and owns their lifecycle. Opening the store and listening are separate
steps (:meth:`open` then :meth:`listen`; :meth:`start` does both) so that an HA
slave can recover or replicate into a store before it accepts clients.

Fencing. When the journal fails (a full disk, an I/O error), or the store's state falls
behind its journal (an apply that raised after its append: ``MessageStore.diverged``), the
broker can no longer keep its promise, so it stops serving (:meth:`fence`): the requests that were waiting
for the failed writes have had their ERROR frames (with their ``receipt-id``), every
connection is closed, the client port stops accepting, and ``on_fenced`` is called
(``amq broker run`` exits with code 3; an HA master hands over to its slave). Nothing
receipted is lost: a receipt follows an fsync, and recovery cuts a torn tail.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from amqtransport.errors import ConfigError

from .config import BrokerConfig, check_login, parse_http_address
from .connection.context import BrokerContext, ConnectHook
from .connection.protocol import BrokerConnection
from .connection.websocket import WebSocketProtocol
from .dispatch.core import BrokerCore
from .store import Callback, JournalError, MessageStore, run_completions
from .tracing import SendTracer

__all__ = ["BrokerServer", "CLIENT_BACKLOG", "STOP_DEADLINE", "stop_on_signals"]

log = logging.getLogger(__name__)

#: seconds a broker process may take to stop after SIGTERM before it exits anyway
STOP_DEADLINE = 6.0
#: the kernel's queue of connections not accepted yet on a port clients connect to (the
#: client port, the WebSocket port, a node's relay port): clients that all reconnect at once
#: (a takeover) wait there while the loop is busy, instead of having their SYNs dropped and
#: retried a second later (asyncio's default queue is 100; the kernel caps it at somaxconn)
CLIENT_BACKLOG = 512
#: a loop turn that appended at most this many records with the journal's writer idle
#: fsyncs them on the loop itself (``Journal.commit_turn``): a lone receipted send skips
#: the writer thread's two hand-offs; more (pipelined producers) go to the writer, whose
#: fsync overlaps the loop's parsing of the next frames
INLINE_COMMIT_RECORDS = 4


def stop_on_signals(
    loop: asyncio.AbstractEventLoop,
    stop: Callable[[], None],
    exit_code: Callable[[], int],
    deadline: float = STOP_DEADLINE,
) -> None:
    """SIGTERM and SIGINT call ``stop`` on ``loop`` and arm the stop deadline: a process
    still running ``deadline`` seconds later logs why and exits with ``exit_code()``.

    The handler is a plain signal handler, not the loop's: it runs (in the main thread)
    even while the loop is blocked, e.g. waiting for a journal that does not answer."""
    armed: list[threading.Timer] = []

    def overdue() -> None:
        code = exit_code()
        log.error("the stop did not finish within %.0f s of the signal (storage not answering?): "
                  "exiting now with code %d; recovery starts from what is on disk", deadline, code)
        logging.shutdown()
        os._exit(code)

    def on_signal(_signum: int, _frame: object) -> None:
        if not armed:
            timer = threading.Timer(deadline, overdue)
            timer.daemon = True
            timer.start()
            armed.append(timer)
        if not loop.is_closed():
            loop.call_soon_threadsafe(stop)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

STATUS_MAX_DEPTHS = 100  # queues listed by name in a status answer (the deepest ones)


class BrokerServer:
    def __init__(
        self,
        config: BrokerConfig | None = None,
        *,
        data_dir: str | Path | None = None,
        users: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config or BrokerConfig()
        chosen = data_dir if data_dir is not None else self.config.data_dir
        self._temp_dir: str | None = None
        if chosen is None:
            self._temp_dir = tempfile.mkdtemp(prefix=f"amq-broker-{self.config.name}-")
            chosen = self._temp_dir
        self.data_dir = Path(chosen)
        self.users: dict[str, str] = dict(users or {})
        self.authorizer = self.config.authorizer()
        if self.authorizer.active and not self.users:
            raise ConfigError("the [[authorization]] entries need users to authorize: give the broker a users "
                              "file (--users / users_file)", path="authorization")
        #: the server spans of sampled SENDs, exported to ``otel_endpoint`` (tracing.py)
        self.tracer: SendTracer | None = None
        if self.config.otel_endpoint:
            self.tracer = SendTracer(self.config.otel_endpoint, name=self.config.name,
                                     queue_size=self.config.otel_queue_size)
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.store: MessageStore | None = None
        self.core: BrokerCore = None  # type: ignore[assignment]
        self.connections: set[BrokerConnection] = set()
        self._server: asyncio.Server | None = None
        self._ws_server: asyncio.Server | None = None
        #: (host, port) of the WebSocket port while it listens (config ``ws``)
        self.ws_address: tuple[str, int] | None = None
        self._compact_handle: asyncio.TimerHandle | None = None
        self._sessions = itertools.count(1)
        self._session_prefix = secrets.token_hex(3)
        self.connections_opened = 0  # accepted client connections, ever (metrics)
        self.host = self.config.host
        self.port = self.config.port
        self.opened_at: float | None = None  # loop.time() when open() ran (status: uptime)
        self.fenced: str | None = None  # why the broker stopped serving (see fence())
        self.on_fenced: Callable[[str], None] | None = None
        #: offered every client CONNECT first (an HA node); set before :meth:`listen`
        self.connect_hook: ConnectHook | None = None

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        """Recover the store and build the core (no socket yet)."""
        self.loop = asyncio.get_running_loop()
        cfg = self.config
        self.opened_at = self.loop.time()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = MessageStore(
            self.data_dir / "journal",
            segment_size=cfg.segment_size,
            fsync=cfg.fsync,
            dedupe_max_keys=cfg.dedupe_window_size,
            dedupe_max_age=cfg.dedupe_window_seconds,
            notify=self._notify,
            store_limit=cfg.store_limit,
            store_low_water=cfg.memory_low_water,
            on_failure=self._journal_failed,
            checkpoint_interval=cfg.checkpoint_interval,
        )
        self.store.on_diverged = self._store_diverged
        self.store.open()
        journal = self.store.journal
        journal.inline_thread = threading.get_ident()  # the end of a turn that appended commits (journal.py)
        journal.on_queued = self._end_of_turn
        self._fit_store_limit(self.store)
        self.core = BrokerCore(cfg, self.store, clock=time.time, monotonic=time.monotonic)
        n = self.core.load_from_store()
        self.core.start_scheduler(self.loop.call_later)
        log.info("broker %s: %d messages recovered from %s", cfg.name, n, self.data_dir)
        self._schedule_compaction()

    async def listen(self, host: str | None = None, port: int | None = None) -> None:
        """Bind and accept clients."""
        host = host if host is not None else self.config.host
        port = port if port is not None else self.config.port
        ctx: BrokerContext[BrokerConnection] = BrokerContext(
            core=self.core,
            config=self.config,
            loop=self.loop,
            authenticate=self.authenticate,
            register=self.register,
            unregister=self.unregister,
            new_session_id=self.new_session_id,
            status_headers=self.status_headers,
            fence=self.fence,
            connect_hook=self.connect_hook,
            authorizer=self.authorizer,
            claim_client_id=self.claim_client_id,
            tracer=self.tracer,
        )
        self._server = await self.loop.create_server(
            lambda: BrokerConnection(ctx),
            host,
            port,
            reuse_address=True,
            backlog=CLIENT_BACKLOG,
        )
        sock = self._server.sockets[0]
        self.host, self.port = sock.getsockname()[:2]
        log.info("broker %s listening on stomp://%s:%d", self.config.name, self.host, self.port)
        if self.config.ws is not None:
            await self._listen_ws(ctx)

    async def _listen_ws(self, ctx: BrokerContext[BrokerConnection]) -> None:
        """The WebSocket port (``ws``): the same connections, in WebSocket messages."""
        cfg = self.config
        assert cfg.ws is not None
        host, port = parse_http_address(cfg.ws, "the WebSocket port")
        try:
            self._ws_server = await self.loop.create_server(
                lambda: WebSocketProtocol(lambda: BrokerConnection(ctx), allowed_origins=cfg.ws_allowed_origins,
                                          handshake_timeout=cfg.connect_timeout_ms / 1000.0),
                host, port, reuse_address=True, backlog=CLIENT_BACKLOG,
            )
        except BaseException:
            self._close_listeners()
            raise
        self.ws_address = self._ws_server.sockets[0].getsockname()[:2]
        log.info("broker %s listening on ws://%s:%d", cfg.name, *self.ws_address)

    def _close_listeners(self) -> None:
        """Stop accepting on the client port and the WebSocket port."""
        for server in (self._server, self._ws_server):
            if server is not None:
                server.close()

    def close_port(self) -> bool:
        """Stop accepting clients (close the listening sockets, the WebSocket port's too;
        connections made so far go on): a port that accepts must mean a broker that will
        answer. False if it was not listening. :meth:`listen` binds them again."""
        server, self._server = self._server, None
        ws, self._ws_server, self.ws_address = self._ws_server, None, None
        if ws is not None:
            ws.close()
        if server is None:
            return False
        server.close()
        return True

    async def start(self) -> None:
        await self.open()
        try:
            await self.listen()
        except BaseException:
            self._close_store()
            raise

    async def stop(self) -> None:
        """Stop accepting, close every connection, flush and close the journal."""
        if self._compact_handle is not None:
            self._compact_handle.cancel()
            self._compact_handle = None
        if self.core is not None:
            self.core.shutting_down = True
        self._close_listeners()
        self.abort_connections()
        self.connections.clear()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 5)
            except TimeoutError:
                pass
            self._server = None
        self._ws_server = self.ws_address = None
        await asyncio.sleep(0)  # let connection_lost callbacks run
        self._close_store()
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.close)  # what is queued, bounded by the POST timeout
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
        log.info("broker %s stopped", self.config.name)

    def _close_store(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    # ------------------------------------------------------------------ store failure
    def _fit_store_limit(self, store: MessageStore) -> None:
        """Lower ``store_limit`` to what the data directory's filesystem can hold (as
        ActiveMQ does with storeUsage), so that flow control engages before the disk fills."""
        if not store.limit:
            return
        try:
            free = shutil.disk_usage(store.directory).free
        except OSError:
            return
        room = free + store.journal.size
        if store.limit > room:
            log.warning(
                "store_limit=%d is more than the %d bytes the journal's filesystem can hold (%d free): "
                "using %d",
                store.limit,
                room,
                free,
                room * 9 // 10,
            )
            store.limit = room * 9 // 10

    def _journal_failed(self, error: JournalError) -> None:
        """Called by the journal writer thread once, after the failed batch's completions."""
        loop = self.loop
        if not loop.is_closed():
            loop.call_soon_threadsafe(self.fence, str(error))

    def _store_diverged(self, error: BaseException) -> None:
        """The store's state fell behind its journal (an apply failed after its append):
        a broker serving clients fences itself (on the next loop turn, not inside the
        failed handler) rather than serve from that state; the journal holds every
        record, and a restart recovers them. A replica's failed import fails its
        replication link instead (ha/slave_link.py)."""
        if self._server is not None and not self.loop.is_closed():
            self.loop.call_soon(self.fence, f"the store's state is behind its journal after a failed apply "
                                            f"({type(error).__name__}: {error})")

    def fence(self, reason: str) -> None:
        """Stop serving for good: no more messages are accepted. See the module docstring."""
        if self.fenced is not None:
            return
        self.fenced = reason
        log.error(
            "broker %s: %s: fencing: the client port is closed and every client disconnected; "
            "every receipted message is in the journal (restart once the cause is fixed)",
            self.config.name,
            reason,
        )
        if self._compact_handle is not None:
            self._compact_handle.cancel()
            self._compact_handle = None
        self._close_listeners()
        for conn in list(self.connections):
            conn.fence(reason)
        if self.on_fenced is not None:
            try:
                self.on_fenced(reason)
            except Exception:  # noqa: BLE001 - the fence itself is done
                log.exception("on_fenced callback failed")

    # ------------------------------------------------------------------ glue
    def _notify(self, items: list[tuple[Callback, BaseException | None]]) -> None:
        """Called by the journal writer thread: run completions on the loop, in one hop."""
        loop = self.loop
        if loop.is_closed():
            return
        loop.call_soon_threadsafe(run_completions, items, time.perf_counter())

    def _end_of_turn(self) -> None:
        """A record was appended this loop turn with the journal's writer asleep: once the
        turn's other reads are handled (the next turn, before its I/O), commit them all
        in one batch, here when few (see :data:`INLINE_COMMIT_RECORDS`)."""
        store = self.store
        if store is not None:
            self.loop.call_soon(store.journal.commit_turn, INLINE_COMMIT_RECORDS)

    def _schedule_compaction(self) -> None:
        self._compact_handle = self.loop.call_later(self.config.compact_interval_ms / 1000.0, self._compact)

    def _compact(self) -> None:
        self._compact_handle = None
        if self.store is None:
            return
        try:
            self.store.compact(relocate=self.config.compact_relocate_max)
        except Exception:  # noqa: BLE001 - compaction problems must not stop the broker
            log.exception("compaction failed")
            self.store.compaction_failures += 1
            self.store.journal.check_soon()  # the disk under it gone? that fences (store/guard.py)
        self._schedule_compaction()  # the next run waits compact_interval_ms: never a loop

    def register(self, conn: BrokerConnection) -> str | None:
        """Count a new connection in; the reason it is refused when it cannot be."""
        cfg = self.config
        if len(self.connections) >= cfg.max_connections:
            return f"too many connections (max_connections={cfg.max_connections})"
        waiting = [c for c in self.connections if not c.connected and not c.closing]
        if len(waiting) >= cfg.max_unauthenticated:
            # the one waiting longest makes room: a client that logs in at once gets in
            # however many peers connect and say nothing
            oldest = min(waiting, key=lambda c: c.opened_at)
            log.warning("max_unauthenticated=%d reached: closing %s, connected %.1f s ago without logging in",
                        cfg.max_unauthenticated, oldest.peer, self.loop.time() - oldest.opened_at)
            oldest.refuse(f"too many connections not logged in yet (max_unauthenticated={cfg.max_unauthenticated}); "
                          "the one waiting longest is closed")
        self.connections.add(conn)
        self.connections_opened += 1
        return None

    def abort_connections(self) -> int:
        """Cut every client connection at once (no ERROR frame, nothing flushed): their
        clients fail over and replay what was not receipted. Returns how many."""
        conns = [c for c in self.connections if c.transport is not None]
        for conn in conns:
            assert conn.transport is not None
            conn.transport.abort()
        return len(conns)

    def claim_client_id(self, conn: BrokerConnection, client_id: str) -> str | None:
        """A client-id is connected once (ActiveMQ): None when ``conn`` may have it, else
        why not. With ``allow_link_stealing`` the new connection takes it over and the
        old one is cut (its client reconnects elsewhere or gets the same answer)."""
        for other in list(self.connections):
            if other is conn or not other.connected or other.closing or other.client_id != client_id:
                continue
            if self.config.allow_link_stealing:
                log.warning("client-id %r: connection from %s takes over from %s (allow_link_stealing)",
                            client_id, conn.peer, other.peer)
                other.close_by_admin(f"client-id {client_id!r} was taken over by a new connection from {conn.peer}")
                continue
            return (f"client-id {client_id!r} is already connected from {other.peer} "
                    "(a client-id may be connected once; allow_link_stealing = true lets a new connection take over)")
        return None

    def unregister(self, conn: BrokerConnection) -> None:
        self.connections.discard(conn)

    def authenticate(self, login: str | None, passcode: str | None) -> bool:
        """True when the broker has no users, or ``login``/``passcode`` is one of them."""
        return not self.users or check_login(self.users, login, passcode)

    @property
    def serving(self) -> bool:
        """True while the client port is bound and accepting (readiness)."""
        return self._server is not None and self._server.is_serving()

    def new_session_id(self) -> str:
        return f"{self.config.name}-{self._session_prefix}-{os.getpid()}-{next(self._sessions)}"

    def stats(self) -> dict[str, object]:
        out = dict(self.core.stats()) if self.core is not None else {}
        out["connections"] = len(self.connections)
        if self.store is not None:
            st = self.store.stats()
            out["store"] = {
                "live_messages": st.live_messages,
                "segments": st.segments,
                "deleted_segments": st.deleted_segments,
                "records": st.records,
                "batches": st.batches,
                "size": self.store.journal.size,
                "limit": self.store.limit,
                "flow_control": self.store.full,
            }
        if self.fenced is not None:
            out["fenced"] = self.fenced
        return out

    def status_stats(self, *, names: bool = True) -> dict[str, str]:
        """Counters for a status request (``amq broker status``), as ``amq-ha-*`` headers.

        ``messages`` is the number of live persistent messages in the store;
        ``depths`` a JSON object of queue name -> depth (the deepest
        :data:`STATUS_MAX_DEPTHS` queues; ``depths-omitted`` counts the rest), left
        out with ``names=False``.
        """
        st: dict[str, str] = {"amq-ha-connections": str(len(self.connections))}
        if self.store is not None:
            st["amq-ha-messages"] = str(len(self.store.live))
            st["amq-ha-store-usage"] = str(self.store.journal.size)
            st["amq-ha-store-limit"] = str(self.store.limit)
            st["amq-ha-store-flow-control"] = "true" if self.store.full else "false"
        if self.opened_at is not None:
            st["amq-ha-uptime"] = f"{self.loop.time() - self.opened_at:.1f}"
        core = self.core
        if core is not None:
            st["amq-ha-sent"] = str(core.sent)
            st["amq-ha-queues"] = str(len(core.queues))
            st["amq-ha-topics"] = str(len(core.topics))
            mem = core.memory
            st["amq-ha-memory-usage"] = str(mem.usage)
            st["amq-ha-memory-limit"] = str(mem.limit)
            st["amq-ha-memory-peak"] = str(mem.peak)
            st["amq-ha-memory-flow-control"] = "true" if mem.full else "false"
        if core is not None and names:
            depths = sorted(((q.depth, k) for k, q in core.queues.items()), key=lambda t: (-t[0], t[1]))
            st["amq-ha-depths"] = json.dumps({k: n for n, k in depths[:STATUS_MAX_DEPTHS]}, sort_keys=True)
            if len(depths) > STATUS_MAX_DEPTHS:
                st["amq-ha-depths-omitted"] = str(len(depths) - STATUS_MAX_DEPTHS)
        return st

    def status_headers(self) -> dict[str, str]:
        """The whole answer of a plain (non-HA) broker to a status request: role ``standalone``."""
        return {
            "amq-ha-role": "standalone",
            "amq-ha-name": self.config.name,
            "amq-ha-client": f"{self.host}:{self.port}",
            "amq-ha-pid": str(os.getpid()),
            "amq-ha-listening": "true" if self._server is not None else "false",
            **self.status_stats(),
        }
