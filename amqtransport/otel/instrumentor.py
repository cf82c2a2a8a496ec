"""The instrumentor: wraps the clients' public methods from outside, as the
OpenTelemetry contrib instrumentors do, and turns each call into spans and metrics.
The wrappers have contrib's ``wrapper(wrapped, instance, args, kwargs)`` shape but are
installed as plain functions (each original kept for ``uninstrument()``), not as
``wrapt`` proxies: a proxy's bound-method object on every ``producer.send`` cost more
than the whole no-SDK path (``benchmarks/bench_otel.py``).

Theory of operation
-------------------
``instrument()`` wraps, on both clients (``_sync.connection``, generated from
``aio.connection``, which ``client`` re-exports; and ``aio.connection``):

* the sends (``Connection.send``, ``Producer.send``, ``Transaction.send`` and their
  asyncio twins): a PRODUCER span ``send {destination}`` made current around the call
  (its parent: the current span, or the ``traceparent`` the caller put in the headers),
  so the shared frame builder ``outbound.send_frame`` -- wrapped where each client
  module bound it -- injects the current context into the SEND's headers as W3C
  ``traceparent``/``tracestate``/``baggage``. ``Connection.send`` returns once the
  receipt is in, so its span covers the broker's answer; a pipelined producer's span
  ends when its frame is written (the receipt comes later);
* ``Subscription.receive`` (iteration goes through it): a CLIENT span ``receive
  {destination}`` from the call to the message, linked to the producer's context
  extracted from the message's headers (only when a message came);
* ``ReceivedMessage.process()`` (``received.Processing``): a CONSUMER span ``process
  {destination}`` whose parent is the producer's context (one trace from producer to
  consumer) for the block's duration; the settlement it makes is its child;
* ``ack``/``nack``/``ack_many``: CLIENT spans of operation type ``settle``.

**Failover.** The first time a connection is seen, a listener is added to it (the
transports' public ``add_listener``): ``on_interrupted`` and ``on_resumed`` become
span events (``amqtransport.failover.interrupted``/``reconnected``) on every span of
that connection still in flight. A send is *replayed* when the link it was written on
was lost before its receipt: it was sent while connected and ends on a later link
generation (``transport.generation``). Its span then carries
``amqtransport.send.replayed = true`` and an event of that name with the lost and the
new server, and ``server.address``/``server.port`` name the node that served it.

**Cost.** With a no-op tracer and meter (``opentelemetry-api`` without an SDK) a send
costs one check that nothing would record (the ProxyTracer's delegate, the proxy
meter's real meter) and a look at the current context (empty: nothing to inject): no
span is started, no attribute computed, no context attached. ``uninstrument()`` puts every
original back; the listeners already added stay but do nothing.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping
from contextvars import ContextVar
from types import TracebackType
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined,unused-ignore]
from opentelemetry.metrics import Meter, NoOpMeter, get_meter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from amqtransport import __version__
from amqtransport.otel import attributes as A
from amqtransport.otel.package import _instruments
from amqtransport.received import Processing, ReceivedMessage
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame

__all__ = ["AmqtransportInstrumentor"]

_SYNC = "amqtransport._sync.connection"  # the generated sync client (client.py re-exports it)
_AIO = "amqtransport.aio.connection"
_RECEIVED = "amqtransport.received"
_SENDS = ("Connection.send", "Producer.send", "Transaction.send")
_ASYNC_SENDS = ("AsyncConnection.send", "AsyncProducer.send", "AsyncTransaction.send")

#: the send being made in this context (the frame builder's wrapper names its message id)
_CURRENT_SEND: ContextVar[_Op | None] = ContextVar("amqtransport_otel_send", default=None)


class _Op:
    """One traced operation in flight."""

    __slots__ = ("span", "t0", "conn", "gen0", "addr0", "connected0", "name", "otype", "dest", "token", "watch")

    def __init__(self, span: Span, conn: Any, name: str, otype: str, dest: str | None) -> None:
        self.span = span
        self.t0 = time.perf_counter()
        self.conn = conn
        self.name = name
        self.otype = otype
        self.dest = dest
        self.gen0 = conn.transport.generation
        self.addr0: str | None = conn.connected_uri
        self.connected0: bool = conn.is_connected
        self.token: object = None
        self.watch: _Watch | None = None


class _Watch:
    """The failover listener of one connection: its events go on the spans in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inflight: dict[int, _Op] = {}
        self.active = True

    def add(self, op: _Op) -> None:
        with self.lock:
            self.inflight[id(op)] = op

    def done(self, op: _Op) -> None:
        with self.lock:
            self.inflight.pop(id(op), None)

    def _spans(self) -> list[_Op]:
        with self.lock:
            return list(self.inflight.values())

    def on_interrupted(self, error: BaseException) -> None:
        if not self.active:
            return
        for op in self._spans():
            attrs: dict[str, Any] = {A.ERROR_TYPE: type(error).__qualname__}
            if op.addr0:
                attrs[A.LOST_SERVER] = op.addr0
            op.span.add_event(A.EVENT_INTERRUPTED, attrs)

    def on_resumed(self, address: str) -> None:
        if not self.active:
            return
        for op in self._spans():
            op.span.add_event(A.EVENT_RECONNECTED, {A.NEW_SERVER: address})


