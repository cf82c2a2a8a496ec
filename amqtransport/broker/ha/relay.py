"""A slave (or shared-store standby) that relays clients to its live master (``--relay-port``).

Theory of operation
-------------------
A node binds its client port only while it is master (ActiveMQ's behaviour): a client
cut from the master (a partition between the clients and the master only, a half-open
connection, a proxy in front of the master that died) has nowhere to go until the cut
heals, although the master is alive, holds its witness lease and still reaches its
slave. With ``--relay-port PORT`` a node that is *not* master but has positive, current
knowledge of a live master binds that port -- a port of its own, never the client
port -- and relays each client connection, byte for byte, to the master's client port:
one more hop, and the client is served by the master as if it had reached it directly
(the receipts are the master's; the slave adds nothing to the safety argument, which
stays with epochs and the witness lease).

Because the relay has a port of its own, the client's failover URI decides when it is
used: the URI lists every node's client port first and the relay ports after them
(``failover:(tcp://a:C1,tcp://b:C2,tcp://a:R1,tcp://b:R2)?randomize=false``), so a
client that reaches the master connects to it directly, and only a client cut from it
falls through to a slave's relay, as a last resort. The slave is then on the path of
those clients alone (a slave's kill or freeze does not touch the others). Port 0 binds
a free port, kept for the node's life once bound; the log line that says the node
relays names it (``node b: relaying clients on HOST:PORT to master a at HOST:PORT``),
and so do the status headers (``amq-ha-relay-port``).

The knowledge, and what ends it (:class:`ClientRelay` never decides it: its owner does):

* a replicated slave relays while its replication link to the master is up, to the
  client address the master gave in its handshake (``amq-ha-client``;
  :func:`.slave.serve_slave` starts the relay after the handshake and stops it as the
  link ends, for whatever reason, before the node decides what to do next);
* a shared-store standby relays while a status probe of the other announced node's HA
  port says that node is master (:class:`MasterWatch`, every quarter of
  ``--link-timeout``; an answer that says no master stops the relay at once, silence
  stops it after ``--link-timeout``); the standby's role loop stops the watch before it
  takes the store (:mod:`.shared`, :mod:`.sealed`).

Two slaves never relay to each other (each relays only with a live link to a master,
and a master never relays), and a node never relays to its own address. When the relay
stops -- the link is lost, the node takes over, the node stops -- its listening socket
is closed at once (a client trying it is refused and goes on to its next address) and every relayed connection is cut:
the clients' failover reconnects and the new master, whoever it is, serves them directly.
A bind that is still under way when the relay stops closes what it bound;
:meth:`ClientRelay.settled` waits for it, so a stopped node leaves no port bound.

One connection (:class:`_ClientSide`): the relay reads the client's first frame (within
``ha_idle_timeout``, at most ``ha_max_frame`` bytes: the HA port's bounds), keeping
the raw bytes. An HA request (a status probe, a replication or stand-by request) is
answered by *this* node, as its HA port would answer it (:class:`.port.HaRequests`):
a peer or an operator probing this node's relay port learns that it is a slave,
never the master's status under this node's address. Anything else opens a
connection to the master's client port and forwards the bytes read so far, then
everything in both directions, with back-pressure (a full socket buffer on one side
pauses reading on the other). If the master's port does not accept within
``--link-timeout``, the client's connection is closed before any byte is written to
it: the failover client counts a connection closed with no answer to its ``CONNECT``
as a refusal (``ConnectRefused``) and tries its next address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from amqtransport.stomp import Limits
from amqtransport.stomp.session import ServerSession
from amqtransport.tasks import cancel_and_wait

from ..server import CLIENT_BACKLOG
from .config import HaPortLimits
from .port import ROLE_REQUESTS, RequestHandler, answer_error
from .wire import STATUS_HEADER

__all__ = ["ClientRelay", "MasterWatch", "Sighting"]

log = logging.getLogger(__name__)

WILDCARDS = ("", "0.0.0.0", "::", "*")
FLUSH_SECONDS = 1.0  # a relayed side closing with bytes buffered for a peer that reads nothing is aborted after it


class ClientRelay:
    """The relay port of a node that relays to its master (see the module docstring).
    :meth:`relay_to` binds it (once) and points it at a master; :meth:`stop` closes it
    and every relayed connection. ``port`` 0 binds a free port, kept from then on;
    ``client_port`` is the node's own client port (never relayed to)."""

    def __init__(self, name: str, host: str, port: int, limits: HaPortLimits, requests: RequestHandler,
                 connect_timeout: float, *, client_port: int | None = None) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.client_port = client_port
        self.limits = limits
        self.requests = requests
        self.connect_timeout = connect_timeout
        self.master = ""  # the master's name ("" not relaying)
        self.upstream: tuple[str, int] | None = None  # its client address
        self.connections: set[_ClientSide] = set()  # every connection accepted and not closed yet
        self.relayed_total = 0  # connections relayed to a master (upstream connected)
        self.refused_total = 0  # connections closed because the master's port did not accept
        self._server: asyncio.Server | None = None
        self._binding: asyncio.Future[None] | None = None
        self._wanted = False
        self._bind_error = ""

    @property
    def active(self) -> bool:
        """The relay listens and points at a master."""
        return self._server is not None and self.upstream is not None

    @property
    def accepting(self) -> bool:
        """A client connecting now is relayed (or its HA request answered)."""
        return self._wanted and self.upstream is not None

    @property
    def relayed(self) -> int:
        """Connections relayed to the master now (the gauge)."""
        return sum(1 for c in self.connections if c.upstream is not None)

    def where(self) -> str:
        """``HOST:PORT`` of the master the relay points at ("" none)."""
        return f"{self.upstream[0]}:{self.upstream[1]}" if self.active and self.upstream is not None else ""

    @property
    def address(self) -> str:
        """``HOST:PORT`` the relay listens on (its port is 0 until a port-0 relay is bound)."""
        return f"{self.host}:{self.port}"

    async def relay_to(self, master: str, upstream: tuple[str, int]) -> None:
        """Relay clients to ``master`` at ``upstream`` (its client address) from now on;
        binds the relay port if it is not bound. A bind that fails is logged (the
        relay stays off; the next call tries again)."""
        if upstream in ((self.host, self.port), (self.host, self.client_port)) or master == self.name:
            log.error("node %s: not relaying clients to %s at %s:%d: that is this node", self.name, master,
                      *upstream)
            return
        changed = (master, upstream) != (self.master, self.upstream) or self._server is None
        if changed and self.active and self.connections:  # another master: what went to the old one goes
            log.warning("node %s: the master is now %s at %s:%d, no longer %s: closing %d relayed connections",
                        self.name, master, *upstream, self.master, len(self.connections))
            for conn in list(self.connections):
                conn.abort()
        self._wanted = True
        self.master, self.upstream = master, upstream
        if self._server is None:
            if self._binding is None:
                self._binding = asyncio.ensure_future(self._bind())
            await asyncio.shield(self._binding)
        if changed and self.active:
            log.warning("node %s: relaying clients on %s to master %s at %s:%d", self.name, self.address, master,
                        *upstream)

    async def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(lambda: _ClientSide(self), self.host, self.port, reuse_address=True,
                                              backlog=CLIENT_BACKLOG)
        except OSError as exc:
            if str(exc) != self._bind_error:  # a standby tries again at every look: said once per error
                self._bind_error = str(exc)
                log.error("node %s: cannot relay clients: binding the relay port %s:%d failed: %s", self.name,
                          self.host, self.port, exc)
            return
        finally:
            self._binding = None
        self._bind_error = ""
        if not self._wanted:  # stopped while binding: what was bound goes at once
            server.close()
            return
        self._server = server
        if self.port == 0:  # a free port: kept for the node's life (the clients' URI may list it)
            self.port = server.sockets[0].getsockname()[1]

    def stop(self, why: str) -> None:
        """Stop relaying: close the relay port and cut every relayed connection now."""
        was = self.active
        master = self.master
        self._wanted = False
        self.master, self.upstream = "", None
        server, self._server = self._server, None
        if server is not None:
            server.close()
        cut = len(self.connections)
        for conn in list(self.connections):
            conn.abort()
        if was:
            log.warning("node %s: stopped relaying clients to master %s: %s (%d connections closed)", self.name,
                        master, why, cut)

    async def settled(self) -> None:
        """Wait for a bind under way to end (:meth:`stop` made it close what it bound)."""
        binding = self._binding
        if binding is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait([binding])


