"""One trace, producer to consumer, through a failover, the brokers and a bridge:
prints the trace tree a person can read.

Starts a spoke pair and a hub pair of our brokers (replicated, each node with
``--otel-endpoint``), a bridge agent from spoke to hub (``otel_endpoint``) and a small
OTLP/HTTP receiver in this process for the brokers' and the bridge's spans; instruments
the client with the OpenTelemetry SDK (in-memory exporter). It sends one message
through ``failover:`` while the spoke's master is frozen then killed (``kill -9``), so
the send is replayed on the new master; the bridge forwards it to the hub, where a
consumer handles it with ``msg.process()``. Then it prints each trace as a tree of
spans (kind, duration, the server, what matters) with the span events::

    trace 5d0e...
    └─ send /queue/orders  PRODUCER  515.2 ms  server 127.0.0.1:20917  replayed
       ├─ event amqtransport.failover.interrupted  lost tcp://127.0.0.1:29433
       ├─ event amqtransport.failover.reconnected  new tcp://127.0.0.1:20917
       ├─ event amqtransport.send.replayed  tcp://127.0.0.1:29433 -> tcp://127.0.0.1:20917
       ├─ send /queue/orders  SERVER  1.6 ms  amq-broker b
       │  └─ journal fsync  INTERNAL  1.5 ms
       └─ forward /queue/orders  INTERNAL  7.9 ms  amq-bridge
          └─ send /queue/orders  PRODUCER  7.0 ms  server 127.0.0.1:26385
             ├─ send /queue/orders  SERVER  4.2 ms  amq-broker a
             │  ├─ journal fsync  INTERNAL  1.9 ms
             │  └─ replication wait  INTERNAL  2.3 ms
             └─ process /queue/orders  CONSUMER  0.3 ms  server 127.0.0.1:26385
                └─ ack /queue/orders  CLIENT  0.1 ms  server 127.0.0.1:26385

(the first ``send`` is the producer's, the second the spoke broker's; the bridge's own
client ``send`` sits under its ``forward`` span; the consumer's ``receive`` span is a
trace of its own, linked to the producer's span.)

Run: python examples/tracing.py   (needs ``pip install amqtransport[otel]
opentelemetry-sdk opentelemetry-proto``)
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import amqtransport
from amqtransport.otel import AmqtransportInstrumentor
from amqtransport.processes.pair import BrokerPair, HaNodeProcess
from bridge.agent import BridgeAgent
from bridge.config import parse_config

QUEUE = "/queue/orders"
KINDS = {0: "", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass
class Node:
    """A span, from the SDK (the clients) or from OTLP (the brokers, the bridge)."""

    trace_id: int
    span_id: int
    parent_id: int | None
    name: str
    kind: str
    start: int
    end: int
    note: str = ""
    events: list[str] = field(default_factory=list)
    links: list[int] = field(default_factory=list)


def from_sdk(span: ReadableSpan) -> Node:
    a = dict(span.attributes or {})
    note = f"server {a['server.address']}:{a['server.port']}" if "server.address" in a else ""
    if a.get("amqtransport.send.replayed"):
        note += "  replayed"
    events = []
    for e in span.events:
        ea = dict(e.attributes or {})
        lost, new = ea.get("amqtransport.failover.lost_server"), ea.get("amqtransport.failover.new_server")
        where = f"{lost} -> {new}" if lost and new else f"lost {lost}" if lost else f"new {new}" if new else ""
        events.append(f"event {e.name}  {where}".rstrip())
    return Node(span.context.trace_id, span.context.span_id, span.parent.span_id if span.parent else None,
                span.name, span.kind.name, span.start_time or 0, span.end_time or 0, note, events,
                [lk.context.span_id for lk in span.links])


class Receiver:
    """An OTLP/HTTP endpoint on loopback keeping the spans it gets, as :class:`Node`."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        nodes = self.nodes

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                req = ExportTraceServiceRequest()
                req.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for rs in req.resource_spans:
                    res = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
                    who = f"{res.get('service.name', '')} {res.get('amqtransport.node.name', '')}"
                    who = who.replace("amq-bridge bridge", "amq-bridge")
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            nodes.append(Node(int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big"),
                                              int.from_bytes(s.parent_span_id, "big") or None, s.name,
                                              KINDS.get(s.kind, ""), s.start_time_unix_nano, s.end_time_unix_nano,
                                              who if s.kind != 1 or s.name.startswith("forward") else ""))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def trace_tree(nodes: Sequence[Node]) -> str:
    """Each trace as an indented tree: spans under their parents, events first."""
    ids = {n.span_id for n in nodes}
    names = {n.span_id: n.name for n in nodes}
    children: dict[int | None, list[Node]] = defaultdict(list)
    for n in sorted(nodes, key=lambda n: n.start):
        children[n.parent_id if n.parent_id in ids else None].append(n)
    lines: list[str] = []

    def walk(n: Node, prefix: str, last: bool) -> None:
        text = f"{n.name}  {n.kind}  {(n.end - n.start) / 1e6:.1f} ms  {n.note}".rstrip()
        lines.append(f"{prefix}{'└─ ' if last else '├─ '}{text}")
        inner = prefix + ("   " if last else "│  ")
        items: list[str | Node] = [*n.events]
        items += [f"link to {names.get(link, f'{link:016x}')} (the producer's context)" for link in n.links]
        items += children[n.span_id]
        for i, item in enumerate(items):
            end = i == len(items) - 1
            if isinstance(item, str):
                lines.append(f"{inner}{'└─ ' if end else '├─ '}{item}")
            else:
                walk(item, inner, end)

    roots = children[None]
    for trace_id in dict.fromkeys(n.trace_id for n in roots):
        lines.append(f"trace {trace_id:032x}")
        mine = [n for n in roots if n.trace_id == trace_id]
        for i, root in enumerate(mine):
            walk(root, "", i == len(mine) - 1)
    return "\n".join(lines)


