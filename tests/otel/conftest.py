"""The tracing tests' fixtures: the instrumentation installed with the SDK's in-memory
span exporter and metric reader, removed again after each test; a real OTLP/HTTP
receiver on loopback that decodes what it gets with opentelemetry-proto."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from amqtransport.otel import AmqtransportInstrumentor  # noqa: E402


@dataclass
class Telemetry:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def metrics(self) -> dict[str, list[object]]:
        """metric name -> its data points"""
        out: dict[str, list[object]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    inst = AmqtransportInstrumentor()
    inst.instrument(tracer_provider=tp, meter_provider=mp)
    try:
        yield Telemetry(exporter, reader, tp)
    finally:
        inst.uninstrument()
        tp.shutdown()
        mp.shutdown()


class Receiver:
    """An OTLP/HTTP traces endpoint on loopback: every span it was sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.paths: list[str] = []
        spans, paths = self.spans, self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                paths.append(self.path)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def named(self, name: str) -> list[Any]:
        return [s for s in list(self.spans) if s.name == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()
