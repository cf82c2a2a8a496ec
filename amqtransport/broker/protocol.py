"""The STOMP connection handler: one asyncio ``Protocol`` per client connection.

Theory of operation
-------------------
Bytes from the socket go into the shared sans-IO :class:`~amqtransport.stomp.FrameParser`
(``data_received``); each complete frame is dispatched on its command to a
``_on_<command>`` method that validates it and calls the :class:`~.core.BrokerCore`.
The first frame must be CONNECT or STOMP: it negotiates the version (1.0/1.1/1.2;
the parser's unescaping follows it), the heart-beats and, when the broker has users,
authenticates. Every problem -- a parser error (garbage, a broken limit), a bad
header, a refused login -- is answered with one ERROR frame whose ``message`` header
says what was wrong (plus ``receipt-id`` when the frame asked for a receipt) and the
connection is closed, as STOMP requires; other connections never notice.

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

Producer flow control. Before a SEND (or a COMMIT with sends) is processed the
core's :class:`~.memory.MemoryGauge` is asked whether memory is over its limit (for
all destinations, or for this one). If it is, the frame is *parked* in this
connection's ``_held`` list -- no receipt, nothing enqueued -- and every later frame
joins it, in order, except ACK and NACK, which are processed at once: they only free
memory, and a connection that both produces and consumes would otherwise deadlock
with its own acks stuck behind its parked SENDs. We keep reading (so those acks and
heart-beats get through) until the parked frames pass ``write_buffer_high`` bytes or
``max_pending_frames`` frames; then the socket is paused and TCP back-pressure blocks
the producer. (We chose "keep reading, park SENDs" over "pause connections whose last
frame was a SEND" because the latter cannot see an ack queued behind a send.) When
the gauge releases (usage down to the low-water mark) the connection is woken via
``call_soon`` and replays its parked frames until one must wait again. The limit on
what a parked connection may buffer means a client that writes more than that many
SENDs ahead of its own acks can still stall itself -- ActiveMQ has the same caveat
and the same advice: produce and consume on separate connections. With
``send_fail_if_no_space`` a SEND that would wait gets an ERROR naming the limit
instead (and, as after every ERROR, the connection is closed).

Liveness while paused. With reading paused the broker cannot see a client's
heart-beats. When it paused because of its own flow control, the silence is its own
doing and does not count. When it paused because the client does not read what the
broker writes (its socket is full), the client counts as alive only while it drains
those bytes: one that drained nothing for its heart-beat grace period is dropped like a
silent one, so a dead consumer (a hung process, a frozen VM, a vanished host) gives its
prefetched messages back instead of holding them until TCP gives up.

Receipts. A RECEIPT for a persistent SEND (or a COMMIT, an ACK of persistent
messages, a DISCONNECT) is written from the store's completion callback, i.e. only
once the journal has fsynced the record. Heart-beats: a timer per connection sends
an EOL when we have written nothing for the negotiated interval and drops the
client when nothing arrived for ``interval * heartbeat_grace``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import struct
import sys
import termios
from collections import deque

from amqtransport.errors import RemoteProtocolError
from amqtransport.stomp import (
    CLIENT_COMMANDS,
    IDEMPOTENCY_HEADER_ALIASES,
    FrameParser,
    Limits,
    NeedData,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat_header,
)
from amqtransport.stomp import Frame as StompFrame
from amqtransport.stomp.encoders import (
    DELIVERY_COUNT_HEADER,
    connected_frame,
    error_frame,
    message_headers,
    message_start,
    receipt_frame,
)

from .config import BrokerConfig
from .context import BrokerContext
from .core import BrokerCore
from .errors import CoreError
from .message import TRANSPORT_HEADERS, Message
from .model import AUTO, Subscription, TxState
from .names import DURABLE_PREFIX
from .store import JournalError

__all__ = ["BrokerConnection", "FlowControlled", "StompStream", "IN_DOUBT_HEADER"]

log = logging.getLogger(__name__)

SERVER_NAME = "amqtransport/0.1"
#: ERROR header of a request whose outcome is unknown (its record failed after being queued)
IN_DOUBT_HEADER = "amq-in-doubt"
STATUS_REQUEST_HEADER = "amq-ha-status"  # CONNECT header of `amq broker status` (also HA's STATUS_HEADER)
#: ioctl giving the bytes in a socket's send queue (SIOCOUTQ is TIOCOUTQ on Linux; None
#: elsewhere: then only asyncio's buffer is watched)
_SIOCOUTQ: int | None = getattr(termios, "TIOCOUTQ", None) if sys.platform.startswith("linux") else None
_DELIVERY_HEADERS = frozenset({"subscription", "ack", "redelivered", DELIVERY_COUNT_HEADER, "message-id"})


class ErrorSent(Exception):
    """Raised inside frame handling once an ERROR frame is written: stop processing, the
    connection is closing."""


class StompStream(asyncio.Protocol):
    """One client socket: reading into the parser, buffered output, back-pressure, heart-beats.

    Knows nothing of the broker: a subclass says what a frame means (:meth:`_admit`)."""

    def __init__(self, config: BrokerConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        cfg = self.config
        self.parser = FrameParser(
            "1.2",
            Limits(
                max_frame_size=cfg.max_frame_size,
                max_headers=cfg.max_headers,
                max_header_line=cfg.max_header_line,
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
        self.frames_in = 0
        self.opened_at = 0.0  # loop.time() of connection_made

    # ------------------------------------------------------------------ what a subclass adds
    def _opened(self) -> bool:
        """The transport is set: False refuses the client (the subclass wrote an ERROR)."""
        return True

    def _admit(self, frame: StompFrame) -> None:
        """A complete frame arrived."""
        raise NotImplementedError

    def _released(self) -> None:
        """The connection is gone: give back what it held."""

    def _on_writable(self) -> None:
        """Output drained after a subscription was refused for lack of room: offer it again."""

    def _keep_paused(self) -> bool:
        """True while reading must stay paused for the subclass's own reasons."""
        return False

    # ------------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        transport.set_write_buffer_limits(high=self.config.write_buffer_high)
        now = self.loop.time()
        self.last_read = self.last_write = now
        self.opened_at = now
        if not self._opened():
            return
        self._timer = self.loop.call_later(self.config.connect_timeout_ms / 1000.0, self._connect_timeout)

    def data_received(self, data: bytes) -> None:
        if self.closing or self._stop_reading:
            return
        self.last_read = self.loop.time()
        parser = self.parser
        try:
            parser.feed(data)
            while not self.closing and not self._stop_reading:
                event = parser.next_event()
                if isinstance(event, StompFrame):
                    self.frames_in += 1
                    self._admit(event)
                elif isinstance(event, NeedData):
                    break
                # a Heartbeat needs nothing: last_read is updated already
        except RemoteProtocolError as exc:
            log.info("client %s sent invalid STOMP: %s", self.peer, exc)
            self._error_no_raise(f"malformed frame: {exc}")
        except ErrorSent:
            pass
        except Exception as exc:  # noqa: BLE001 - one bad frame must not take the broker down
            log.exception("internal error handling a frame from %s", self.peer)
            self._error_no_raise(f"internal broker error: {exc.__class__.__name__}: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._released()
        self._out.clear()
        log.debug("connection %s closed (%s)", self.peer, exc or "clean")

    def pause_writing(self) -> None:
        self._paused = True
        self._paused_buffer = self._unsent()
        self._pause_reading()

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
            self._resume_reading()
            self._wake()

    # ------------------------------------------------------------------ output

    @property
    def writable(self) -> bool:
        if self._paused or self._out_bytes >= self.config.write_buffer_high or self.closing:
            self._blocked = True
            return False
        return True

    def _write(self, data: bytes) -> None:
        if self.closing or self.transport is None:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        self._out_frames += 1
        if self._paused and self._out_frames > self.config.max_pending_frames:
            log.warning("client %s is not reading: %d frames pending, disconnecting", self.peer, self._out_frames)
            self._abort()
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
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
        self._on_writable()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.closing:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._keep_paused() or self._stop_reading:
            return
        if self._reading_paused and self.transport is not None and not self.closing:
            self._reading_paused = False
            self.transport.resume_reading()

    def close_by_admin(self, reason: str) -> None:
        """An operator closed this connection (the HTTP console): one ERROR frame naming
        ``reason``, then close; its subscriptions' unacked messages are redelivered."""
        self._error_no_raise(reason)

    def _close(self) -> None:
        """Flush what is queued, then close."""
        if self.transport is None:
            return
        self._flush_now()
        self.closing = True
        self.transport.close()

    def _abort(self) -> None:
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

    def _error(
        self,
        message: str,
        *,
        receipt: str | None = None,
        detail: str = "",
        close: bool = True,
        in_doubt: bool = False,
    ) -> None:
        if self.transport is None or self.closing:
            return
        self._write(
            error_frame(
                message,
                self.version,
                receipt_id=receipt,
                headers=((IN_DOUBT_HEADER, "true"),) if in_doubt else (),
                body=detail.encode("utf-8") if detail else None,
            )
        )
        if close:
            self._close()
            raise ErrorSent()

    def _error_no_raise(self, message: str, receipt: str | None = None) -> None:
        try:
            self._error(message, receipt=receipt)
        except ErrorSent:
            pass

    def _receipt(self, receipt: str) -> None:
        self._write(receipt_frame(receipt, self.version))

    def _receipt_callback(self, receipt: str | None, what: str) -> object:
        if receipt is None:

            def on_error_only(err: BaseException | None) -> None:
                if err is not None:
                    self._persist_failed(what, err, None)

            return on_error_only

        def done(err: BaseException | None) -> None:
            if err is not None:
                self._persist_failed(what, err, receipt)
            else:
                self._receipt(receipt)

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
        self._error(
            f"could not persist {what}: {err}; outcome unknown (it may have been delivered or kept: "
            "resend with the same idempotency key)",
            receipt=receipt,
            close=False,
            in_doubt=True,
        )
        self._stop_reading = True
        if not self._close_scheduled:
            self._close_scheduled = True
            self.loop.call_soon(self._close)

    def fence(self, reason: str) -> None:
        """The broker stops serving (:meth:`BrokerServer.fence`): say why and close (a
        connection whose requests failed has had their ERRORs and is closing already)."""
        if not self._close_scheduled:
            self._error_no_raise(f"broker stopped accepting messages: {reason}")

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
            self._error_no_raise(f"no CONNECT frame within {self.config.connect_timeout_ms} ms")

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
                self._abort()  # an ERROR could never reach it: its socket is full
            else:
                self._error_no_raise(f"heart-beat timeout: nothing received for {now - self.last_read:.1f} s")
            return
        if self.hb_send and now - self.last_write >= self.hb_send * 0.9 and not self._out:
            if self._paused:
                pass  # the socket is full anyway; the client sees traffic
            else:
                self.last_write = now
                assert self.transport is not None
                self.transport.write(b"\n")
        self._schedule_hb()


class FlowControlled(StompStream):
    """Producer flow control: SENDs parked while memory (or the store) is over its limit."""

    def __init__(self, config: BrokerConfig, loop: asyncio.AbstractEventLoop, core: BrokerCore) -> None:
        super().__init__(config, loop)
        self.core = core
        self._held: deque[tuple[StompFrame, int]] = deque()  # frames parked by flow control
        self._held_bytes = 0
        self._held_wake_scheduled = False

    def _handle(self, frame: StompFrame) -> None:
        """Process a frame (it may go ahead)."""
        raise NotImplementedError

    def _held_by_transactions(self) -> int:
        """Bytes this connection's open transactions hold in the memory gauge."""
        return 0

    def _released(self) -> None:
        self._held.clear()
        self._held_bytes = 0
        self.core.memory.remove_waiter(id(self))
        super()._released()

    def _keep_paused(self) -> bool:
        return self._hold_full() or super()._keep_paused()

    def _admit(self, frame: StompFrame) -> None:
        """Process a frame now, or park it while producer flow control holds this connection."""
        if self._held:
            if frame.command in ("ACK", "NACK"):
                self._handle(frame)  # acks free memory: never behind a parked SEND
            else:
                self._hold(frame)
            return
        if self.connected and self._must_wait(frame):
            if self.config.send_fail_if_no_space:
                self._error(self._no_space_message(frame), receipt=frame.get("receipt"))
            held = self._held_by_transactions()
            if held:
                # it would wait for memory its own open transaction may be holding
                self._error(
                    f"{self._no_space_message(frame, refused=False)}; this connection's open transactions "
                    f"hold {held} bytes, so it cannot wait: send refused, transactions rolled back",
                    receipt=frame.get("receipt"),
                )
            self._hold(frame)
            return
        self._handle(frame)

    def _must_wait(self, frame: StompFrame) -> bool:
        """A SEND waits while memory is over its limit, a persistent one also while the
        store is (a COMMIT never does: its bytes are counted already, from the moment
        each of its SENDs arrived)."""
        if frame.command != "SEND":
            return False
        if self.core.memory.blocked(frame.get("destination")):
            return True
        store = self.core.store
        return store is not None and store.full and (frame.get("persistent") or "").lower() == "true"

    def _no_space_message(self, frame: StompFrame, *, refused: bool = True) -> str:
        memory = self.core.memory
        tail = "; send refused (send_fail_if_no_space)" if refused else ""
        store = self.core.store
        dest = frame.get("destination") or "(transaction)"
        if not memory.blocked(dest) and store is not None and store.full:
            return (
                f"producer flow control: broker store limit reached ({store.journal.size} bytes of "
                f"journal, store_limit={store.limit}){tail}"
            )
        if memory.full:
            return (
                f"producer flow control: broker memory limit reached "
                f"({memory.usage} bytes in use, memory_limit={memory.limit}){tail}"
            )
        return (
            f"producer flow control: destination {dest} is over its memory limit "
            f"(destination_memory_limit={memory.destination_limit}){tail}"
        )

    def _hold(self, frame: StompFrame) -> None:
        size = len(frame.body) + 64
        for k, v in frame.headers:
            size += len(k) + len(v)
        self._held.append((frame, size))
        self._held_bytes += size
        memory = self.core.memory
        memory.add_waiter(id(self), self._flow_wake)
        self.core.start_expiry_sweep(self.loop.call_later)
        if self._hold_full():
            self._pause_reading()

    def _hold_full(self) -> bool:
        return self._held_bytes > self.config.write_buffer_high or len(self._held) > self.config.max_pending_frames

    def _flow_wake(self) -> None:
        """Called by the gauge when memory was released (inside dispatch: defer)."""
        if not self._held_wake_scheduled and not self.closing:
            self._held_wake_scheduled = True
            self.loop.call_soon(self._replay_held)

    def _replay_held(self) -> None:
        self._held_wake_scheduled = False
        held = self._held
        try:
            while held and not self.closing:
                frame, size = held[0]
                if frame.command not in ("ACK", "NACK") and self._must_wait(frame):
                    return  # still full: stay registered, wait for the next release
                held.popleft()
                self._held_bytes -= size
                self._handle(frame)
        except ErrorSent:
            return
        except Exception as exc:  # noqa: BLE001 - as in data_received
            log.exception("internal error handling a parked frame from %s", self.peer)
            self._error_no_raise(f"internal broker error: {exc.__class__.__name__}: {exc}")
            return
        finally:
            if not held:
                self._held_bytes = 0
                self.core.memory.remove_waiter(id(self))
            if not self._paused and not self.closing:
                self._resume_reading()  # no-op while the parked frames are still over their bound


class BrokerConnection(FlowControlled):
    """A client of the broker: the frame handlers, and the :class:`~.model.Sink` the core delivers to."""

    def __init__(self, ctx: BrokerContext[BrokerConnection]) -> None:
        super().__init__(ctx.config, ctx.loop, ctx.core)
        self.ctx = ctx
        self.login: str | None = None
        self.client_id: str | None = None
        self.session = ""
        self.subs: dict[str, Subscription] = {}
        self.txs: dict[str, TxState] = {}
        self.messages_out = 0

    def _opened(self) -> bool:
        if not self.ctx.register(self):
            log.warning("refusing connection from %s: max_connections=%d reached", self.peer, self.config.max_connections)
            self._error_no_raise(f"too many connections (max_connections={self.config.max_connections})")
            return False
        return True

    def _released(self) -> None:
        for tx in self.txs.values():
            self.core.transactions.abort(tx)
        self.txs.clear()
        super()._released()
        for sub in list(self.subs.values()):
            self.core.unsubscribe(sub)
        self.subs.clear()
        self.ctx.unregister(self)

    def _on_writable(self) -> None:
        for sub in list(self.subs.values()):
            self.core.capacity_changed(sub)

    def _held_by_transactions(self) -> int:
        return sum(tx.size for tx in self.txs.values())

    def detach(self) -> asyncio.Transport | None:
        """Hand this socket over to a :class:`~.context.ConnectHook` (the HA node answers
        its status and role requests itself): the connection stops its timer and its
        reading, leaves the broker's list of connections and gives back its transport,
        which it no longer touches (None: it is closed already)."""
        transport = super().detach()
        if transport is not None:
            self.ctx.unregister(self)
        return transport

    # ------------------------------------------------------------------ delivery (Sink)

    def deliver(self, sub: Subscription, msg: Message, delivery_count: int) -> None:
        v = self.version
        cache = msg.wire_cache
        if not isinstance(cache, dict):
            cache = msg.wire_cache = {}
        common = cache.get(v)
        if common is None:
            common = cache[v] = self._common_block(msg, v)
        head = message_start(sub.id, msg.id if v == "1.2" else None, v, delivery_count)
        self._write(head + common + msg.body + b"\x00")
        self.messages_out += 1

    def _common_block(self, msg: Message, v: str) -> bytes:
        dest = msg.destination
        user = msg.headers
        if dest.startswith(DURABLE_PREFIX):
            for k, val in user:
                if k == "destination":
                    dest = val
                    break
        headers = [("message-id", msg.id), ("destination", dest)]
        has_ts = False
        for k, val in user:
            if k in _DELIVERY_HEADERS or k == "destination" or k == "content-length":
                continue
            if k == "timestamp":
                has_ts = True
            headers.append((k, val))
        if not has_ts:
            headers.append(("timestamp", str(int(msg.timestamp * 1000))))
        return message_headers(headers, len(msg.body), v)

    # ------------------------------------------------------------------ frames

    def _handle(self, frame: StompFrame) -> None:
        cmd = frame.command
        if not self.connected:
            if cmd in ("CONNECT", "STOMP"):
                self._on_connect(frame)
                return
            self._error(f"expected CONNECT or STOMP as the first frame, got {cmd}", receipt=frame.get("receipt"))
        handler = _HANDLERS.get(cmd)
        if handler is None:  # CONNECT twice
            self._error(f"{cmd} received on an established connection", receipt=frame.get("receipt"))
            return
        try:
            handler(self, frame)
        except JournalError as exc:  # the journal failed: this request cannot be persisted
            self._error_no_raise(f"could not persist {cmd}: {exc}; not applied", frame.get("receipt"))
            self.ctx.fence(str(exc))

    def _require(self, frame: StompFrame, name: str) -> str:
        value = frame.get(name)
        if value is None or value == "":
            self._error(f"{frame.command} frame is missing the required '{name}' header", receipt=frame.get("receipt"))
            raise ErrorSent()
        return value

    def _on_connect(self, frame: StompFrame) -> None:
        hook = self.ctx.connect_hook  # an HA node: status requests, replication links
        if hook is not None and hook.intercept_connect(self, frame):
            return
        if hook is None and frame.get(STATUS_REQUEST_HEADER) is not None:
            self._answer_status(frame)  # a plain broker answers `amq broker status` too
            return
        try:
            version = negotiate_version(frame.get("accept-version"))
        except RemoteProtocolError as exc:
            self.version = "1.2"
            self._error(str(exc))
            return
        self.version = version
        self.parser.version = version
        try:
            theirs = parse_heartbeat_header(frame.get("heart-beat"))
        except RemoteProtocolError as exc:
            self._error(str(exc))
            return
        login = frame.get("login")
        if not self.ctx.authenticate(login, frame.get("passcode")):
            log.warning("authentication failed for login %r from %s", login, self.peer)
            self._error("authentication failed: bad login or passcode")
            return
        self.login = login
        self.client_id = frame.get("client-id")
        self.connected = True
        self.session = self.ctx.new_session_id()
        cfg = self.config
        send_ms, expect_ms = negotiate_heartbeat((cfg.heartbeat_send_min_ms, cfg.heartbeat_receive_min_ms), theirs)
        self.hb_send = send_ms / 1000.0
        self.hb_expect = expect_ms / 1000.0
        headers = [
            ("version", version),
            ("heart-beat", f"{send_ms},{expect_ms}"),
            ("session", self.session),
            ("server", SERVER_NAME),
        ]
        if self.login:
            headers.append(("user-name", self.login))
        self._write(connected_frame(headers))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.hb_send or self.hb_expect:
            self._schedule_hb()
        receipt = frame.get("receipt")
        if receipt is not None:
            self._receipt(receipt)

    def _answer_status(self, frame: StompFrame) -> None:
        """One CONNECTED frame of ``amq-ha-*`` status headers (role ``standalone``), then close.

        Like an HA node's status answer it needs no login: it reveals counters, never
        message contents, and the connection is closed right after it. When the broker
        has users, queue names (``amq-ha-depths``) are only given to a valid login.
        """
        self.ctx.unregister(self)  # not counted among the connections it reports
        st = self.ctx.status_headers()
        if "amq-ha-depths" in st and not self.ctx.authenticate(frame.get("login"), frame.get("passcode")):
            st.pop("amq-ha-depths")
            st.pop("amq-ha-depths-omitted", None)
        self._write(connected_frame([("version", "1.2"), ("server", SERVER_NAME), *st.items()]))
        self._close()

    def _on_send(self, frame: StompFrame) -> None:
        destination = self._require(frame, "destination")
        receipt = frame.get("receipt")
        persistent = False
        key = ""
        tx_id: str | None = None
        headers: list[tuple[str, str]] = []
        seen: set[str] = set()
        for k, v in frame.headers:
            if k in seen:
                continue  # 1.2: the first occurrence wins
            seen.add(k)
            if k == "transaction":
                tx_id = v
            elif k == "persistent":
                persistent = v.lower() == "true"
                headers.append((k, v))
            elif k in TRANSPORT_HEADERS:
                continue
            else:
                if not key and k in IDEMPOTENCY_HEADER_ALIASES:
                    key = v
                headers.append((k, v))
        if tx_id is not None:
            tx = self.txs.get(tx_id)
            if tx is None:
                self._error(f"SEND names transaction {tx_id!r}, which was not begun", receipt=receipt)
                return
            try:
                self.core.transactions.tx_send(tx, destination, tuple(headers), frame.body, persistent=persistent, key=key)
            except CoreError as exc:
                self._error(str(exc), receipt=receipt)
                return
            if receipt is not None:
                self._receipt(receipt)
            return
        callback = self._receipt_callback(receipt, "message") if (receipt is not None or persistent) else None
        try:
            self.core.send(
                destination,
                tuple(headers),
                frame.body,
                persistent=persistent,
                key=key,
                callback=callback,  # type: ignore[arg-type]
            )
        except CoreError as exc:
            self._error(str(exc), receipt=receipt)

    def _on_subscribe(self, frame: StompFrame) -> None:
        destination = self._require(frame, "destination")
        receipt = frame.get("receipt")
        sub_id = frame.get("id")
        if sub_id is None:
            if self.version != "1.0":
                self._error("SUBSCRIBE frame is missing the required 'id' header", receipt=receipt)
            sub_id = destination
        if sub_id in self.subs:
            self._error(f"subscription id {sub_id!r} is already in use on this connection", receipt=receipt)
        if len(self.subs) >= self.config.max_subscriptions:
            self._error(f"too many subscriptions (max_subscriptions={self.config.max_subscriptions})", receipt=receipt)
        ack = frame.get("ack") or AUTO
        prefetch_text = frame.get("activemq.prefetchSize")
        prefetch: int | None = None
        if prefetch_text is not None:
            try:
                prefetch = int(prefetch_text)
                if prefetch < 1:
                    raise ValueError
            except ValueError:
                self._error(f"activemq.prefetchSize must be a positive integer, got {prefetch_text!r}", receipt=receipt)
        durable = frame.get("activemq.subscriptionName") or frame.get("durable-subscription-name")
        client_id = frame.get("client-id") or self.client_id
        try:
            sub = self.core.subscribe(
                self,
                sub_id,
                destination,
                ack_mode=ack,
                prefetch=prefetch,
                durable_name=durable,
                client_id=client_id,
            )
        except CoreError as exc:
            self._error(str(exc), receipt=receipt)
            return
        self.subs[sub_id] = sub
        if receipt is not None:
            self._receipt(receipt)

    def _on_unsubscribe(self, frame: StompFrame) -> None:
        receipt = frame.get("receipt")
        sub_id = frame.get("id")
        if sub_id is None and self.version == "1.0":
            sub_id = frame.get("destination")
        durable = frame.get("activemq.subscriptionName") or frame.get("durable-subscription-name")
        sub = self.subs.pop(sub_id, None) if sub_id is not None else None
        if sub is not None:
            self.core.unsubscribe(sub, destroy_durable=bool(durable))
        elif durable and self.client_id:
            self.core.destroy_durable(self.client_id, durable)
        elif sub_id is None:
            self._error("UNSUBSCRIBE frame is missing the required 'id' header", receipt=receipt)
        if receipt is not None:
            self._receipt(receipt)

    def _find_sub(self, frame: StompFrame, msg_id: str) -> Subscription | None:
        sub_id = frame.get("subscription")
        if sub_id is not None:
            return self.subs.get(sub_id)
        for sub in self.subs.values():
            if msg_id in sub.unacked:
                return sub
        return None

    def _on_ack(self, frame: StompFrame, nack: bool = False) -> None:
        receipt = frame.get("receipt")
        if self.version == "1.2":
            msg_id = frame.get("id") or frame.get("message-id")
            if msg_id is None:
                self._error(f"{frame.command} frame is missing the required 'id' header", receipt=receipt)
                return
        else:
            msg_id = self._require(frame, "message-id")
        tx: TxState | None = None
        tx_id = frame.get("transaction")
        if tx_id is not None:
            tx = self.txs.get(tx_id)
            if tx is None:
                self._error(f"{frame.command} names transaction {tx_id!r}, which was not begun", receipt=receipt)
                return
        sub = self._find_sub(frame, msg_id)
        callback = self._receipt_callback(receipt, "acknowledgement") if receipt is not None else None
        if sub is None:
            log.debug("%s for unknown message %s from %s ignored", frame.command, msg_id, self.peer)
            if receipt is not None:
                self._receipt(receipt)
            return
        if nack:
            self.core.acks.nack(sub, msg_id, tx=tx, callback=callback)  # type: ignore[arg-type]
        else:
            self.core.acks.ack(sub, msg_id, tx=tx, callback=callback)  # type: ignore[arg-type]

    def _on_nack(self, frame: StompFrame) -> None:
        if self.version == "1.0":
            self._error("NACK is not part of STOMP 1.0", receipt=frame.get("receipt"))
        self._on_ack(frame, nack=True)

    def _on_begin(self, frame: StompFrame) -> None:
        tx_id = self._require(frame, "transaction")
        receipt = frame.get("receipt")
        if tx_id in self.txs:
            self._error(f"transaction {tx_id!r} is already open", receipt=receipt)
        if len(self.txs) >= self.config.max_transactions:
            self._error(f"too many open transactions (max_transactions={self.config.max_transactions})", receipt=receipt)
        self.txs[tx_id] = TxState(tx_id)
        if receipt is not None:
            self._receipt(receipt)

    def _on_commit(self, frame: StompFrame) -> None:
        tx_id = self._require(frame, "transaction")
        receipt = frame.get("receipt")
        tx = self.txs.pop(tx_id, None)
        if tx is None:
            self._error(f"COMMIT of transaction {tx_id!r}, which is not open", receipt=receipt)
            return
        try:
            self.core.transactions.commit(tx, self._receipt_callback(receipt, "transaction"))  # type: ignore[arg-type]
        except CoreError as exc:
            self._error(str(exc), receipt=receipt)

    def _on_abort(self, frame: StompFrame) -> None:
        tx_id = self._require(frame, "transaction")
        receipt = frame.get("receipt")
        tx = self.txs.pop(tx_id, None)
        if tx is None:
            self._error(f"ABORT of transaction {tx_id!r}, which is not open", receipt=receipt)
            return
        self.core.transactions.abort(tx)
        if receipt is not None:
            self._receipt(receipt)

    def _on_disconnect(self, frame: StompFrame) -> None:
        receipt = frame.get("receipt")
        self._stop_reading = True
        self._pause_reading()

        def done(_err: BaseException | None) -> None:
            if receipt is not None:
                self._receipt(receipt)
            self._close()

        # the receipt promises every earlier frame was processed (and persisted)
        if self.core.store is not None:
            self.core.store.journal.on_durable(done)
        else:
            done(None)


_HANDLERS = {
    "SEND": BrokerConnection._on_send,
    "SUBSCRIBE": BrokerConnection._on_subscribe,
    "UNSUBSCRIBE": BrokerConnection._on_unsubscribe,
    "ACK": BrokerConnection._on_ack,
    "NACK": BrokerConnection._on_nack,
    "BEGIN": BrokerConnection._on_begin,
    "COMMIT": BrokerConnection._on_commit,
    "ABORT": BrokerConnection._on_abort,
    "DISCONNECT": BrokerConnection._on_disconnect,
}