def _arg(args: tuple[Any, ...], kwargs: Mapping[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


class _Telemetry:
    """The tracer, the instruments and the span rules, shared by every wrapper."""

    def __init__(self, tracer: trace.Tracer, meter: Meter) -> None:
        self.tracer = tracer
        #: a proxy of the global provider (no meter_provider given) records nothing until
        #: an SDK provider is set globally: checked per operation until then
        self._proxy = type(meter).__name__ == "_ProxyMeter"
        self._metrics = not isinstance(meter, NoOpMeter) and not self._proxy
        self._meter = meter
        self.duration = meter.create_histogram(
            "messaging.client.operation.duration", unit="s",
            description="Duration of a messaging operation initiated by a producer or consumer client.")
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", unit="{message}",
            description="Number of messages producer attempted to send to the broker.")
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", unit="{message}",
            description="Number of messages that were delivered to the application.")
        self.process_duration = meter.create_histogram(
            "messaging.process.duration", unit="s", description="Duration of processing operation.")
        self.watches: weakref.WeakKeyDictionary[Any, _Watch] = weakref.WeakKeyDictionary()
        self.watch_lock = threading.Lock()

    @property
    def tracing_on(self) -> bool:
        """Could a span record anything (False: a no-op tracer, or the global proxy
        while no SDK provider is set)? An attribute read or two: it is asked per send."""
        real = getattr(self.tracer, "_tracer", self.tracer)  # a ProxyTracer's current delegate
        return not isinstance(real, trace.NoOpTracer)

    @property
    def on(self) -> bool:
        """Would a span or a metric record anything? (The wrappers' fast path.)"""
        return self.tracing_on or self.metrics_on

    @property
    def metrics_on(self) -> bool:
        """Would a metric record anything?"""
        if self._proxy and not self._metrics:
            real = getattr(self._meter, "_real_meter", None)  # set once an SDK provider is global
            self._metrics = real is not None and not isinstance(real, NoOpMeter)
        return self._metrics

    def watch(self, conn: Any) -> _Watch:
        w = self.watches.get(conn)
        if w is None:
            with self.watch_lock:
                w = self.watches.get(conn)
                if w is None:
                    w = self.watches[conn] = _Watch()
                    conn.add_listener(w)
        return w

    def close(self) -> None:
        for w in list(self.watches.values()):
            w.active = False

    # -- attributes ---------------------------------------------------------------
    @staticmethod
    def base(conn: Any, name: str, otype: str, dest: str | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {A.SYSTEM: A.messaging_system(conn.dialect), A.OPERATION_NAME: name,
                                 A.OPERATION_TYPE: otype}
        if dest:
            attrs[A.DESTINATION] = dest
        return attrs

    @staticmethod
    def message_attrs(msg: ReceivedMessage) -> dict[str, Any]:
        attrs: dict[str, Any] = {A.BODY_SIZE: len(msg.body)}
        if msg.message_id:
            attrs[A.MESSAGE_ID] = msg.message_id
        corr = msg.frame.get("correlation-id")
        if corr:
            attrs[A.CONVERSATION_ID] = corr
        return attrs

    def metric_attrs(self, op: _Op, exc: BaseException | None) -> dict[str, Any]:
        attrs = self.base(op.conn, op.name, op.otype, op.dest)
        server = A.server_of(op.conn.connected_uri or op.addr0)
        if server is not None:
            attrs[A.SERVER_ADDRESS], attrs[A.SERVER_PORT] = server
        if exc is not None:
            attrs[A.ERROR_TYPE] = type(exc).__qualname__
        return attrs

    # -- operations -----------------------------------------------------------------
    def begin(self, conn: Any, name: str, otype: str, dest: str | None, kind: SpanKind,
              attrs: Callable[[], dict[str, Any]] | None = None, parent: context.Context | None = None,
              links: list[Link] | None = None) -> _Op | None:
        """Start the span of one operation and make it current; None when neither a
        span nor a metric would record anything."""
        if not self.on:
            return None
        span = self.tracer.start_span(f"{name} {dest}" if dest else name, context=parent, kind=kind, links=links)
        if not span.is_recording():
            if not self.metrics_on:
                return None
        else:
            span.set_attributes(self.base(conn, name, otype, dest))
            if attrs is not None:
                span.set_attributes(attrs())
        op = _Op(span, conn, name, otype, dest)
        op.token = context.attach(trace.set_span_in_context(span))
        op.watch = self.watch(conn)
        op.watch.add(op)
        return op

    def end(self, op: _Op, exc: BaseException | None) -> None:
        span = op.span
        try:
            if op.watch is not None:
                op.watch.done(op)
            if span.is_recording():
                addr1 = op.conn.connected_uri
                if op.otype == "send" and op.connected0 and op.conn.transport.generation != op.gen0:
                    span.set_attribute(A.REPLAYED, True)
                    span.add_event(A.EVENT_REPLAYED, {A.LOST_SERVER: op.addr0 or "", A.NEW_SERVER: addr1 or ""})
                server = A.server_of(addr1 or op.addr0)
                if server is not None:
                    span.set_attributes({A.SERVER_ADDRESS: server[0], A.SERVER_PORT: server[1]})
                if exc is not None:
                    span.set_attribute(A.ERROR_TYPE, type(exc).__qualname__)
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, str(exc)))
            span.end()
            if self.metrics_on:
                attrs = self.metric_attrs(op, exc)
                elapsed = time.perf_counter() - op.t0
                if op.otype == "process":
                    self.process_duration.record(elapsed, attrs)
                else:
                    self.duration.record(elapsed, attrs)
                if op.otype == "send":
                    self.sent.add(1, attrs)
        finally:
            context.detach(op.token)  # type: ignore[arg-type]

    def received(self, conn: Any, sub: Any, msg: ReceivedMessage, t0_ns: int, t0: float) -> None:
        """A receive call that returned ``msg``: its span (linked to the producer's)."""
        if not self.on:
            return
        dest = msg.destination or getattr(sub, "destination", None)
        span = self.tracer.start_span(f"receive {dest}", kind=SpanKind.CLIENT,
                                      start_time=t0_ns, links=self.links_of(msg))
        if span.is_recording():
            span.set_attributes(self.base(conn, "receive", "receive", dest))
            span.set_attributes(self.message_attrs(msg))
            server = A.server_of(conn.connected_uri)
            if server is not None:
                span.set_attributes({A.SERVER_ADDRESS: server[0], A.SERVER_PORT: server[1]})
        span.end()
        if self.metrics_on:
            attrs = self.base(conn, "receive", "receive", dest)
            self.consumed.add(1, attrs)
            self.duration.record(time.perf_counter() - t0, attrs)

    @staticmethod
    def creation_context(msg: ReceivedMessage) -> context.Context:
        """The current context with the producer's span from ``msg``'s headers, if any."""
        return propagate.extract(msg.headers, context=context.get_current())

    def links_of(self, msg: ReceivedMessage) -> list[Link]:
        ctx = trace.get_current_span(self.creation_context(msg)).get_span_context()
        return [Link(ctx)] if ctx.is_valid else []


