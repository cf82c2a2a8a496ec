"""One Toxiproxy proxy: a listener, its connection pairs, and their toxic pipelines.

Theory of operation
-------------------
A :class:`Proxy` listens on ``listen``. For each accepted client it dials
``upstream`` (the client is accepted first; if the dial fails the client is simply
closed, so it sees a connect followed by EOF). A :class:`ProxyConnection` then runs
two *directions*: ``upstream`` (client → server) and ``downstream`` (server → client).

Each direction is two tasks and a chain of stages::

    source socket --reader--> bounded queue --pump--> stage 1 -> stage 2 -> ... -> dest socket

- The *reader* stamps every chunk with the loop time at which it was read and puts
  it into a bounded queue (64 chunks). A full queue stops the reader, so a stalled
  pipeline pushes back on the sender through TCP, as Toxiproxy's channels do.
- The *pump* is the only code that moves bytes from the queue to the destination.
  It takes one chunk at a time and hands it to the first stage; a stage's toxic
  passes what remains on with ``emit``, which finds the *next* stage at that moment
  and finally writes to the destination (awaiting ``drain``). Because one pump moves
  one chunk at a time, bytes can never be reordered, whatever the toxics do.
- A *stage* is one toxic on one connection-direction, with its own state (bytes
  counted, timers) and its toxicity roll (made once, when the toxic starts on that
  connection-direction; again only if the toxic is updated). Stages are ordered by
  the toxic's creation number (new toxics go to the end of the chain, as in
  Toxiproxy); ``emit`` from a stage goes to the first live stage with a higher number.

Live changes, without losing or reordering bytes:

- *Adding* a toxic appends a stage to every open connection of that stream; the
  chunk in flight (if any) meets it when it gets that far, later chunks all do.
- *Removing* a toxic takes its stage out of the chain and interrupts its wait: a
  toxic whose ``sleep`` is interrupted passes on what it holds at once, to the
  stage after it. Nothing is dropped by the change itself. (``timeout`` is the
  exception by design: it has been dropping data, so removing it closes the
  connections it was active on, as Toxiproxy does.)
- *Updating* a toxic interrupts the in-flight wait the same way; later chunks use the
  new attributes; per-connection state (e.g. ``limit_data``'s count) is kept.
- Delayed chunks are held by the pump itself, in order: the queue behind it keeps
  filling (timestamps taken at read time), so ``latency`` does not pile delays up.

Closing (no half-close, as in Toxiproxy): when a direction's input ends (EOF or an
error) or a toxic ends it (``limit_data``, ``reset_peer``, a ``timeout`` timer), the
stages after that point get ``on_eof`` (``slow_close`` waits there), then the
direction closes its destination socket. That socket is the other direction's
source, which therefore sees EOF, drains what it already read through its own
chain, and closes the remaining socket. A failed write ends only its own direction
(the destination is aborted), so the other direction still runs its ``slow_close``
before closing the client, as Toxiproxy does. Disabling or deleting a proxy closes its
listener and aborts every connection at once, both ways. Connections opened while a
``reset_peer`` toxic exists get SO_LINGER 0 on both sockets, so their close is an RST.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
import socket
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from chaos.proxy.addresses import format_hostport, parse_hostport
from chaos.proxy.errors import ApiError, BadRequest, Conflict, NotFound
from chaos.proxy.listener import Listener
from chaos.proxy.toxics import STREAMS, Chunk, EndOfStream, ResetPeerToxic, Toxic, make_toxic

__all__ = ["ToxicSpec", "Proxy", "ProxyConnection", "DIAL_TIMEOUT"]

log = logging.getLogger(__name__)

DIAL_TIMEOUT = 10.0
# The accept queue asked for; the kernel caps it at net.core.somaxconn, which is what Go's
# net.Listen (Toxiproxy's) uses. 128 overflowed in a reconnect storm on a busy machine: the
# kernel then drops a client's last handshake ACK, and that client, which believes it is
# connected, is never accepted nor closed.
LISTEN_BACKLOG = 65535
READ_SIZE = 65536
QUEUE_CHUNKS = 64


@dataclass
class ToxicSpec:
    """A toxic as configured on a proxy (shared by all its connections)."""

    name: str
    type: str
    stream: str
    toxicity: float
    toxic: Toxic
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": self.toxic.attributes(),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
        }


class _Stage:
    """One toxic on one direction of one connection (the ``toxics.ToxicStage`` protocol)."""

    def __init__(self, direction: _Direction, spec: ToxicSpec) -> None:
        self.direction = direction
        self.spec = spec
        self.seq = spec.seq
        self.toxic = spec.toxic
        self.rng: random.Random = direction.conn.rng
        self.state: dict[str, Any] = {}
        self.active = self.rng.random() < spec.toxicity
        self.removed = False
        self._generation = 0
        self._chunk_generation = 0
        self._waiter: asyncio.Future[bool] | None = None

    # -- the toxics.Stage protocol ---------------------------------------------------
    async def emit(self, chunk: Chunk) -> None:
        await self.direction.emit_after(self.seq, chunk)

    async def sleep(self, seconds: float) -> bool:
        if self.removed or self._generation != self._chunk_generation:
            return False
        if seconds <= 0:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        handle = loop.call_later(seconds, _resolve, waiter, True)
        self._waiter = waiter
        try:
            return await waiter
        finally:
            handle.cancel()
            self._waiter = None

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_later(self, seconds: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(seconds, _guarded, callback)

    def close_stream(self) -> None:
        self.direction.close_from(self.seq)

    # -- used by the direction ---------------------------------------------------------
    def start(self) -> None:
        if self.active:
            self.toxic.on_start(self)

    async def process(self, chunk: Chunk) -> None:
        if not self.active or self.removed:
            await self.emit(chunk)
            return
        self._chunk_generation = self._generation
        try:
            await self.toxic.on_chunk(self, chunk)
        except EndOfStream as end:
            if end.after_seq is None:
                end.after_seq = self.seq
            raise

    async def on_eof(self) -> None:
        if self.active and not self.removed:
            self._chunk_generation = self._generation
            await self.toxic.on_eof(self)

    def interrupt(self) -> None:
        self._generation += 1
        if self._waiter is not None:
            _resolve(self._waiter, False)

    def remove(self) -> None:
        """The toxic was deleted: stop waiting, pass held data on, run its cleanup."""
        self.removed = True
        self.interrupt()
        if self.active:
            self.toxic.on_stop(self, True)

    def update(self, spec: ToxicSpec) -> None:
        if self.active:
            self.toxic.on_stop(self, False)
        self.spec = spec
        self.toxic = spec.toxic
        self.active = self.rng.random() < spec.toxicity
        self.interrupt()
        self.start()

    def teardown(self) -> None:
        self.interrupt()
        if self.active:
            self.toxic.on_stop(self, False)


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


def _guarded(callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception:  # a toxic's timer must not kill the loop
        log.exception("toxic timer callback failed")


class _Direction:
    """One direction of a connection: reader task, bounded queue, pump task, stages."""

    def __init__(
        self,
        conn: ProxyConnection,
        stream: str,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.source = source
        self.dest = dest
        self.chain: list[_Stage] = []
        self.queue: asyncio.Queue[Chunk | None] = asyncio.Queue(QUEUE_CHUNKS)
        self.finishing = False
        self.done = False
        self.bytes_out = 0
        self._reader: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reader = self.conn.spawn(self._read_loop())
        self._pump = self.conn.spawn(self._pump_loop())

    # -- chain maintenance (called from the API, on the loop) ---------------------------
    def add(self, spec: ToxicSpec) -> None:
        stage = _Stage(self, spec)
        self.chain.append(stage)
        self.chain.sort(key=lambda s: s.seq)
        if not self.finishing:
            stage.start()

    def remove(self, name: str) -> None:
        for stage in self.chain:
            if stage.spec.name == name:
                self.chain.remove(stage)
                stage.remove()
                return

    def update(self, spec: ToxicSpec) -> None:
        for stage in self.chain:
            if stage.spec.name == spec.name:
                stage.update(spec)
                return

    # -- moving bytes --------------------------------------------------------------------
    async def emit_after(self, seq: int, chunk: Chunk) -> None:
        for stage in self.chain:
            if stage.seq > seq:
                await stage.process(chunk)
                return
        if not chunk.data:
            return
        if self.dest.is_closing():
            raise ConnectionResetError("destination closed")
        self.dest.write(chunk.data)
        self.bytes_out += len(chunk.data)
        await self.dest.drain()

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.source.read(READ_SIZE)
                if not data:
                    break
                await self.queue.put(Chunk(data, loop.time()))
        except OSError as exc:
            log.debug("%s %s: read ended: %s", self.conn.label, self.stream, exc)
        await self.queue.put(None)

    async def _pump_loop(self) -> None:
        after = -1
        try:
            while True:
                chunk = await self.queue.get()
                if chunk is None:
                    break
                await self.emit_after(-1, chunk)
        except EndOfStream as end:
            after = end.after_seq if end.after_seq is not None else -1
        except OSError as exc:
            # The destination is gone: end this direction only. The other direction
            # then sees EOF on that socket and closes its own destination in turn
            # (after its slow_close, if any), as Toxiproxy's links do.
            log.debug("%s %s: write failed: %s", self.conn.label, self.stream, exc)
            await self._finish(after, broken=True)
            return
        await self._finish(after)

    def close_from(self, seq: int) -> None:
        """End this direction at stage ``seq`` from a timer or an API change."""
        if self.finishing or self.done:
            return
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
        self.conn.spawn(self._finish(seq))

    async def _finish(self, after_seq: int, broken: bool = False) -> None:
        if self.finishing:
            return
        self.finishing = True
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
        try:
            if not broken:
                for stage in list(self.chain):
                    if stage.seq > after_seq:
                        await stage.on_eof()
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if broken:
                    self.dest.transport.abort()
                else:
                    self.dest.close()
            self.done = True
            self.conn.direction_done()

    def teardown(self) -> None:
        for stage in self.chain:
            stage.teardown()


class ProxyConnection:
    """A client connection and its upstream connection, joined by two directions."""

    def __init__(
        self, proxy: Proxy, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.client_reader = client_reader
        self.client_writer = client_writer
        self.server_writer: asyncio.StreamWriter | None = None
        self.rng = random.Random()
        self.directions: dict[str, _Direction] = {}
        self.closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        peer = client_writer.get_extra_info("peername")
        self.label = f"{proxy.name}[{format_hostport(*peer[:2]) if peer else '?'}]"

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task failed", self.label, exc_info=task.exception())
            self.abort()

    async def run(self) -> None:
        host, port = parse_hostport(self.proxy.upstream, "upstream")
        try:
            server_reader, server_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), DIAL_TIMEOUT
            )
        except (TimeoutError, OSError) as exc:
            log.warning("%s: dial %s failed: %s", self.label, self.proxy.upstream, exc)
            self.abort()
            return
        if self.closed:  # disabled while dialing
            server_writer.transport.abort()
            return
        self.server_writer = server_writer
        if any(isinstance(t.toxic, ResetPeerToxic) for t in self.proxy.toxics.values()):
            for writer in (self.client_writer, server_writer):
                _set_linger_zero(writer)
        self.directions = {
            "upstream": _Direction(self, "upstream", self.client_reader, server_writer),
            "downstream": _Direction(self, "downstream", server_reader, self.client_writer),
        }
        for spec in sorted(self.proxy.toxics.values(), key=lambda s: s.seq):
            self.directions[spec.stream].add(spec)
        for direction in self.directions.values():
            direction.start()
        log.debug("%s: connected to %s", self.label, self.proxy.upstream)

    def add_toxic(self, spec: ToxicSpec) -> None:
        if spec.stream in self.directions:
            self.directions[spec.stream].add(spec)

    def remove_toxic(self, spec: ToxicSpec) -> None:
        if spec.stream in self.directions:
            self.directions[spec.stream].remove(spec.name)

    def update_toxic(self, spec: ToxicSpec) -> None:
        if spec.stream in self.directions:
            self.directions[spec.stream].update(spec)

    def direction_done(self) -> None:
        if all(d.done for d in self.directions.values()):
            self._forget()

    def abort(self) -> None:
        """Close both sockets at once and stop every task of this connection."""
        if self.closed:
            return
        self.closed = True
        for direction in self.directions.values():
            direction.teardown()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        for writer in (self.client_writer, self.server_writer):
            if writer is not None:
                writer.transport.abort()
        self.proxy.connections.discard(self)

    def _forget(self) -> None:
        if not self.closed:
            self.closed = True
            for direction in self.directions.values():
                direction.teardown()
            self.proxy.connections.discard(self)
            log.debug("%s: closed", self.label)


def _set_linger_zero(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class Proxy:
    """A named proxy: ``listen`` → ``upstream``, its toxics and its live connections.

    All methods run on the event loop that owns the proxy (not thread-safe).
    """

    def __init__(self, name: str, listen: str, upstream: str) -> None:
        parse_hostport(listen, "listen")
        parse_hostport(upstream, "upstream")
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics: dict[str, ToxicSpec] = {}
        self.connections: set[ProxyConnection] = set()
        self._listener: Listener | None = None
        self._seq = 0

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [t.to_json() for t in sorted(self.toxics.values(), key=lambda t: t.seq)],
        }

    # -- listener ------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind ``listen`` and accept; ``listen`` becomes the real bound address.

        Raises :class:`~chaos.proxy.errors.ApiError` (500) when the address cannot be bound.
        """
        if self._listener is not None:
            return
        host, port = parse_hostport(self.listen, "listen")
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError as exc:
            raise ApiError(f"listen tcp {self.listen}: {exc}") from exc
        infos.sort(key=lambda info: info[0] != socket.AF_INET)
        family, _, _, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            if exc.errno == errno.EADDRINUSE:
                reason = "address already in use"
            raise ApiError(f"listen tcp {self.listen}: bind: {reason.lower()}") from exc
        self._listener = Listener(sock, self._accept)
        self._listener.start()
        bound = sock.getsockname()
        self.listen = format_hostport(bound[0], bound[1])
        self.enabled = True
        log.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    def stop(self) -> None:
        """Close the listener (new connects are refused) and every open connection."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            log.info("proxy %s stopped listening on %s", self.name, self.listen)
        for conn in list(self.connections):
            conn.abort()
        self.enabled = False

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._listener is None:
            writer.transport.abort()
            return
        conn = ProxyConnection(self, reader, writer)
        self.connections.add(conn)
        conn.spawn(conn.run())

    # -- toxics ----------------------------------------------------------------------------
    def add_toxic(
        self,
        type_name: str,
        *,
        name: str | None = None,
        stream: str = "downstream",
        toxicity: float = 1.0,
        attributes: dict[str, Any] | None = None,
    ) -> ToxicSpec:
        if stream not in STREAMS:
            raise BadRequest(
                f"stream was invalid, can be either upstream or downstream (got {stream!r})"
            )
        toxic = make_toxic(type_name, attributes)
        toxicity = _check_toxicity(toxicity)
        if name is None or name == "":
            name = f"{type_name}_{stream}"
        if name in self.toxics:
            raise Conflict("toxic already exists")
        self._seq += 1
        spec = ToxicSpec(name, type_name, stream, toxicity, toxic, self._seq)
        self.toxics[name] = spec
        for conn in list(self.connections):
            conn.add_toxic(spec)
        log.info("proxy %s: toxic %s added %s", self.name, name, spec.to_json())
        return spec

    def get_toxic(self, name: str) -> ToxicSpec:
        spec = self.toxics.get(name)
        if spec is None:
            raise NotFound("toxic not found")
        return spec

    def update_toxic(
        self, name: str, attributes: dict[str, Any] | None = None, toxicity: float | None = None
    ) -> ToxicSpec:
        old = self.get_toxic(name)
        toxic = make_toxic(old.type, attributes, base=old.toxic)
        new_toxicity = old.toxicity if toxicity is None else _check_toxicity(toxicity)
        spec = ToxicSpec(old.name, old.type, old.stream, new_toxicity, toxic, old.seq)
        self.toxics[name] = spec
        for conn in list(self.connections):
            conn.update_toxic(spec)
        log.info("proxy %s: toxic %s updated %s", self.name, name, spec.to_json())
        return spec

    def remove_toxic(self, name: str) -> None:
        spec = self.get_toxic(name)
        del self.toxics[name]
        for conn in list(self.connections):
            conn.remove_toxic(spec)
        log.info("proxy %s: toxic %s removed", self.name, name)

    def reset_toxics(self) -> None:
        for name in list(self.toxics):
            self.remove_toxic(name)


def _check_toxicity(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"toxicity must be a number between 0 and 1, got {value!r}")
    if not 0.0 <= float(value) <= 1.0:
        raise BadRequest(f"toxicity must be between 0 and 1, got {value!r}")
    return float(value)
