"""One client socket of the broker: reading, buffered output, back-pressure, heart-beats.

Theory of operation
-------------------
Bytes from the socket go into the shared sans-IO :class:`~amqtransport.stomp.FrameParser`
(``data_received``); each complete frame goes to its host's :meth:`StreamHost.on_frame`
(:class:`~.protocol.BrokerConnection` hands it to its producer flow control,
:class:`~.flow.FlowGate`, which lets it through to the frame handlers or parks it). A
frame that breaks the protocol is answered with one ERROR frame and the connection is
closed.

Composition, not inheritance (as uvicorn's protocol owns its h11 connection): the
asyncio protocol is :class:`~.protocol.BrokerConnection`, which owns one
:class:`StompStream` (``BrokerConnection.stream``) and hands it the socket's events
(``connection_made``, ``data_received``, ``connection_lost``, ``pause_writing``,
``resume_writing``). The stream knows nothing of the broker: it sees its owner only
through :class:`StreamHost`, the five things it asks of it (the transport is set, a
frame arrived, the socket is gone, output drained, must reading stay paused). The
owner writes, answers and closes through the stream's public methods (:meth:`write`,
:meth:`error`, :meth:`write_receipt`, :meth:`receipt_callback`, :meth:`close`, ...).

Output. Frames are appended to an outgoing list and written with one
``transport.write`` per loop iteration (``call_soon``), so a burst of receipts
completed by one journal batch costs one syscall. MESSAGE frames are built from a
per-message cached header block (escaped once per STOMP version, shared by every
subscription a topic message fans out to) plus the per-delivery headers.

Back-pressure. While the transport's buffer is above its high-water mark (or our
own unflushed output is), the connection is not *writable*: the core stops
dispatching to its subscriptions and we stop reading from the socket, so a client
that does not read cannot make the broker buffer without bound; more than
``max_pending_frames`` frames held for it closes the connection.

Liveness while paused. With reading paused the broker cannot see a client's
heart-beats. When it paused because of its own flow control, the silence is its own
doing and does not count. When it paused because the client does not read what the
broker writes (its socket is full), the client counts as alive only while it drains
those bytes: one that drained nothing for its heart-beat grace period is dropped like a
silent one, so a dead consumer (a hung process, a frozen VM, a vanished host) gives its
prefetched messages back instead of holding them until TCP gives up.

Heart-beats: a timer per connection sends an EOL when we have written nothing for the
negotiated interval and drops the client when nothing arrived for
``interval * heartbeat_grace``.

Before CONNECTED. Until the client has logged in, a frame may be at most
``max_connect_frame_size`` bytes (64 KiB; then ``max_frame_size``), it must come within
``connect_timeout_ms``, and at most ``max_unauthenticated`` connections may be in that
state (a new one closes the one waiting longest): what peers that never log in make the broker hold is
bounded by ``max_unauthenticated`` x ``max_connect_frame_size`` (plus one socket read
each), and they cannot take every ``max_connections`` slot. The bytes such a connection
has buffered (a partial frame) are counted (:meth:`StreamHost.on_preauth`: the broker
adds them to its memory usage, so to ``memory_limit``) and their total across
connections is bounded by ``max_unauthenticated_bytes``: the connection whose bytes
would pass it is refused with an ERROR naming the limit. At any time a frame that
has been arriving for ``frame_timeout_ms`` (while we read) drops its client, so a
logged-in peer cannot hold a large partial frame for ever either.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import struct
import sys
import termios
import time
from typing import Protocol

from amqtransport.errors import RemoteProtocolError
from amqtransport.stomp import (
    BROKER_STOPPED_HEADER,
    CLIENT_COMMANDS,
    CONNECTION_ENDED_HEADER,
    IN_DOUBT_HEADER,
    FrameParser,
    Limits,
    NeedData,
)
from amqtransport.stomp import Frame as StompFrame
from amqtransport.stomp.encoders import error_frame, receipt_frame

from ..config import BrokerConfig
from ..store import RECEIPT_PATH, after_completions, leave_turn_to_writer

__all__ = ["ErrorSent", "IN_DOUBT_HEADER", "StompStream", "StreamHost"]

log = logging.getLogger(__name__)

#: ERROR header of a request whose outcome is unknown (its record failed after being queued)
#: ioctl giving the bytes in a socket's send queue (SIOCOUTQ is TIOCOUTQ on Linux; None
#: elsewhere: then only asyncio's buffer is watched)
_SIOCOUTQ: int | None = getattr(termios, "TIOCOUTQ", None) if sys.platform.startswith("linux") else None


class ErrorSent(Exception):
    """Raised inside frame handling once an ERROR frame is written: stop processing, the
    connection is closing."""


class StreamHost(Protocol):
    """What a :class:`StompStream` asks of the connection that owns it."""

    def on_open(self) -> bool:
        """The transport is set: False refuses the client (the host wrote an ERROR)."""
        ...

    def on_frame(self, frame: StompFrame) -> None:
        """A complete frame arrived."""
        ...

    def on_close(self) -> None:
        """The connection is gone: give back what it held."""
        ...

    def on_writable(self) -> None:
        """Output drained after a subscription was refused for lack of room: offer it again."""
        ...

    def on_preauth(self, delta: int) -> str | None:
        """``delta`` more (or fewer) bytes of a partial frame buffered before login;
        a reason refuses the connection."""

    def keep_paused(self) -> bool:
        """True while reading must stay paused for the host's own reasons."""
        ...


