"""The STOMP frame handlers: one :class:`BrokerConnection` per client connection.

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

A connection is three parts, one module each: :mod:`.stream` (the socket: reading,
buffered output, back-pressure, heart-beats), :mod:`.flow` (producer flow control)
and this one (what each frame means). They are composed, not inherited (uvicorn's
protocol owning its h11 connection is the model): :class:`BrokerConnection` is the
asyncio protocol; it owns a :class:`~.stream.StompStream` (``stream``), hands it the
socket's events and writes through it, and a :class:`~.flow.FlowGate` (``flow``),
to which the stream's frames go first. Each part sees the connection only through
its seam (:class:`~.stream.StreamHost`, :class:`~.flow.FlowHost`). The connection is
given a :class:`~.context.BrokerContext`, never the server.

Receipts. Every RECEIPT (SEND, SUBSCRIBE, UNSUBSCRIBE, BEGIN, COMMIT, ABORT, ACK/NACK,
DISCONNECT) is written from a journal completion callback: a frame that wrote records
(a persistent SEND, a COMMIT, an ACK of persistent messages, a durable SUBSCRIBE or
UNSUBSCRIBE) once they are fsynced, any other frame once everything written before it
is (:meth:`~..dispatch.registry.Registry.done`). So a receipt proves that the frame and every
frame before it on the connection are durable, and on a replicated master every
receipt passes the same replication gate and stall check (:mod:`..ha.replication`): a
master that was frozen and replaced receipts nothing, a client's receipted barrier
(trackMessages) proves its earlier fire-and-forget sends are on both disks. Only the
CONNECT receipt is immediate (the HA node refuses CONNECT while suspect).
"""

from __future__ import annotations

import asyncio
import logging

from amqtransport.destinations import QUEUE, QUEUE_PREFIX, wildcard_segments
from amqtransport.errors import RemoteProtocolError
from amqtransport.selector import Selector
from amqtransport.stomp import (
    IDEMPOTENCY_HEADER_ALIASES,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat_header,
)
from amqtransport.stomp import Frame as StompFrame
from amqtransport.stomp.encoders import connected_frame

from ..authorization import READ, WRITE
from ..dispatch.browse import browse
from ..dispatch.errors import BadHeader, CoreError
from ..dispatch.message import TRANSPORT_HEADERS, Message
from ..dispatch.model import Subscription, TxState
from ..dispatch.names import split_destination
from ..store import JournalError
from .context import BrokerContext
from .delivery import browse_end_frame, message_frame
from .flow import FlowGate
from .stream import ErrorSent, StompStream
from .subscribe import BadSubscribe, subscribe_options
from .temporary import TempNames

__all__ = ["BrokerConnection"]

log = logging.getLogger(__name__)

SERVER_NAME = "amqtransport/0.1"
STATUS_REQUEST_HEADER = "amq-ha-status"  # CONNECT header of `amq broker status` (also HA's STATUS_HEADER)