# -- wrappers -------------------------------------------------------------------------------

def _conn_of(instance: Any) -> Any:
    return getattr(instance, "_conn", instance)


def _send_attrs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    def attrs() -> dict[str, Any]:
        out: dict[str, Any] = {}
        size = A.body_size(_arg(args, kwargs, 1, "body"))
        if size is not None:
            out[A.BODY_SIZE] = size
        headers = _arg(args, kwargs, 2, "headers") or {}
        corr = headers.get("correlation-id")
        if corr:
            out[A.CONVERSATION_ID] = str(corr)
        return out
    return attrs


def _given_context(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> context.Context | None:
    """A send whose headers already carry a ``traceparent`` (a bridge forwarding a
    message, an application relaying one) continues that trace: its span's parent."""
    headers = _arg(args, kwargs, 2, "headers")
    if not headers or "traceparent" not in headers:
        return None
    return propagate.extract({str(k): str(v) for k, v in headers.items()}, context=context.get_current())


def _sync_send(tel: _Telemetry) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not tel.on:
            return wrapped(*args, **kwargs)
        conn = _conn_of(instance)
        op = tel.begin(conn, "send", "send", _arg(args, kwargs, 0, "destination"), SpanKind.PRODUCER,
                       _send_attrs(args, kwargs), parent=_given_context(args, kwargs))
        if op is None:
            return wrapped(*args, **kwargs)
        token = _CURRENT_SEND.set(op)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            _CURRENT_SEND.reset(token)
            tel.end(op, exc)
            raise
        _CURRENT_SEND.reset(token)
        tel.end(op, None)
        return result
    return wrapper


def _async_send(tel: _Telemetry) -> Callable[..., Any]:
    async def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not tel.on:
            return await wrapped(*args, **kwargs)
        conn = _conn_of(instance)
        op = tel.begin(conn, "send", "send", _arg(args, kwargs, 0, "destination"), SpanKind.PRODUCER,
                       _send_attrs(args, kwargs), parent=_given_context(args, kwargs))
        if op is None:
            return await wrapped(*args, **kwargs)
        token = _CURRENT_SEND.set(op)
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as exc:
            _CURRENT_SEND.reset(token)
            tel.end(op, exc)
            raise
        _CURRENT_SEND.reset(token)
        tel.end(op, None)
        return result
    return wrapper


def _inject(wrapped: Callable[..., Frame], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Frame:
    """``send_frame``: the frame with the current context in its headers."""
    frame = wrapped(*args, **kwargs)
    if not context.get_current():  # no span, no baggage: nothing to carry (the no-SDK fast path)
        return frame
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if carrier:
        frame = frame.with_headers(carrier)
    op = _CURRENT_SEND.get()
    if op is not None and op.span.is_recording():
        key = frame.get(IDEMPOTENCY_HEADER)
        if key:
            op.span.set_attribute(A.MESSAGE_ID, key)
    return frame


def _sync_receive(tel: _Telemetry) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        t0_ns, t0 = time.time_ns(), time.perf_counter()
        msg = wrapped(*args, **kwargs)
        if msg is not None:
            tel.received(instance._conn, instance, msg, t0_ns, t0)
        return msg
    return wrapper


def _async_receive(tel: _Telemetry) -> Callable[..., Any]:
    async def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        t0_ns, t0 = time.time_ns(), time.perf_counter()
        msg = await wrapped(*args, **kwargs)
        if msg is not None:
            tel.received(instance._conn, instance, msg, t0_ns, t0)
        return msg
    return wrapper


def _settle_op(tel: _Telemetry, msgs: list[Any], name: str) -> _Op | None:
    """The span of an ack/nack of ``msgs`` (None: nothing to settle or nothing to record)."""
    msgs = [m for m in msgs if m.ack_mode != "auto"]
    if not msgs:
        return None
    dests = {m.destination for m in msgs}
    dest = dests.pop() if len(dests) == 1 else None
    first = msgs[0]

    def attrs() -> dict[str, Any]:
        if len(msgs) > 1:
            return {A.BATCH_COUNT: len(msgs)}
        return {A.MESSAGE_ID: first.message_id} if first.message_id else {}
    return tel.begin(first._conn, name, "settle", dest, SpanKind.CLIENT, attrs)


def _sync_settle(tel: _Telemetry, name: str, many: bool) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if many:
            batch = list(_arg(args, kwargs, 0, "messages"))
            args, kwargs = (batch,), {}
        op = _settle_op(tel, batch if many else [instance], name)
        if op is None:
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            tel.end(op, exc)
            raise
        tel.end(op, None)
        return result
    return wrapper


def _async_settle(tel: _Telemetry, name: str, many: bool) -> Callable[..., Any]:
    async def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if many:
            batch = list(_arg(args, kwargs, 0, "messages"))
            args, kwargs = (batch,), {}
        op = _settle_op(tel, batch if many else [instance], name)
        if op is None:
            return await wrapped(*args, **kwargs)
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as exc:
            tel.end(op, exc)
            raise
        tel.end(op, None)
        return result
    return wrapper


class _TracedProcessing:
    """``msg.process()`` with a CONSUMER span around the block (module docstring)."""

    def __init__(self, tel: _Telemetry, inner: Processing) -> None:
        self._tel = tel
        self._inner = inner
        self._op: _Op | None = None

    def _begin(self) -> None:
        msg = self._inner.message
        conn = getattr(msg, "_conn", None)
        if conn is None:
            return
        self._op = self._tel.begin(conn, "process", "process", msg.destination, SpanKind.CONSUMER,
                                   lambda: self._tel.message_attrs(msg),
                                   parent=self._tel.creation_context(msg))

    def _end(self, exc: BaseException | None) -> None:
        if self._op is not None:
            self._tel.end(self._op, exc)

    def __enter__(self) -> ReceivedMessage:
        self._begin()
        return self._inner.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._inner.__exit__(exc_type, exc, tb)
        except BaseException as settle_exc:
            self._end(exc or settle_exc)
            raise
        self._end(exc)

    async def __aenter__(self) -> ReceivedMessage:
        self._begin()
        return await self._inner.__aenter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self._inner.__aexit__(exc_type, exc, tb)
        except BaseException as settle_exc:
            self._end(exc or settle_exc)
            raise
        self._end(exc)


def _process(tel: _Telemetry) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _TracedProcessing(tel, wrapped(*args, **kwargs))
    return wrapper


def _targets(tel: _Telemetry) -> Iterable[tuple[str, str, Callable[..., Any]]]:
    """(module, "Class.method" or function name, wrapper) for every wrapped callable."""
    for name in _SENDS:
        yield _SYNC, name, _sync_send(tel)
    for name in _ASYNC_SENDS:
        yield _AIO, name, _async_send(tel)
    yield _SYNC, "send_frame", _inject
    yield _AIO, "send_frame", _inject
    yield _SYNC, "Subscription.receive", _sync_receive(tel)
    yield _AIO, "AsyncSubscription.receive", _async_receive(tel)
    yield _SYNC, "Message.ack", _sync_settle(tel, "ack", False)
    yield _SYNC, "Message.nack", _sync_settle(tel, "nack", False)
    yield _SYNC, "Connection.ack_many", _sync_settle(tel, "ack", True)
    yield _AIO, "AsyncMessage.ack", _async_settle(tel, "ack", False)
    yield _AIO, "AsyncMessage.nack", _async_settle(tel, "nack", False)
    yield _AIO, "AsyncConnection.ack_many", _async_settle(tel, "ack", True)
    yield _RECEIVED, "ReceivedMessage.process", _process(tel)


def _patched(original: Callable[..., Any], wrapper: Callable[..., Any], method: bool) -> Callable[..., Any]:
    """A plain function calling ``wrapper(wrapped, instance, args, kwargs)``."""
    patched: Callable[..., Any]
    if method and inspect.iscoroutinefunction(original):
        async def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await wrapper(original.__get__(self), self, args, kwargs)
    elif method:
        def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
            return wrapper(original.__get__(self), self, args, kwargs)
    else:
        def patched(*args: Any, **kwargs: Any) -> Any:
            return wrapper(original, None, args, kwargs)
    functools.update_wrapper(patched, original)
    setattr(patched, "__amqtransport_otel__", original)  # noqa: B010 - the original, for uninstrument
    return patched


class AmqtransportInstrumentor(BaseInstrumentor):  # type: ignore[misc,unused-ignore]
    """Traces and meters the amqtransport clients (module docstring, docs/tracing.md).
    ``instrument(tracer_provider=..., meter_provider=...)`` (the global providers
    when not given); ``uninstrument()`` restores every wrapped method."""

    _telemetry: _Telemetry | None = None
    _originals: list[tuple[Any, str, Callable[..., Any]]] = []

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        tracer = trace.get_tracer(__name__, __version__, kwargs.get("tracer_provider"),
                                  schema_url="https://opentelemetry.io/schemas/1.26.0")
        meter = get_meter(__name__, __version__, kwargs.get("meter_provider"),
                          schema_url="https://opentelemetry.io/schemas/1.26.0")
        tel = self._telemetry = _Telemetry(tracer, meter)
        self._originals = []
        for module, name, wrapper in _targets(tel):
            owner_name, _, attr = name.rpartition(".")
            owner: Any = importlib.import_module(module)
            if owner_name:
                owner = getattr(owner, owner_name)
            original = owner.__dict__[attr] if owner_name else getattr(owner, attr)
            self._originals.append((owner, attr, original))
            setattr(owner, attr, _patched(original, wrapper, method=bool(owner_name)))

    def _uninstrument(self, **kwargs: Any) -> None:
        for owner, attr, original in reversed(self._originals):
            if getattr(getattr(owner, attr, None), "__amqtransport_otel__", None) is original:
                setattr(owner, attr, original)
        self._originals = []
        if self._telemetry is not None:
            self._telemetry.close()
            self._telemetry = None