class StompStream:
    """One client socket: reading into the parser, buffered output, back-pressure, heart-beats.

    Knows nothing of the broker: its :class:`StreamHost` says what a frame means
    (:meth:`StreamHost.on_frame`); the host hands it the asyncio protocol's events."""

    def __init__(self, config: BrokerConfig, loop: asyncio.AbstractEventLoop, host: StreamHost) -> None:
        self.config = config
        self.loop = loop
        self.host = host
        cfg = self.config
        self._limits = Limits(
            max_frame_size=cfg.max_frame_size,
            max_headers=cfg.max_headers,
            max_header_line=cfg.max_header_line,
        )
        # until CONNECTED: a small frame, so a peer that never logs in holds little
        preauth = min(cfg.max_connect_frame_size, cfg.max_frame_size)
        self.parser = FrameParser(
            "1.2",
            Limits(
                max_frame_size=preauth,
                max_headers=cfg.max_headers,
                max_header_line=min(cfg.max_header_line, preauth),
            ),
            commands=CLIENT_COMMANDS,
        )
        self.version = "1.2"
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.connected = False
        self.closing = False
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._out_frames = 0
        self._flush_scheduled = False
        self._paused = False  # transport above its high-water mark
        self._blocked = False  # a subscription was refused for lack of room
        self._reading_paused = False
        self._stop_reading = False  # after DISCONNECT: ignore further input
        self._close_scheduled = False
        self._paused_buffer = 0  # transport buffer bytes at the last heart-beat tick while paused
        self.last_read = 0.0
        self.last_write = 0.0
        self.hb_send = 0.0
        self.hb_expect = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._frame_timer: asyncio.TimerHandle | None = None  # a frame has started arriving
        self._frame_mark = 0  # frames_in when _frame_timer was armed
        self.frames_in = 0
        self.unreceipted = 0  # receipt callbacks made and not run yet (receipt_callback)
        self._preauth_held = 0  # bytes of a partial frame buffered before CONNECTED (counted: _preauth)
        self.opened_at = 0.0  # loop.time() of connection_made
        #: the client came through the WebSocket port (connection/websocket.py), not plain TCP
        self.over_websocket = False

    # ------------------------------------------------------------------ the session

    def use_version(self, version: str) -> None:
        """Frames are written, and read, in STOMP ``version`` from now on."""
        self.version = version
        self.parser.version = version

    def authenticated(self) -> None:
        """The client logged in: frames may now be as large as ``max_frame_size``."""
        self.connected = True
        self.parser.limits = self._limits
        self._hold_preauth(0)

    def _hold_preauth(self, n: int) -> str | None:
        """This connection, not logged in, now buffers ``n`` bytes (0: none any more);
        the host counts the change (:meth:`StreamHost.on_preauth`) and may refuse it (the reason)."""
        delta = n - self._preauth_held
        if not delta:
            return None
        self._preauth_held = n
        return self.host.on_preauth(delta)

    def start_heartbeats(self, send: float, expect: float) -> None:
        """CONNECTED is written: the connect timer stops, heart-beats (seconds; 0 none) start."""
        self.hb_send = send
        self.hb_expect = expect
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.hb_send or self.hb_expect:
            self._schedule_hb()

    def stop_reading(self) -> None:
        """After DISCONNECT: further input is ignored, the socket is no longer read."""
        self._stop_reading = True
        self.pause_reading()

    @property
    def write_paused(self) -> bool:
        """The transport is above its high-water mark (the peer does not read)."""
        return self._paused

    # ------------------------------------------------------------------ asyncio (the host's events)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.over_websocket = transport.get_extra_info("websocket") is not None
        transport.set_write_buffer_limits(high=self.config.write_buffer_high)
        now = self.loop.time()
        self.last_read = self.last_write = now
        self.opened_at = now
        if not self.host.on_open():
            return
        self._timer = self.loop.call_later(self.config.connect_timeout_ms / 1000.0, self._connect_timeout)

    def data_received(self, data: bytes) -> None:
        if self.closing or self._stop_reading:
            return
        self.last_read = self.loop.time()
        parser = self.parser
        started = time.perf_counter()
        try:
            parser.feed(data)
            while not self.closing and not self._stop_reading:
                event = parser.next_event()
                if isinstance(event, StompFrame):
                    self.frames_in += 1
                    self.host.on_frame(event)
                elif isinstance(event, NeedData):
                    break
                # a Heartbeat needs nothing: last_read is updated already
            if not self.connected and not self.closing:
                refused = self._hold_preauth(parser.pending_bytes)
                if refused is not None:
                    log.warning("client %s refused before login: %s", self.peer, refused)
                    self.error_no_raise(refused)
                    return
            if parser.in_frame:
                if self._frame_timer is None and not self.closing:
                    self._frame_mark = self.frames_in
                    self._frame_timer = self.loop.call_later(self.config.frame_timeout_ms / 1000.0, self._frame_late)
            elif self._frame_timer is not None:
                self._frame_timer.cancel()
                self._frame_timer = None
        except RemoteProtocolError as exc:
            log.info("client %s sent invalid STOMP: %s", self.peer, exc)
            self.error_no_raise(f"malformed frame: {exc}")
        except ErrorSent:
            pass
        except Exception as exc:  # noqa: BLE001 - one bad frame must not take the broker down
            log.exception("internal error handling a frame from %s", self.peer)
            self.error_no_raise(f"internal broker error: {exc.__class__.__name__}: {exc}")
        RECEIPT_PATH.read.observe(time.perf_counter() - started)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._frame_timer is not None:
            self._frame_timer.cancel()
            self._frame_timer = None
        self._hold_preauth(0)
        self.host.on_close()
        self._out.clear()
        log.debug("connection %s closed (%s)", self.peer, exc or "clean")

    def pause_writing(self) -> None:
        self._paused = True
        self._paused_buffer = self._unsent()
        self.pause_reading()

    def _unsent(self) -> int:
        """Bytes written but not yet taken by the peer: asyncio's buffer plus the kernel's
        send queue (Linux ``SIOCOUTQ``: it shrinks only as the peer acknowledges data;
        the kernel reports the socket writable only once a large part of it has gone, so
        asyncio's buffer alone can stand still for seconds under a live reader)."""
        transport = self.transport
        if transport is None:
            return 0
        size = transport.get_write_buffer_size()
        sock = transport.get_extra_info("socket")
        if sock is not None and _SIOCOUTQ is not None:
            with contextlib.suppress(OSError, ValueError):
                size += struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0]
        return size

    def resume_writing(self) -> None:
        self._paused = False
        self._flush()
        if not self._paused:
            self.resume_reading()
            self._wake()

    # ------------------------------------------------------------------ output

    @property
    def writable(self) -> bool:
        if self._paused or self._out_bytes >= self.config.write_buffer_high or self.closing:
            self._blocked = True
            return False
        return True

    def write(self, data: bytes) -> None:
        if self.closing or self.transport is None:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        self._out_frames += 1
        if self._paused and self._out_frames > self.config.max_pending_frames:
            log.warning("client %s is not reading: %d frames pending, disconnecting", self.peer, self._out_frames)
            self.abort()
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            if not after_completions(self._flush):  # a lone completion's RECEIPT: written at once
                self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.transport is None or not self._out or self._paused:
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        self._out_bytes = 0
        self._out_frames = 0
        self.last_write = self.loop.time()
        self.transport.write(data)
        if not self._paused and self._blocked:
            self._wake()

    def _wake(self) -> None:
        if not self._blocked or self.closing:
            return
        self._blocked = False
        self.host.on_writable()

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.closing:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.host.keep_paused() or self._stop_reading:
            return
        if self._reading_paused and self.transport is not None and not self.closing:
            self._reading_paused = False
            self.transport.resume_reading()

    def refuse(self, reason: str) -> None:
        """The broker closes this connection (an ERROR frame naming ``reason``)."""
        self.error_no_raise(reason, ended=True)

    def close_by_admin(self, reason: str) -> None:
        """An operator closed this connection (the HTTP console): one ERROR frame naming
        ``reason``, then close; its subscriptions' unacked messages are redelivered."""
        self.error_no_raise(reason, ended=True)

    def close(self) -> None:
        """Flush what is queued, then close."""
        if self.transport is None:
            return
        self._flush_now()
        self.closing = True
        self.transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def _flush_now(self) -> None:
        if self._out and self.transport is not None:
            data = b"".join(self._out)
            self._out.clear()
            self._out_bytes = 0
            self._out_frames = 0
            self.transport.write(data)

    def error(
        self,
        message: str,
        *,
        receipt: str | None = None,
        detail: str = "",
        close: bool = True,
        in_doubt: bool = False,
        stopped: bool = False,
        ended: bool = False,
    ) -> None:
        if self.transport is None or self.closing:
            return
        flags: tuple[tuple[str, str], ...] = ((IN_DOUBT_HEADER, "true"),) if in_doubt else ()
        if stopped:
            flags += ((BROKER_STOPPED_HEADER, "true"),)
        if ended:  # about the connection, not a frame: a failover must not take it as a refusal
            flags += ((CONNECTION_ENDED_HEADER, "true"),)
        self.write(
            error_frame(
                message,
                self.version,
                receipt_id=receipt,
                headers=flags,
                body=detail.encode("utf-8") if detail else None,
            )
        )
        if close:
            self.close()
            raise ErrorSent()

    def error_no_raise(self, message: str, receipt: str | None = None, *, stopped: bool = False,
                       ended: bool = False) -> None:
        try:
            self.error(message, receipt=receipt, stopped=stopped, ended=ended)
        except ErrorSent:
            pass

    def write_receipt(self, receipt: str) -> None:
        self.write(receipt_frame(receipt, self.version))

    def receipt_callback(self, receipt: str | None, what: str) -> object:
        if receipt is None:
            leave_turn_to_writer()  # nobody waits for it: its fsync must not block the loop

            def on_error_only(err: BaseException | None) -> None:
                if err is not None:
                    self._persist_failed(what, err, None)

            return on_error_only

        parsed = time.perf_counter()
        if self.unreceipted:  # a pipelined producer: the journal's writer overlaps its fsync with our parsing
            leave_turn_to_writer()
        self.unreceipted += 1

        def done(err: BaseException | None) -> None:
            self.unreceipted -= 1
            if err is not None:
                self._persist_failed(what, err, receipt)
            else:
                self.write_receipt(receipt)
                RECEIPT_PATH.total.observe(time.perf_counter() - parsed)

        return done

    def _persist_failed(self, what: str, err: BaseException, receipt: str | None) -> None:
        """An ERROR for one request whose record was not made durable; the connection
        closes once the completions of the same journal batch have run, so that each of
        its failed requests gets its own ERROR (with its ``receipt-id``).

        The outcome is unknown, and the ERROR says so (header ``amq-in-doubt:true``): the
        record was queued, so its messages may already have been delivered (dispatch
        runs alongside the write), a slave may have received it, and a record wholly
        written but not synced may survive a restart. Resending with the same
        idempotency key is safe."""
        if self.closing or self.transport is None:
            return
        self.error(
            f"could not persist {what}: {err}; outcome unknown (it may have been delivered or kept: "
            "resend with the same idempotency key)",
            receipt=receipt,
            close=False,
            in_doubt=True,
        )
        self._stop_reading = True
        if not self._close_scheduled:
            self._close_scheduled = True
            self.loop.call_soon(self.close)

    def fence(self, reason: str) -> None:
        """The broker stops serving (:meth:`BrokerServer.fence`): say why and close (a
        connection whose requests failed has had their ERRORs and is closing already)."""
        if not self._close_scheduled:
            self.error_no_raise(f"broker stopped accepting messages: {reason}", stopped=True)

    def detach(self) -> asyncio.Transport | None:
        """Stop handling this socket (its timer, its reading) and give back its
        transport, which this connection no longer touches (None: it is closed already)."""
        transport = self.transport
        if transport is None:
            return None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stop_reading = True
        self.closing = True
        self.transport = None
        return transport

    # ------------------------------------------------------------------ timers

    def _connect_timeout(self) -> None:
        self._timer = None
        if not self.connected and not self.closing:
            log.info("client %s sent no CONNECT within %d ms", self.peer, self.config.connect_timeout_ms)
            self.error_no_raise(f"no CONNECT frame within {self.config.connect_timeout_ms} ms")

    def _frame_late(self) -> None:
        """A frame has been arriving for ``frame_timeout_ms``: unless frames were completed
        meanwhile (the one arriving now started later) or we stopped reading (our flow
        control, not the client's slowness), the client is dropped."""
        self._frame_timer = None
        if self.closing or not self.parser.in_frame:
            return
        if self.frames_in != self._frame_mark or self._reading_paused:
            self._frame_mark = self.frames_in
            self._frame_timer = self.loop.call_later(self.config.frame_timeout_ms / 1000.0, self._frame_late)
            return
        log.info("client %s did not finish a frame within %d ms (%d bytes so far)", self.peer,
                 self.config.frame_timeout_ms, self.parser.pending_bytes)
        self.error_no_raise(f"a frame not finished within frame_timeout_ms={self.config.frame_timeout_ms}")

    def _schedule_hb(self) -> None:
        periods = [p for p in (self.hb_send, self.hb_expect) if p > 0]
        tick = max(0.02, min(periods) / 2.0)
        self._timer = self.loop.call_later(tick, self._hb_tick)

    def _hb_tick(self) -> None:
        self._timer = None
        if self.closing or self.transport is None:
            return
        now = self.loop.time()
        if self._reading_paused:
            if self._paused:
                # paused because the peer does not read what we write: we cannot see its
                # heart-beats, but a live peer drains our bytes; one that drained nothing
                # for the whole grace period is as silent as a peer that sends nothing
                size = self._unsent()
                if size < self._paused_buffer:
                    self.last_read = now
                self._paused_buffer = size
            else:
                self.last_read = now  # we stopped reading (flow control): silence is ours, not theirs
        if self.hb_expect and now - self.last_read > self.hb_expect * self.config.heartbeat_grace:
            log.info(
                "client %s silent for %.1f s (heart-beat %d ms%s): dropping it",
                self.peer,
                now - self.last_read,
                int(self.hb_expect * 1000),
                ", and not reading" if self._paused else "",
            )
            if self._paused:
                self.abort()  # an ERROR could never reach it: its socket is full
            else:
                self.error_no_raise(f"heart-beat timeout: nothing received for {now - self.last_read:.1f} s", ended=True)
            return
        if self.hb_send and now - self.last_write >= self.hb_send * 0.9 and not self._out:
            if self._paused:
                pass  # the socket is full anyway; the client sees traffic
            else:
                self.last_write = now
                assert self.transport is not None
                self.transport.write(b"\n")
        self._schedule_hb()
