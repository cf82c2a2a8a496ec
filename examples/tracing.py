"""Tracing a send across a failover: prints the trace tree a person can read.

Starts a replicated pair of our brokers (``amq broker pair``'s ``BrokerPair``),
instruments the client with the OpenTelemetry SDK (an in-memory exporter), sends one
message through ``failover:`` while the master is frozen then killed (``kill -9``), so
the send is replayed on the new master, then consumes it with ``msg.process()``. The
output: each trace as an indented tree of spans (kind, duration, the attributes that
matter), with the span events (the link lost, the reconnect, the replay)::

    trace 3f0c...
    └─ send /queue/orders  PRODUCER  512.3 ms  server 127.0.0.1:40817  replayed
       ├─ event amqtransport.failover.interrupted  lost tcp://127.0.0.1:40603
       ├─ event amqtransport.failover.reconnected  new tcp://127.0.0.1:40817
       ├─ event amqtransport.send.replayed  tcp://127.0.0.1:40603 -> tcp://127.0.0.1:40817
       └─ process /queue/orders  CONSUMER  0.4 ms  server 127.0.0.1:40817
          └─ ack /queue/orders  CLIENT  0.1 ms  server 127.0.0.1:40817
    trace 9b41...
    └─ receive /queue/orders  CLIENT  0.2 ms  server 127.0.0.1:40817
       └─ link to send /queue/orders (the producer's context)

Run: python examples/tracing.py   (needs the ``otel`` extra and the SDK:
``pip install amqtransport[otel] opentelemetry-sdk``)
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import amqtransport
from amqtransport.otel import AmqtransportInstrumentor
from amqtransport.processes.pair import BrokerPair, HaNodeProcess

QUEUE = "/queue/orders"


def describe(span: ReadableSpan) -> str:
    a = dict(span.attributes or {})
    ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    kind = span.kind.name if span.kind is not None else ""
    text = f"{span.name}  {kind}  {ms:.1f} ms"
    if "server.address" in a:
        text += f"  server {a['server.address']}:{a['server.port']}"
    if a.get("amqtransport.send.replayed"):
        text += "  replayed"
    if "error.type" in a:
        text += f"  error {a['error.type']}"
    return text


def describe_event(name: str, attrs: dict[str, object]) -> str:
    lost, new = attrs.get("amqtransport.failover.lost_server"), attrs.get("amqtransport.failover.new_server")
    if lost and new:
        return f"event {name}  {lost} -> {new}"
    if lost:
        return f"event {name}  lost {lost}"
    if new:
        return f"event {name}  new {new}"
    return f"event {name}"


def trace_tree(spans: Sequence[ReadableSpan]) -> str:
    """Each trace as an indented tree: spans under their parents, events first."""
    children: dict[int | None, list[ReadableSpan]] = defaultdict(list)
    ids = {s.context.span_id for s in spans}
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        parent = s.parent.span_id if s.parent is not None and s.parent.span_id in ids else None
        children[parent].append(s)
    names = {s.context.span_id: s.name for s in spans}
    lines: list[str] = []

    def walk(span: ReadableSpan, prefix: str, last: bool) -> None:
        lines.append(f"{prefix}{'└─ ' if last else '├─ '}{describe(span)}")
        inner = prefix + ("   " if last else "│  ")
        items: list[str | ReadableSpan] = [describe_event(e.name, dict(e.attributes or {})) for e in span.events]
        items += [f"link to {names.get(lk.context.span_id, f'{lk.context.span_id:016x}')} (the producer's context)"
                  for lk in span.links]
        items += children[span.context.span_id]
        for i, item in enumerate(items):
            end = i == len(items) - 1
            if isinstance(item, str):
                lines.append(f"{inner}{'└─ ' if end else '├─ '}{item}")
            else:
                walk(item, inner, end)

    roots = children[None]
    for trace_id in dict.fromkeys(s.context.trace_id for s in roots):
        lines.append(f"trace {trace_id:032x}")
        mine = [s for s in roots if s.context.trace_id == trace_id]
        for i, root in enumerate(mine):
            walk(root, "", i == len(mine) - 1)
    return "\n".join(lines)


def freeze_then_kill(master: HaNodeProcess, written: threading.Event) -> None:
    os.kill(master.pid, signal.SIGSTOP)  # the send is written to a master that cannot answer
    written.set()
    time.sleep(0.5)
    master.kill()  # kill -9: the client fails over and replays the send


def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    AmqtransportInstrumentor().instrument(tracer_provider=provider)
    with tempfile.TemporaryDirectory(prefix="amq-tracing-") as data, BrokerPair("replicated", data) as pair:
        uri = pair.uri + "&initialReconnectDelay=10&maxReconnectDelay=200"
        master = pair.wait_master()
        with amqtransport.connect(uri) as conn:
            conn.send("/queue/warm-up", "connect to the master first")
            exporter.clear()
            written = threading.Event()
            killer = threading.Thread(target=freeze_then_kill, args=(master, written))
            killer.start()
            written.wait(10)
            conn.send(QUEUE, "order 1", {"correlation-id": "order-1"})
            killer.join(30)
            sub = conn.subscribe(QUEUE, ack="client-individual")
            msg = sub.receive(10)
            assert msg is not None, "the replayed message did not arrive"
            with msg.process():
                pass  # the application's work: acknowledged when the block ends
    AmqtransportInstrumentor().uninstrument()
    print(trace_tree(exporter.get_finished_spans()))


if __name__ == "__main__":
    main()
