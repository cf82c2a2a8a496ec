"""One STOMP link on asyncio streams (what the asyncio failover driver connects with).

Theory of operation
-------------------
:class:`AsyncLink` is the asyncio twin of ``link.StompConnection``: the handshake goes
through the same sans-IO pieces (:func:`~amqtransport.transports.link.handshake_session`
builds the CONNECT, :func:`~amqtransport.transports.link.link_terms` applies the
negotiated terms, the dialect and the URI's overrides), then a reader task feeds the
sans-IO parser and hands each frame to ``on_frame(link, frame)``; the end of the stream,
a protocol error or two silent heart-beat intervals report ``on_lost(link, error)``
once. A heart-beat task writes EOLs when the link has been idle. :meth:`AsyncLink.write`
puts whole serialized frames in the transport's buffer in one synchronous call: a
cancelled caller can never leave half a frame on the stream. Errors are mapped here,
once, to the ``TransportError`` family.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Sequence

from amqtransport._backends.base import leaf_address
from amqtransport._backends.sockets import apply_socket_settings, vm_endpoint, vm_name
from amqtransport.activemq_options import first_deadline_grace_ms, socket_settings
from amqtransport.errors import (
    ConnectError,
    ConnectionClosed,
    HeartbeatTimeout,
    ReadError,
    RemoteProtocolError,
    TransportError,
)
from amqtransport.stomp import HEARTBEAT_BYTES, NEED_DATA, Frame, FrameParser, serialize
from amqtransport.transports.dialect import Dialect, dialect_named
from amqtransport.transports.link import (
    ConnectParams,
    connect_timeout_for,
    handshake_session,
    link_terms,
)
from amqtransport.uri import LeafUri

__all__ = ["AsyncLink", "FrameHandler", "LostHandler", "async_tcp_probe", "open_stream_link"]

log = logging.getLogger(__name__)

FrameHandler = Callable[["AsyncLink", Frame], None]
LostHandler = Callable[["AsyncLink", TransportError], None]


class AsyncLink:
    """One STOMP link on asyncio streams (see the module docstring)."""

    def __init__(self, leaf: LeafUri, params: ConnectParams, on_frame: FrameHandler, on_lost: LostHandler) -> None:
        self.leaf = leaf
        self.address = leaf_address(leaf)
        self._params = params
        self._on_frame = on_frame
        self._on_lost = on_lost
        #: the driver's generation number for this link
        self.tag = 0
        self.version = "1.2"
        self.connected_frame: Frame | None = None
        self.error_frame: Frame | None = None
        self.dialect: Dialect = dialect_named("generic")
        self.text_mode = False
        self.duplicate_id_header: str | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._parser = FrameParser("1.2")
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._lost = False
        self._send_every = 0.0
        self._expect_every = 0.0
        self._last_tx = 0.0

    @property
    def alive(self) -> bool:
        return self._writer is not None and not self._closing and not self._lost

    async def open(self) -> Frame:
        """Connect and complete the STOMP handshake; return CONNECTED."""
        leaf = self.leaf
        if leaf.scheme not in ("tcp", "ssl", "vm"):
            raise ConnectError(f"{self.address}: the asyncio driver connects to tcp://, ssl:// and vm:// leaves only")
        timeout = connect_timeout_for(leaf, self._params)
        session, forced = handshake_session(leaf, self._params, self.address)
        context = _ssl_context(leaf) if leaf.scheme == "ssl" else None
        try:
            async with asyncio.timeout(timeout):
                if leaf.scheme == "vm":  # the in-process broker, started on first use (as the sync client does)
                    host, port = await asyncio.to_thread(vm_endpoint, vm_name(leaf))
                else:
                    host, port = leaf.host, leaf.port
                # TLS checks the certificate against serverHostname when given (as the sync client does)
                server_hostname = (leaf.options.server_hostname or host) if context is not None else None
                reader, writer = await asyncio.open_connection(host, port, ssl=context,
                                                               server_hostname=server_hostname)
                apply_socket_settings(writer.get_extra_info("socket"), socket_settings(leaf.amq))
        except ssl.SSLError as exc:
            raise ConnectError(f"{self.address}: TLS handshake failed: {exc}") from exc
        except (OSError, TimeoutError) as exc:
            raise ConnectError(f"{self.address}: connect failed: {exc or 'timed out'}") from exc
        try:
            writer.write(session.connect_bytes())
            async with asyncio.timeout(timeout):
                while (terms := session.feed(await reader.read(65536) or _eof(self.address))) is None:
                    pass
        except (OSError, TimeoutError) as exc:
            writer.close()
            raise ConnectError(f"{self.address}: handshake failed: {exc or 'no CONNECTED in time'}") from exc
        except BaseException:
            writer.close()
            raise
        applied = link_terms(leaf, terms, forced)
        self.version, self.connected_frame = applied.version, applied.connected_frame
        self.dialect, self.text_mode = applied.dialect, applied.text_mode
        self.duplicate_id_header = applied.duplicate_id_header
        self._parser = session.parser
        self._send_every, self._expect_every = applied.send_every_ms / 1000.0, applied.expect_every_ms / 1000.0
        self._reader, self._writer = reader, writer
        loop = asyncio.get_running_loop()
        self._last_tx = loop.time()
        self._tasks.append(loop.create_task(self._read_loop(), name=f"amq-aio-reader {self.address}"))
        if self._send_every > 0:
            self._tasks.append(loop.create_task(self._beat_loop(), name=f"amq-aio-heartbeat {self.address}"))
        return applied.connected_frame

    def write(self, frames: Sequence[Frame]) -> None:
        """Put ``frames`` in the send buffer, whole and in order (no await: cancellation
        cannot split them). Raises ``TransportError`` when the link is over."""
        writer = self._writer
        if writer is None or not self.alive or writer.is_closing():
            raise ConnectionClosed(f"{self.address}: connection closed")
        if frames:
            writer.write(b"".join(serialize(f, self.version, text_mode=self.text_mode) for f in frames))
            self._last_tx = asyncio.get_running_loop().time()

    async def drain(self) -> None:
        """Wait while the send buffer is over its high-water mark (errors: the reader reports the loss)."""
        writer = self._writer
        if writer is not None and self.alive:
            try:
                await writer.drain()
            except (OSError, RuntimeError):
                pass

    async def _read_loop(self) -> None:
        reader = self._reader
        assert reader is not None
        error: TransportError
        # wireFormat.maxInactivityDurationInitalDelay: the first deadline comes no sooner than this
        grace = first_deadline_grace_ms(self.leaf.amq) / 1000.0
        try:
            while True:
                timeout = max(2 * self._expect_every, grace) if self._expect_every > 0 else None
                grace = 0.0
                try:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(65536)
                except TimeoutError:
                    raise HeartbeatTimeout(f"{self.address}: no data from the broker for {timeout:.3f} s "
                                           "(2 heart-beat intervals): connection is half-open") from None
                if not data:
                    raise ConnectionClosed(f"{self.address}: connection closed by the broker")
                self._parser.feed(data)
                while (event := self._parser.next_event()) is not NEED_DATA:
                    if isinstance(event, Frame):
                        try:
                            self._on_frame(self, event)
                        except Exception:  # the handler's bug: logged, the link goes on
                            log.exception("%s: frame handler failed on %s", self.address, event.command)
                if self._lost or self._closing:
                    return
        except TransportError as exc:
            error = exc
        except RemoteProtocolError as exc:
            error = ReadError(f"{self.address}: protocol error from the broker: {exc}")
        except OSError as exc:
            error = ConnectionClosed(f"{self.address}: connection lost: {exc}")
        except asyncio.CancelledError:
            return
        self.kill(error)

    async def _beat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self.alive and self._writer is not None:
            await asyncio.sleep(self._send_every / 2)
            if self.alive and loop.time() - self._last_tx >= self._send_every * 0.8:
                self._writer.write(HEARTBEAT_BYTES)
                self._last_tx = loop.time()

    def kill(self, error: TransportError) -> None:
        """The link is lost: report it once, close the stream."""
        if self._lost or self._closing:
            return
        self._lost = True
        if self._writer is not None:
            self._writer.close()
        log.info("%s: connection lost: %s", self.address, error)
        self._on_lost(self, error)

    def end_with_error(self, frame: Frame) -> None:
        """An ERROR naming no request ends the link (kept as ``error_frame``)."""
        if self.error_frame is None:
            self.error_frame = frame
        self.kill(ConnectionClosed(f"{self.address}: broker ERROR: {frame.get('message') or 'no message'}"))

    def close(self, *, disconnect: bool = True) -> None:
        """Close locally (no loss reported); a DISCONNECT first when asked."""
        if self._closing:
            return
        writer = self._writer
        if disconnect and writer is not None and not self._lost and not writer.is_closing():
            writer.write(serialize(Frame.make("DISCONNECT", {}), self.version))
        self._closing = True
        if writer is not None:
            writer.close()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()


def _eof(address: str) -> bytes:
    raise ConnectionClosed(f"{address}: connection closed during the STOMP handshake")


def _ssl_context(leaf: LeafUri) -> ssl.SSLContext:
    from amqtransport._backends.sockets import build_ssl_context  # noqa: PLC0415

    return build_ssl_context(leaf.options, socket_settings(leaf.amq))


async def open_stream_link(leaf: LeafUri, params: ConnectParams, on_frame: FrameHandler,
                           on_lost: LostHandler) -> AsyncLink:
    """A link to ``leaf`` whose handshake is done."""
    link = AsyncLink(leaf, params, on_frame, on_lost)
    await link.open()
    return link


async def async_tcp_probe(leaf: LeafUri, timeout: float) -> bool:
    """True when a bare TCP connect to ``leaf`` succeeds within ``timeout`` (nothing is written)."""
    try:
        async with asyncio.timeout(max(timeout, 0.05)):
            _, writer = await asyncio.open_connection(leaf.host, leaf.port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True
