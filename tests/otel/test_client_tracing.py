"""The client instrumentation (amqtransport/otel/) with the SDK's in-memory exporter,
against our broker on a loopback socket: the spans and their attributes on both
clients, the context carried producer -> consumer in the SEND's headers, the metrics,
``uninstrument()`` restoring every method, and nothing of OpenTelemetry imported by a
client that was never instrumented."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from opentelemetry.trace import SpanKind

import amqtransport
import amqtransport._sync.connection as client_mod
import amqtransport.aio as aio
from amqtransport.broker import EmbeddedBroker
from amqtransport.stomp import IDEMPOTENCY_HEADER

from .conftest import Telemetry

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as b:
        yield b


def uri_of(b: EmbeddedBroker) -> str:
    return f"tcp://127.0.0.1:{b.port}"


def traceparent_of(span: object) -> str:
    ctx = span.get_span_context()  # type: ignore[attr-defined]
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def check_trace(t: Telemetry, dest: str, port: int, received_headers: dict[str, str], key: str) -> None:
    """The spans of one send -> receive -> process -> ack of one message on ``dest``."""
    (send,) = t.named(f"send {dest}")
    (recv,) = t.named(f"receive {dest}")
    (proc,) = t.named(f"process {dest}")
    (ack,) = t.named(f"ack {dest}")
    assert send.kind == SpanKind.PRODUCER and recv.kind == SpanKind.CLIENT
    assert proc.kind == SpanKind.CONSUMER and ack.kind == SpanKind.CLIENT
    a = dict(send.attributes or {})
    assert a["messaging.system"] == "amqtransport"
    assert a["messaging.destination.name"] == dest
    assert a["messaging.operation.name"] == "send" and a["messaging.operation.type"] == "send"
    assert a["messaging.message.id"] == key
    assert a["messaging.message.conversation_id"] == "corr-1"
    assert a["messaging.message.body.size"] == len("héllo".encode())
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == port
    assert "amqtransport.send.replayed" not in a
    # the context crossed the broker in the SEND's headers
    assert received_headers["traceparent"] == traceparent_of(send)
    assert received_headers["baggage"] == "tenant=acme"
    # receive: its own trace position, linked to the producer's span
    assert [lk.context.span_id for lk in recv.links] == [send.context.span_id]
    r = dict(recv.attributes or {})
    assert r["messaging.operation.type"] == "receive" and r["messaging.message.conversation_id"] == "corr-1"
    assert r["messaging.message.id"] and r["server.port"] == port
    # process: a child of the producer's span, one trace from producer to consumer
    assert proc.context.trace_id == send.context.trace_id
    assert proc.parent is not None and proc.parent.span_id == send.context.span_id
    assert dict(proc.attributes or {})["messaging.operation.type"] == "process"
    # the settlement made by process() is inside it
    assert ack.parent is not None and ack.parent.span_id == proc.context.span_id
    assert dict(ack.attributes or {})["messaging.operation.type"] == "settle"
    m = t.metrics()
    assert sum(p.value for p in m["messaging.client.sent.messages"]) == 1  # type: ignore[attr-defined]
    assert sum(p.value for p in m["messaging.client.consumed.messages"]) == 1  # type: ignore[attr-defined]
    assert sum(p.count for p in m["messaging.process.duration"]) == 1  # type: ignore[attr-defined]
    ops = {p.attributes["messaging.operation.name"] for p in m["messaging.client.operation.duration"]}  # type: ignore[attr-defined]
    assert ops == {"send", "receive", "ack"}


def test_sync_spans_attributes_propagation_and_metrics(broker: EmbeddedBroker, telemetry: Telemetry) -> None:
    from opentelemetry import baggage, context

    dest = "/queue/otel.sync"
    with amqtransport.connect(uri_of(broker)) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        token = context.attach(baggage.set_baggage("tenant", "acme"))
        try:
            conn.send(dest, "héllo", {"correlation-id": "corr-1"}, idempotency_key="key-sync-1")
        finally:
            context.detach(token)
        msg = sub.receive(5)
        assert msg is not None
        with msg.process() as m:
            assert m is msg
        headers = msg.headers
    check_trace(telemetry, dest, broker.port, headers, "key-sync-1")
    assert headers[IDEMPOTENCY_HEADER] == "key-sync-1"


def test_async_spans_attributes_propagation_and_metrics(broker: EmbeddedBroker, telemetry: Telemetry) -> None:
    from opentelemetry import baggage, context

    dest = "/queue/otel.async"
    got: dict[str, str] = {}

    async def main() -> None:
        async with aio.connect(uri_of(broker)) as conn:
            sub = await conn.subscribe(dest, ack="client-individual")
            token = context.attach(baggage.set_baggage("tenant", "acme"))
            try:
                await conn.send(dest, "héllo", {"correlation-id": "corr-1"}, idempotency_key="key-async-1")
            finally:
                context.detach(token)
            msg = await sub.receive(timeout=5)
            assert msg is not None
            async with msg.process():
                got.update(msg.headers)

    asyncio.run(main())
    check_trace(telemetry, dest, broker.port, got, "key-async-1")


def test_process_failure_nacks_and_marks_the_span(broker: EmbeddedBroker, telemetry: Telemetry) -> None:
    dest = "/queue/otel.fail"
    with amqtransport.connect(uri_of(broker)) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        conn.send(dest, "x")
        msg = sub.receive(5)
        assert msg is not None
        with pytest.raises(ValueError), msg.process():
            raise ValueError("handler failed")
        again = sub.receive(5)  # the NACK made the broker redeliver it
        assert again is not None and again.body == b"x"
        again.ack()
    (proc,) = telemetry.named(f"process {dest}")
    assert dict(proc.attributes or {})["error.type"] == "ValueError"
    (nack,) = telemetry.named(f"nack {dest}")
    assert nack.parent is not None and nack.parent.span_id == proc.context.span_id


def test_pipelined_producer_and_ack_many(broker: EmbeddedBroker, telemetry: Telemetry) -> None:
    dest = "/queue/otel.pipe"
    with amqtransport.connect(uri_of(broker)) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        with conn.producer(window=4) as p:
            for i in range(6):
                p.send(dest, f"m{i}")
        msgs = [sub.receive(5) for _ in range(6)]
        conn.ack_many(m for m in msgs if m is not None)
    sends = telemetry.named(f"send {dest}")
    assert len(sends) == 6
    parents = {m.headers["traceparent"] for m in msgs if m is not None}
    assert parents == {traceparent_of(s) for s in sends}
    (ack,) = telemetry.named(f"ack {dest}")
    assert dict(ack.attributes or {})["messaging.batch.message_count"] == 6


def test_uninstrument_restores_every_method(broker: EmbeddedBroker) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from amqtransport.otel import AmqtransportInstrumentor

    originals = (client_mod.Connection.send, client_mod.send_frame, client_mod.Subscription.receive,
                 aio.AsyncConnection.send, amqtransport.received.ReceivedMessage.process)
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    inst = AmqtransportInstrumentor()
    inst.instrument(tracer_provider=tp)
    assert client_mod.Connection.send is not originals[0]
    inst.uninstrument()
    assert (client_mod.Connection.send, client_mod.send_frame, client_mod.Subscription.receive,
            aio.AsyncConnection.send, amqtransport.received.ReceivedMessage.process) == originals
    with amqtransport.connect(uri_of(broker)) as conn:
        sub = conn.subscribe("/queue/otel.off")
        conn.send("/queue/otel.off", "x")
        msg = sub.receive(5)
        assert msg is not None and "traceparent" not in msg.headers
    assert exporter.get_finished_spans() == ()


def test_the_client_imports_no_opentelemetry_unless_instrumented() -> None:
    code = textwrap.dedent("""
        import asyncio, sys
        import amqtransport, amqtransport.aio as aio
        from amqtransport.broker import EmbeddedBroker
        with EmbeddedBroker(port=0) as b:
            uri = f"tcp://127.0.0.1:{b.port}"
            with amqtransport.connect(uri) as c:
                s = c.subscribe("/queue/q", ack="client-individual")
                c.send("/queue/q", "x")
                m = s.receive(5)
                with m.process():
                    pass
            async def main():
                async with aio.connect(uri) as c:
                    await c.send("/queue/q", "y")
            asyncio.run(main())
        print(sorted(m for m in sys.modules if m.startswith(("opentelemetry", "wrapt"))))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_entry_point_names_the_instrumentor() -> None:
    import tomllib
    from pathlib import Path

    from amqtransport.otel import AmqtransportInstrumentor

    data = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    target = data["project"]["entry-points"]["opentelemetry_instrumentor"]["amqtransport"]
    module, _, name = target.partition(":")
    import importlib

    assert getattr(importlib.import_module(module), name) is AmqtransportInstrumentor
    assert set(data["project"]["optional-dependencies"]["otel"]) >= {
        "opentelemetry-api>=1.27", "opentelemetry-instrumentation>=0.48b0"}


