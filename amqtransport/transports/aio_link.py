"""One STOMP link on an asyncio transport (what the asyncio failover driver connects with).

Theory of operation
-------------------
:class:`AsyncLink` is the asyncio twin of ``link.StompConnection``: the handshake goes
through the same sans-IO pieces (:func:`~amqtransport.transports.link.handshake_session`
builds the CONNECT, :func:`~amqtransport.transports.link.link_terms` applies the
negotiated terms, the dialect and the URI's overrides).

*Reading* is done by the link's :class:`asyncio.Protocol`: the event loop calls
``data_received`` with each chunk the socket gave, which feeds the sans-IO parser and
hands each frame to ``on_frame(link, frame)`` at once, in the same loop turn (no
reader task: a task woken by a stream reader would cost one more loop turn per
RECEIPT, which a window-1 ``send`` waits for). Bytes that come after CONNECTED but
before ``open()`` returned are kept and handed on in the next loop turn, after the
driver installed the link, and so is an end of the connection seen then (after them). The end of the stream, a lost connection, a protocol error
or two silent heart-beat intervals report ``on_lost(link, error)`` once: the read
deadline is one timer, re-armed only when it fires (each chunk just notes the time).

*Writing*: a heart-beat task writes EOLs when the link has been idle.
:meth:`AsyncLink.write` puts whole serialized frames in the transport's buffer in one
synchronous call: a cancelled caller can never leave half a frame on the stream;
:meth:`AsyncLink.drain` waits while the transport says its buffer is over the
high-water mark (``pause_writing``). Errors are mapped here, once, to the
``TransportError`` family.
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
    ConnectRefused,
    HeartbeatTimeout,
    ReadError,
    RemoteProtocolError,
    TransportError,
)
from amqtransport.stomp import HEARTBEAT_BYTES, NEED_DATA, Frame, FrameParser, serialize
from amqtransport.stomp.session import ClientSession, Negotiated
from amqtransport.transports.dialect import Dialect, dialect_named
from amqtransport.transports.link import (
    ConnectParams,
    connect_timeout_for,
    handshake_session,
    link_terms,
)
from amqtransport.transports.probe import settle_time
from amqtransport.uri import LeafUri

__all__ = ["AsyncLink", "FrameHandler", "LostHandler", "async_tcp_probe", "open_stream_link"]

log = logging.getLogger(__name__)

FrameHandler = Callable[["AsyncLink", Frame], None]
LostHandler = Callable[["AsyncLink", TransportError], None]


#: bytes one read takes at most (the buffer the transport reads into, reused)
READ_SIZE = 65536


class _Wire(asyncio.BufferedProtocol):
    """The link's end of the asyncio transport: every event goes to the link. The
    transport reads into one buffer of ours (no allocation per read: a 256 KiB
    ``recv`` per chunk cost a ``mmap``/``munmap`` pair per RECEIPT)."""

    def __init__(self, link: AsyncLink) -> None:
        self._link = link
        self._view = memoryview(bytearray(READ_SIZE))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._link._transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self._link._received(self._view[:nbytes])

    def eof_received(self) -> bool:
        self._link._ended(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._link._ended(exc)

    def pause_writing(self) -> None:
        self._link._pause()

    def resume_writing(self) -> None:
        self._link._resume()


class AsyncLink:
    """One STOMP link on an asyncio transport (see the module docstring)."""

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
        self._transport: asyncio.WriteTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parser = FrameParser("1.2")
        # the handshake: CONNECTED (or its error) arrives through this future
        self._session: ClientSession | None = None
        self._handshake: asyncio.Future[Negotiated] | None = None
        self._early: list[bytes] | None = None  # bytes after CONNECTED, before open() returned
        self._early_end: tuple[BaseException | None] | None = None  # the connection ended then (its error)
        self._reading = False
        self._tasks: list[asyncio.Task[None]] = []
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._drained: asyncio.Future[None] | None = None  # set while the transport is paused
        self._closing = False
        self._lost = False
        self._send_every = 0.0
        self._expect_every = 0.0
        self._last_tx = 0.0
        self._last_rx = 0.0

    @property
    def alive(self) -> bool:
        return self._transport is not None and self._reading and not self._closing and not self._lost

    async def open(self) -> Frame:
        """Connect and complete the STOMP handshake; return CONNECTED."""
        leaf = self.leaf
        if leaf.scheme not in ("tcp", "ssl", "vm"):
            raise ConnectError(f"{self.address}: the asyncio driver connects to tcp://, ssl:// and vm:// leaves only")
        timeout = connect_timeout_for(leaf, self._params)
        session, forced = handshake_session(leaf, self._params, self.address)
        context = _ssl_context(leaf) if leaf.scheme == "ssl" else None
        loop = self._loop = asyncio.get_running_loop()
        self._session = session
        handshake: asyncio.Future[Negotiated] = loop.create_future()
        self._handshake = handshake
        try:
            async with asyncio.timeout(timeout):
                if leaf.scheme == "vm":  # the in-process broker, started on first use (as the sync client does)
                    host, port = await asyncio.to_thread(vm_endpoint, vm_name(leaf))
                else:
                    host, port = leaf.host, leaf.port
                # TLS checks the certificate against serverHostname when given (as the sync client does)
                server_hostname = (leaf.options.server_hostname or host) if context is not None else None
                transport, _ = await loop.create_connection(lambda: _Wire(self), host, port, ssl=context,
                                                            server_hostname=server_hostname)
                apply_socket_settings(transport.get_extra_info("socket"), socket_settings(leaf.amq))
        except ssl.SSLError as exc:
            self._abort()
            raise ConnectError(f"{self.address}: TLS handshake failed: {exc}") from exc
        except ConnectionRefusedError as exc:
            self._abort()
            raise ConnectRefused(f"{self.address}: connect failed: {exc}") from exc
        except (OSError, TimeoutError) as exc:
            self._abort()
            raise ConnectError(f"{self.address}: connect failed: {exc or 'timed out'}") from exc
        except BaseException:
            self._abort()
            raise
        try:
            transport.write(session.connect_bytes())
            async with asyncio.timeout(timeout):
                terms = await handshake
        except (OSError, TimeoutError) as exc:
            self._abort()
            raise ConnectError(f"{self.address}: handshake failed: {exc or 'no CONNECTED in time'}") from exc
        except BaseException:
            self._abort()
            raise
        applied = link_terms(leaf, terms, forced)
        self.version, self.connected_frame = applied.version, applied.connected_frame
        self.dialect, self.text_mode = applied.dialect, applied.text_mode
        self.duplicate_id_header = applied.duplicate_id_header
        self._parser = session.parser
        self._session = self._handshake = None
        self._send_every, self._expect_every = applied.send_every_ms / 1000.0, applied.expect_every_ms / 1000.0
        self._last_tx = self._last_rx = loop.time()
        self._reading = True
        early, self._early = self._early, None
        try:
            if early:
                self._parser.feed(b"".join(early))
        except RemoteProtocolError as exc:
            self._abort()
            raise ConnectError(f"{self.address}: protocol error from the broker: {exc}") from exc
        # frames that came with CONNECTED or right after: handed on once the driver has the link
        loop.call_soon(self._received, b"")
        if self._early_end is not None:  # and then the end of the connection, reported after them
            loop.call_soon(self._ended, *self._early_end)
        if self._expect_every > 0:
            # wireFormat.maxInactivityDurationInitalDelay: the first deadline comes no sooner than this
            grace = first_deadline_grace_ms(leaf.amq) / 1000.0
            self._arm_deadline(max(2 * self._expect_every, grace))
        if self._send_every > 0:
            self._tasks.append(loop.create_task(self._beat_loop(), name=f"amq-aio-heartbeat {self.address}"))
        return applied.connected_frame

    def _abort(self) -> None:
        """The handshake failed: drop the connection (nothing is reported)."""
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def write(self, frames: Sequence[Frame]) -> None:
        """Put ``frames`` in the send buffer, whole and in order (no await: cancellation
        cannot split them). Raises ``TransportError`` when the link is over."""
        transport = self._transport
        if transport is None or not self.alive or transport.is_closing():
            raise ConnectionClosed(f"{self.address}: connection closed")
        if frames:
            version, text_mode = self.version, self.text_mode
            if len(frames) == 1:
                transport.write(serialize(frames[0], version, text_mode=text_mode))
            else:
                transport.write(b"".join([serialize(f, version, text_mode=text_mode) for f in frames]))
            assert self._loop is not None
            self._last_tx = self._loop.time()

    @property
    def paused(self) -> bool:
        """The transport's buffer is over its high-water mark (:meth:`drain` would wait)."""
        return self._drained is not None

    async def drain(self) -> None:
        """Wait while the send buffer is over its high-water mark (errors: the loss is reported)."""
        drained = self._drained
        if drained is not None:
            await asyncio.shield(drained)

    def _pause(self) -> None:
        if self._drained is None and self._loop is not None:
            self._drained = self._loop.create_future()

    def _resume(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    # -- reading (the protocol's callbacks) ---------------------------------------------

    def _received(self, data: bytes | memoryview) -> None:
        """A chunk read (a view of the protocol's buffer: copied, never kept)."""
        if self._lost or self._closing:
            return
        handshake = self._handshake
        if handshake is not None:  # the handshake: to the session until CONNECTED
            if handshake.done():  # CONNECTED is in, open() has not taken it yet
                if data:
                    self._early = [*(self._early or ()), bytes(data)]
                return
            session = self._session
            assert session is not None
            try:
                terms = session.feed(bytes(data))
            except BaseException as exc:  # e.g. an ERROR instead of CONNECTED: open() raises it
                handshake.set_exception(exc)
                return
            if terms is not None:
                handshake.set_result(terms)
            return
        assert self._loop is not None
        self._last_rx = self._loop.time()
        parser = self._parser
        try:
            if data:
                parser.feed(data)
            while (event := parser.next_event()) is not NEED_DATA:
                if isinstance(event, Frame):
                    try:
                        self._on_frame(self, event)
                    except Exception:  # the handler's bug: logged, the link goes on
                        log.exception("%s: frame handler failed on %s", self.address, event.command)
                    if self._lost or self._closing:
                        return
        except RemoteProtocolError as exc:
            self.kill(ReadError(f"{self.address}: protocol error from the broker: {exc}"))

    def _ended(self, exc: BaseException | None) -> None:
        """End of stream (``exc`` None) or a lost connection."""
        self._resume()  # a drain in progress returns: the loss is reported instead
        if self._closing:
            return
        handshake = self._handshake
        if handshake is not None:
            if not handshake.done():  # open() raises it (before any answer: ConnectRefused)
                session = self._session
                handshake.set_exception(
                    ConnectionClosed(f"{self.address}: connection closed during the STOMP handshake") if session is None
                    else session.closed(None if exc is None else str(exc) or type(exc).__name__))
            elif self._early_end is None:  # CONNECTED is in: reported once open() returned
                self._early_end = (exc,)
            return
        if exc is None:
            self.kill(ConnectionClosed(f"{self.address}: connection closed by the broker"))
        else:
            self.kill(ConnectionClosed(f"{self.address}: connection lost: {exc}"))

    def _arm_deadline(self, delay: float) -> None:
        assert self._loop is not None
        self._deadline_timer = self._loop.call_later(delay, self._check_deadline, self._loop.time())

    def _check_deadline(self, armed_at: float) -> None:
        """The read deadline timer: half-open when nothing came since it was armed (two
        intervals after the last byte, or the initial grace); else re-armed for two
        intervals after the last byte."""
        self._deadline_timer = None
        if self._lost or self._closing:
            return
        assert self._loop is not None
        now = self._loop.time()
        left = 2 * self._expect_every - (now - self._last_rx)
        if self._last_rx <= armed_at or left <= 0:
            self.kill(HeartbeatTimeout(f"{self.address}: no data from the broker for {now - self._last_rx:.3f} s "
                                       "(2 heart-beat intervals): connection is half-open"))
            return
        self._arm_deadline(left)

    async def _beat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self.alive and self._transport is not None:
            await asyncio.sleep(self._send_every / 2)
            if self.alive and loop.time() - self._last_tx >= self._send_every * 0.8:
                self._transport.write(HEARTBEAT_BYTES)
                self._last_tx = loop.time()

    def _stop(self) -> None:
        """Stop the timer and the tasks and close the transport."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        if self._transport is not None:
            self._transport.close()
        self._resume()

    def kill(self, error: TransportError) -> None:
        """The link is lost: report it once, close the stream."""
        if self._lost or self._closing:
            return
        self._lost = True
        self._stop()
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
        transport = self._transport
        if disconnect and transport is not None and not self._lost and not transport.is_closing():
            transport.write(serialize(Frame.make("DISCONNECT", {}), self.version))
        self._closing = True
        self._stop()


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
    """True when a bare TCP connect to ``leaf`` succeeds within ``timeout`` and the peer
    does not close it at once (``probe.tcp_probe``'s rule; nothing is written)."""
    try:
        async with asyncio.timeout(max(timeout, 0.05)):
            reader, writer = await asyncio.open_connection(leaf.host, leaf.port)
    except (OSError, TimeoutError):
        return False
    try:
        async with asyncio.timeout(settle_time(timeout)):
            return await reader.read(1) != b""
    except TimeoutError:
        return True
    except OSError:
        return False
    finally:
        writer.close()