class BrokerConnection(asyncio.Protocol):
    """A client of the broker: the frame handlers, and the :class:`~.model.Sink` the core
    delivers to. It is the asyncio protocol of its socket and is made of two parts: the
    socket, :attr:`stream` (:class:`~.stream.StompStream`, to which it hands the socket's
    events and through which it writes), and its producer flow control, :attr:`flow`
    (:class:`~.flow.FlowGate`). It is the stream's :class:`~.stream.StreamHost` and the
    gate's :class:`~.flow.FlowHost`."""

    def __init__(self, ctx: BrokerContext[BrokerConnection]) -> None:
        self.config = ctx.config
        self.loop = ctx.loop
        self.stream = StompStream(ctx.config, ctx.loop, self)
        self.core = ctx.core
        self.flow = FlowGate(self, ctx.core)
        self.ctx = ctx
        self.login: str | None = None
        self.client_id: str | None = None
        self.session = ""
        self.subs: dict[str, Subscription] = {}
        self.txs: dict[str, TxState] = {}
        self.messages_out = 0
        self.temps = TempNames(ctx.core, lambda: self.session)  # its temporary destinations (temporary.py)

    # ------------------------------------------------------------------ asyncio: to the stream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.stream.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.stream.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stream.connection_lost(exc)

    def pause_writing(self) -> None:
        self.stream.pause_writing()

    def resume_writing(self) -> None:
        self.stream.resume_writing()

    # ------------------------------------------------------------------ what the server and console see

    @property
    def peer(self) -> str:
        return self.stream.peer

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.stream.transport

    @property
    def version(self) -> str:
        return self.stream.version

    @property
    def connected(self) -> bool:
        return self.stream.connected

    @property
    def closing(self) -> bool:
        return self.stream.closing

    @property
    def opened_at(self) -> float:
        return self.stream.opened_at

    @property
    def frames_in(self) -> int:
        return self.stream.frames_in

    @property
    def over_websocket(self) -> bool:
        return self.stream.over_websocket

    @property
    def writable(self) -> bool:
        return self.stream.writable

    def refuse(self, reason: str) -> None:
        """The broker closes this connection (an ERROR frame naming ``reason``)."""
        self.stream.refuse(reason)

    def close_by_admin(self, reason: str) -> None:
        """An operator closed this connection (the HTTP console): one ERROR frame naming
        ``reason``, then close; its subscriptions' unacked messages are redelivered."""
        self.stream.close_by_admin(reason)

    def fence(self, reason: str) -> None:
        """The broker stops serving (:meth:`BrokerServer.fence`): say why and close."""
        self.stream.fence(reason)

    def detach(self) -> asyncio.Transport | None:
        """Hand this socket over to a :class:`~.context.ConnectHook` (the HA node answers
        its status and role requests itself): the connection stops its timer and its
        reading, leaves the broker's list of connections and gives back its transport,
        which it no longer touches (None: it is closed already)."""
        transport = self.stream.detach()
        if transport is not None:
            self.ctx.unregister(self)
        return transport

    # ------------------------------------------------------------------ the stream's host (StreamHost)

    def on_open(self) -> bool:
        refused = self.ctx.register(self)
        if refused is not None:
            log.warning("refusing connection from %s: %s", self.peer, refused)
            self.stream.error_no_raise(refused)
            return False
        return True

    def on_close(self) -> None:
        for tx in self.txs.values():
            self.core.transactions.abort(tx)
        self.txs.clear()
        self.flow.release()
        for sub in list(self.subs.values()):
            self.core.unsubscribe(sub)
        self.subs.clear()
        self.temps.release()
        self.ctx.unregister(self)

    def on_frame(self, frame: StompFrame) -> None:
        self.flow.admit(frame)

    def keep_paused(self) -> bool:
        return self.flow.full()

    def on_preauth(self, delta: int) -> str | None:
        memory = self.core.memory
        memory.hold_preauth(delta)
        budget = self.config.max_unauthenticated_bytes
        if delta > 0 and memory.preauth > budget:
            return (f"too many bytes buffered for connections not logged in yet ({memory.preauth} bytes, "
                    f"max_unauthenticated_bytes={budget}): send a whole CONNECT frame")
        return None

    def on_writable(self) -> None:
        for sub in list(self.subs.values()):
            self.core.capacity_changed(sub)

    # ------------------------------------------------------------------ the gate's host (FlowHost)

    def held_by_transactions(self) -> int:
        """Bytes this connection's open transactions hold in the memory gauge."""
        return sum(tx.size for tx in self.txs.values())

    # ------------------------------------------------------------------ delivery (Sink)

    def deliver(self, sub: Subscription, msg: Message, delivery_count: int) -> None:
        self.stream.write(message_frame(sub.id, msg, self.stream.version, delivery_count, self.temps.wire_name))
        self.messages_out += 1

    # ------------------------------------------------------------------ frames

    def handle(self, frame: StompFrame) -> None:
        cmd = frame.command
        if not self.connected:
            if cmd in ("CONNECT", "STOMP"):
                self._on_connect(frame)
                return
            self.stream.error(f"expected CONNECT or STOMP as the first frame, got {cmd}", receipt=frame.get("receipt"))
        handler = _HANDLERS.get(cmd)
        if handler is None:  # CONNECT twice
            self.stream.error(f"{cmd} received on an established connection", receipt=frame.get("receipt"))
            return
        try:
            handler(self, frame)
        except JournalError as exc:  # the journal failed: this request cannot be persisted
            self.stream.error_no_raise(f"could not persist {cmd}: {exc}; not applied", frame.get("receipt"))
            self.ctx.fence(str(exc))

    def _require(self, frame: StompFrame, name: str) -> str:
        value = frame.get(name)
        if value is None or value == "":
            self.stream.error(f"{frame.command} frame is missing the required '{name}' header", receipt=frame.get("receipt"))
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
            self.stream.use_version("1.2")
            self.stream.error(str(exc))
            return
        self.stream.use_version(version)
        try:
            theirs = parse_heartbeat_header(frame.get("heart-beat"))
        except RemoteProtocolError as exc:
            self.stream.error(str(exc))
            return
        login = frame.get("login")
        if not self.ctx.authenticate(login, frame.get("passcode")):
            log.warning("authentication failed for login %r from %s", login, self.peer)
            self.stream.error("authentication failed: bad login or passcode")
            return
        client_id = frame.get("client-id")
        if client_id:
            refusal = self.ctx.claim_client_id(self, client_id)
            if refusal is not None:
                log.warning("CONNECT from %s refused: %s", self.peer, refusal)
                self.stream.error(refusal)
                return
        self.login = login
        self.client_id = client_id
        self.stream.authenticated()
        self.session = self.ctx.new_session_id()
        cfg = self.config
        send_ms, expect_ms = negotiate_heartbeat((cfg.heartbeat_send_min_ms, cfg.heartbeat_receive_min_ms), theirs)
        headers = [
            ("version", version),
            ("heart-beat", f"{send_ms},{expect_ms}"),
            ("session", self.session),
            ("server", SERVER_NAME),
        ]
        if self.login:
            headers.append(("user-name", self.login))
        self.stream.write(connected_frame(headers))
        self.stream.start_heartbeats(send_ms / 1000.0, expect_ms / 1000.0)
        receipt = frame.get("receipt")
        if receipt is not None:
            self.stream.write_receipt(receipt)

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
        self.stream.write(connected_frame([("version", "1.2"), ("server", SERVER_NAME), *st.items()]))
        self.stream.close()

    def _authorized(self, destination: str, operation: str, receipt: str | None) -> bool:
        """Whether this connection's user may ``operation`` (read, write) ``destination``
        and, when the broker does not have it yet, create it (admin), as ActiveMQ's
        authorizationPlugin decides (:meth:`~..authorization.Authorizer.refusal`);
        otherwise an ERROR in ActiveMQ's words, and the connection stays."""
        authz = self.ctx.authorizer
        if not authz.active:
            return True
        refusal = authz.refusal(self.login, operation, destination, self._known)
        if refusal is None:
            return True
        log.warning("%s (connection %s)", refusal, self.peer)
        self.stream.error(refusal, receipt=receipt, close=False)
        return False

    def _known(self, kind: str, name: str) -> bool:
        """The broker has this destination already (a send or subscription creates it)."""
        return (QUEUE_PREFIX + name) in self.core.queues if kind == QUEUE else name in self.core.topics

    def _on_send(self, frame: StompFrame) -> None:
        destination = self._require(frame, "destination")
        receipt = frame.get("receipt")
        if not self._authorized(destination, WRITE, receipt):
            return
        try:
            destination, temporary = self.temps.resolve(destination, reading=False)
        except CoreError as exc:
            self.stream.error(str(exc), receipt=receipt, close=False)
            return
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
            elif k == "reply-to":
                headers.append((k, self.temps.reply_to(v)))  # as ActiveMQ: /remote-temp-queue/ID:...
            else:
                if not key and k in IDEMPOTENCY_HEADER_ALIASES:
                    key = v
                headers.append((k, v))
        persistent = persistent and not temporary  # a temporary destination has no store
        if tx_id is not None:
            tx = self.txs.get(tx_id)
            if tx is None:
                self.stream.error(f"SEND names transaction {tx_id!r}, which was not begun", receipt=receipt)
                return
            try:
                self.core.transactions.tx_send(tx, destination, tuple(headers), frame.body, persistent=persistent, key=key)
            except CoreError as exc:
                self.stream.error(str(exc), receipt=receipt, close=not isinstance(exc, BadHeader))
                return
            self._receipt_when_durable(receipt, "message")
            return
        callback = self.stream.receipt_callback(receipt, "message") if (receipt is not None or persistent) else None
        tracer = self.ctx.tracer
        if tracer is not None and callback is not None:
            callback = tracer.traced(callback, headers, destination, persistent)  # type: ignore[arg-type]
        try:
            self.core.send(
                destination,
                tuple(headers),
                frame.body,
                persistent=persistent,
                key=key,
                callback=callback,  # type: ignore[arg-type]
                origin=self.session,
            )
        except CoreError as exc:
            self.stream.error(str(exc), receipt=receipt, close=not isinstance(exc, BadHeader))

    def _on_subscribe(self, frame: StompFrame) -> None:
        destination = self._require(frame, "destination")
        receipt = frame.get("receipt")
        if not self._authorized(destination, READ, receipt):
            return
        try:
            destination = self.temps.resolve(destination, reading=True)[0]
        except CoreError as exc:
            self.stream.error(str(exc), receipt=receipt, close=False)
            return
        sub_id = frame.get("id")
        if sub_id is None:
            if self.stream.version != "1.0":
                self.stream.error("SUBSCRIBE frame is missing the required 'id' header", receipt=receipt)
            sub_id = destination
        if sub_id in self.subs:
            self.stream.error(f"subscription id {sub_id!r} is already in use on this connection", receipt=receipt)
        if len(self.subs) >= self.config.max_subscriptions:
            self.stream.error(f"too many subscriptions (max_subscriptions={self.config.max_subscriptions})", receipt=receipt)
        try:
            opts = subscribe_options(frame, self.client_id)
        except BadSubscribe as exc:
            self.stream.error(str(exc), receipt=receipt, close=exc.close)
            return
        if opts.browser:
            self._browse(sub_id, destination, opts.ack, opts.selector, receipt)
            return
        try:
            sub = self.core.subscribe(
                self,
                sub_id,
                destination,
                ack_mode=opts.ack,
                prefetch=opts.prefetch,
                durable_name=opts.durable,
                client_id=opts.client_id,
                selector=opts.selector,
                no_local=self.session if opts.no_local else "",
                owner=self.login or "",
                exclusive=opts.exclusive,
                consumer_priority=opts.consumer_priority,
            )
        except CoreError as exc:
            self.stream.error(str(exc), receipt=receipt)
            return
        self.subs[sub_id] = sub
        self._receipt_when_durable(receipt, "subscription")  # a durable one's record is in the journal

    def _browse(self, sub_id: str, destination: str, ack: str, selector: Selector | None, receipt: str | None) -> None:
        """``browser:true``: the queue's waiting messages, then a ``browser:end`` MESSAGE
        (dispatch/browse.py). Refusals keep the connection, as ActiveMQ's do."""
        if self.stream.version == "1.0":
            self.stream.error("Queue Browser feature only valid for Stomp v1.1+ clients!", receipt=receipt, close=False)
            return
        try:
            kind, name = split_destination(destination)
        except CoreError as exc:
            self.stream.error(str(exc), receipt=receipt, close=False)
            return
        if kind != "queue" or wildcard_segments(name) is not None:
            self.stream.error(f"browser:true is for one queue, not {destination}", receipt=receipt, close=False)
            return
        sub = Subscription(self, sub_id, destination, ack, 1)
        sub.active = False  # never attached: a browser takes nothing
        self.subs[sub_id] = sub
        if receipt is not None:
            self.stream.write_receipt(receipt)
        for msg in browse(self.core, destination, selector):
            self.deliver(sub, msg, max(1, msg.delivery_count))
        self.stream.write(browse_end_frame(sub_id, self.temps.wire_name(destination), self.stream.version))

    def _on_unsubscribe(self, frame: StompFrame) -> None:
        receipt = frame.get("receipt")
        sub_id = frame.get("id")
        if sub_id is None and self.stream.version == "1.0":
            sub_id = frame.get("destination")
        durable = frame.get("activemq.subscriptionName") or frame.get("durable-subscription-name")
        sub = self.subs.pop(sub_id, None) if sub_id is not None else None
        if sub is not None:
            self.core.unsubscribe(sub, destroy_durable=bool(durable))
        elif durable and self.client_id:
            try:
                self.core.destroy_durable(self.client_id, durable, self.login or "")
            except CoreError as exc:
                self.stream.error(str(exc), receipt=receipt)
                return
        elif sub_id is None:
            self.stream.error("UNSUBSCRIBE frame is missing the required 'id' header", receipt=receipt)
        self._receipt_when_durable(receipt, "unsubscription")

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
        if self.stream.version == "1.2":
            msg_id = frame.get("id") or frame.get("message-id")
            if msg_id is None:
                self.stream.error(f"{frame.command} frame is missing the required 'id' header", receipt=receipt)
                return
        else:
            msg_id = self._require(frame, "message-id")
        tx: TxState | None = None
        tx_id = frame.get("transaction")
        if tx_id is not None:
            tx = self.txs.get(tx_id)
            if tx is None:
                self.stream.error(f"{frame.command} names transaction {tx_id!r}, which was not begun", receipt=receipt)
                return
        sub = self._find_sub(frame, msg_id)
        callback = self.stream.receipt_callback(receipt, "acknowledgement") if receipt is not None else None
        if sub is None:
            log.debug("%s for unknown message %s from %s ignored", frame.command, msg_id, self.peer)
            self._receipt_when_durable(receipt, "acknowledgement")
            return
        if nack:
            self.core.acks.nack(sub, msg_id, tx=tx, callback=callback)  # type: ignore[arg-type]
        else:
            self.core.acks.ack(sub, msg_id, tx=tx, callback=callback)  # type: ignore[arg-type]

    def _on_nack(self, frame: StompFrame) -> None:
        if self.stream.version == "1.0":
            self.stream.error("NACK is not part of STOMP 1.0", receipt=frame.get("receipt"))
        self._on_ack(frame, nack=True)

    def _on_begin(self, frame: StompFrame) -> None:
        tx_id = self._require(frame, "transaction")
        receipt = frame.get("receipt")
        if tx_id in self.txs:
            self.stream.error(f"transaction {tx_id!r} is already open", receipt=receipt)
        if len(self.txs) >= self.config.max_transactions:
            self.stream.error(f"too many open transactions (max_transactions={self.config.max_transactions})", receipt=receipt)
        self.txs[tx_id] = TxState(tx_id, origin=self.session)
        self._receipt_when_durable(receipt, "transaction")

    def _on_commit(self, frame: StompFrame) -> None:
        tx_id = self._require(frame, "transaction")
        receipt = frame.get("receipt")
        tx = self.txs.pop(tx_id, None)
        if tx is None:
            self.stream.error(f"COMMIT of transaction {tx_id!r}, which is not open", receipt=receipt)
            return
        try:
            self.core.transactions.commit(tx, self.stream.receipt_callback(receipt, "transaction"))  # type: ignore[arg-type]
        except CoreError as exc:
            self.stream.error(str(exc), receipt=receipt)

    def _on_abort(self, frame: StompFrame) -> None:
        tx_id = self._require(frame, "transaction")
        receipt = frame.get("receipt")
        tx = self.txs.pop(tx_id, None)
        if tx is None:
            self.stream.error(f"ABORT of transaction {tx_id!r}, which is not open", receipt=receipt)
            return
        self.core.transactions.abort(tx)
        self._receipt_when_durable(receipt, "transaction")

    def _on_disconnect(self, frame: StompFrame) -> None:
        receipt = frame.get("receipt")
        self.stream.stop_reading()
        # as ActiveMQ: the consumers go now, not when the socket is gone (a message
        # published meanwhile would be handed to this closing connection)
        for sub in list(self.subs.values()):
            self.core.unsubscribe(sub)
        self.subs.clear()

        def done(_err: BaseException | None) -> None:
            if receipt is not None:
                self.stream.write_receipt(receipt)
            self.stream.close()

        # the receipt promises every earlier frame was processed and persisted (and replicated)
        self.core.done(done)

    def _receipt_when_durable(self, receipt: str | None, what: str) -> None:
        """The RECEIPT of a frame that wrote no record of its own (or whose record, a
        durable subscription's, is queued already): once everything this connection wrote
        before is durable, through the same path -- and, on a replicated master, the same
        gate and stall check -- as every journal completion (see the module docstring)."""
        if receipt is not None:
            self.core.done(self.stream.receipt_callback(receipt, what))  # type: ignore[arg-type]


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