def test_a_refused_send_records_its_error(broker: EmbeddedBroker, telemetry: Telemetry) -> None:
    with amqtransport.connect(uri_of(broker)) as conn, pytest.raises(amqtransport.BrokerError):
        conn.send("/nonsense/x", "x")
    (span,) = telemetry.named("send /nonsense/x")
    assert dict(span.attributes or {})["error.type"] == "BrokerError"
    assert span.status.status_code.name == "ERROR"
    (point,) = telemetry.metrics()["messaging.client.sent.messages"]
    assert point.attributes["error.type"] == "BrokerError"  # type: ignore[attr-defined]


def test_a_send_with_its_own_traceparent_continues_that_trace(broker: EmbeddedBroker,
                                                              telemetry: Telemetry) -> None:
    given = f"00-{'ab' * 16}-{'cd' * 8}-01"
    with amqtransport.connect(uri_of(broker)) as conn:
        sub = conn.subscribe("/queue/otel.relay")
        conn.send("/queue/otel.relay", "relayed", {"traceparent": given})
        msg = sub.receive(5)
        assert msg is not None
    (span,) = telemetry.named("send /queue/otel.relay")
    assert span.context.trace_id == int("ab" * 16, 16)
    assert span.parent is not None and span.parent.span_id == int("cd" * 8, 16)
    assert msg.headers["traceparent"] == traceparent_of(span)  # the relay's span, in the same trace