def freeze_then_kill(master: HaNodeProcess, written: threading.Event) -> None:
    os.kill(master.pid, signal.SIGSTOP)  # the send is written to a master that cannot answer
    written.set()
    time.sleep(0.5)
    master.kill()  # kill -9: the client fails over and replays the send


def bridge_between(spoke: BrokerPair, hub: BrokerPair, endpoint: str) -> BridgeAgent:
    return BridgeAgent(parse_config(f'''
local_uri = "failover:({spoke.a.uri},{spoke.b.uri})?randomize=false&initialReconnectDelay=50"
status_listen = ""
otel_endpoint = "{endpoint}"
[[network_connector]]
name = "spoke-to-hub"
uri = "masterslave:({hub.a.uri},{hub.b.uri})?initialReconnectDelay=100"
static_include = ["{QUEUE}"]
heartbeat_ms = 1000
'''))


@dataclass
class Setup:
    spoke: BrokerPair
    hub: BrokerPair
    agent: BridgeAgent


@contextlib.contextmanager
def running(data: Path, receiver: Receiver) -> Iterator[Setup]:
    otel = ["--otel-endpoint", receiver.url]
    with BrokerPair("replicated", data / "spoke", extra_args=otel) as spoke, \
            BrokerPair("replicated", data / "hub", extra_args=otel) as hub, \
            bridge_between(spoke, hub, receiver.url) as agent:
        yield Setup(spoke, hub, agent)


def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    AmqtransportInstrumentor().instrument(tracer_provider=provider)
    receiver = Receiver()
    fast = "initialReconnectDelay=10&maxReconnectDelay=200"
    with tempfile.TemporaryDirectory(prefix="amq-tracing-") as data:
        with running(Path(data), receiver) as s:
            deadline = time.monotonic() + 60
            while s.agent.registry.snapshot()["bridges"][0]["state"] != "up" and time.monotonic() < deadline:
                time.sleep(0.05)
            master = s.spoke.wait_master()
            with amqtransport.connect(f"{s.spoke.uri}&{fast}") as conn:
                conn.send("/queue/warm-up", "connect to the master first")
                exporter.clear()
                written = threading.Event()
                killer = threading.Thread(target=freeze_then_kill, args=(master, written))
                killer.start()
                written.wait(10)
                conn.send(QUEUE, "order 1", {"correlation-id": "order-1"})
                killer.join(30)
            with amqtransport.connect(f"{s.hub.uri}&{fast}") as conn:
                sub = conn.subscribe(QUEUE, ack="client-individual")
                msg = sub.receive(60)
                assert msg is not None, "the message did not reach the hub"
                with msg.process():
                    pass  # the application's work: acknowledged when the block ends
            deadline = time.monotonic() + 20  # the brokers' and the bridge's spans, exported in batches
            while time.monotonic() < deadline and not (
                    any(n.name.startswith("forward") for n in receiver.nodes)
                    and sum(n.name == "replication wait" for n in receiver.nodes) >= 1):
                time.sleep(0.1)
    AmqtransportInstrumentor().uninstrument()
    traced = {n.trace_id for n in map(from_sdk, exporter.get_finished_spans())}
    nodes = [from_sdk(s) for s in exporter.get_finished_spans()]
    nodes += [n for n in receiver.nodes if n.trace_id in traced]
    print(trace_tree(nodes))


if __name__ == "__main__":
    main()