def upstream_of(client: str, reached: str) -> tuple[str, int] | None:
    """The master's client address from its ``amq-ha-client`` (``HOST:PORT``); a wildcard
    host is replaced by ``reached``, the host we reached the master on. None if unreadable."""
    host, sep, port = client.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    host = host.strip("[]")
    return (reached if host in WILDCARDS else host), int(port)


#: what a standby's look finds: (master name, its client address), or why there is none
#: (a str: the other node answered and is not master), or None (nobody answered)
Sighting = tuple[str, tuple[str, int]] | str | None


class MasterWatch:
    """A shared-store standby's look at its master (see the module docstring): relays
    while the last sighting of a master is younger than ``stale`` seconds."""

    def __init__(self, relay: ClientRelay, look: Callable[[], Awaitable[Sighting]], *, every: float,
                 stale: float) -> None:
        self.relay = relay
        self.look = look
        self.every = every
        self.stale = stale
        self._task: asyncio.Task[None] | None = None

    def watch(self) -> None:
        """Start watching (no-op when already watching)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def unwatch(self, why: str) -> None:
        """Stop watching and relaying; the relay port is closed when this returns."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)  # one cancel may be swallowed by the look's wait_for (tasks.py)
        self.relay.stop(why)
        await self.relay.settled()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        seen = loop.time()
        while True:
            sighting = await self.look()
            now = loop.time()
            if isinstance(sighting, tuple):
                seen = now
                await self.relay.relay_to(*sighting)
            elif isinstance(sighting, str):
                self.relay.stop(sighting)
            elif self.relay.active and now - seen >= self.stale:
                self.relay.stop(f"master {self.relay.master} not seen for {self.stale:g} s")
            await asyncio.sleep(self.every)


class _Side(asyncio.Protocol):
    """The master's end of one relayed connection."""

    def __init__(self, conn: _ClientSide) -> None:
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        self.conn.to_client(data)

    def pause_writing(self) -> None:
        self.conn.pause_client()

    def resume_writing(self) -> None:
        self.conn.resume_client()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.upstream_lost()


class _ClientSide(asyncio.Protocol):
    """One client connection to the relay (see the module docstring)."""

    def __init__(self, relay: ClientRelay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.peer = "?"
        self.raw = bytearray()  # the bytes read before the master's side is connected
        self.session: ServerSession | None = ServerSession(
            Limits(max_frame_size=relay.limits.max_frame, max_headers=64,
                   max_header_line=min(8192, relay.limits.max_frame)))
        self.connecting: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        p = transport.get_extra_info("peername")
        self.peer = f"{p[0]}:{p[1]}" if isinstance(p, tuple) else str(p)
        if not self.relay.accepting:
            transport.abort()
            return
        self.relay.connections.add(self)
        self.timer = asyncio.get_running_loop().call_later(self.relay.limits.idle_timeout, self._idle)

    def _idle(self) -> None:
        self.timer = None
        if self.session is not None and self.transport is not None:
            self._finish()
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.done or self.transport is None:
            return
        if self.upstream is not None:
            self.upstream.write(data)
            return
        self.raw += data
        if self.session is None:  # connecting: the bytes wait in raw
            return
        try:
            frame = self.session.feed(data)
        except Exception as exc:  # noqa: BLE001 - garbage before any CONNECT: the master would refuse it too
            self._finish()
            answer_error(self.transport, f"malformed frame: {exc}")
            return
        if frame is None:
            return
        self.session = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if frame.get(STATUS_HEADER) is not None or any(frame.get(h) is not None for h in ROLE_REQUESTS):
            # an HA request is this node's to answer, as on its HA port
            self._finish()
            self.transport.pause_reading()
            self.relay.requests.handle(self.transport, frame, self.peer)
            return
        self.transport.pause_reading()
        self.connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        relay, transport = self.relay, self.transport
        upstream = relay.upstream
        assert transport is not None
        if upstream is None or self.done:
            self.abort()
            return
        loop = asyncio.get_running_loop()
        try:
            up, _side = await asyncio.wait_for(
                loop.create_connection(lambda: _Side(self), *upstream), relay.connect_timeout)
        except (OSError, TimeoutError) as exc:
            # before any byte of an answer: the failover client takes it for a refusal
            relay.refused_total += 1
            log.info("node %s: relay of client %s to master %s at %s:%d failed: %s; closing it", relay.name,
                     self.peer, relay.master, *upstream, exc or type(exc).__name__)
            self._finish()
            transport.close()  # nothing was written to it: a plain end of stream
            return
        if self.done or relay.upstream != upstream:  # the relay stopped (or moved) meanwhile
            up.abort()
            self.abort()
            return
        self.upstream = up
        relay.relayed_total += 1
        up.write(bytes(self.raw))
        self.raw.clear()
        transport.resume_reading()

    # -- the master's side calls these ------------------------------------------------
    def to_client(self, data: bytes) -> None:
        if self.transport is not None and not self.done:
            self.transport.write(data)

    def pause_client(self) -> None:
        if self.transport is not None and not self.done:
            self.transport.pause_reading()

    def resume_client(self) -> None:
        if self.transport is not None and not self.done and self.session is None:
            self.transport.resume_reading()

    def upstream_lost(self) -> None:
        """The master closed (or lost) its side: the client gets what it sent, then EOF."""
        if not self.done and self.transport is not None:
            self._finish()
            _close_soon(self.transport)

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and not self.done:
            _close_soon(self.upstream)
        self._finish()

    # ----------------------------------------------------------------------------------
    def _finish(self) -> None:
        self.done = True
        self.relay.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.connecting is not None and not self.connecting.done() and self.connecting is not asyncio.current_task():
            self.connecting.cancel()

    def abort(self) -> None:
        """Cut both sides now (the relay stops, or the master's port did not accept)."""
        self._finish()
        if self.transport is not None:
            self.transport.abort()
        if self.upstream is not None:
            self.upstream.abort()


def _close_soon(transport: asyncio.Transport) -> None:
    """Close ``transport`` once its buffered bytes are written, or abort it after
    :data:`FLUSH_SECONDS` (a peer that reads nothing must not hold it open)."""
    transport.close()
    if transport.get_write_buffer_size():
        asyncio.get_running_loop().call_later(FLUSH_SECONDS, transport.abort)
