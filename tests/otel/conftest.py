"""The tracing tests' fixtures: the instrumentation installed with the SDK's in-memory
span exporter and metric reader, removed again after each test; a real OTLP/HTTP
receiver on loopback that decodes what it gets with opentelemetry-proto."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from amqtransport.otel import AmqtransportInstrumentor  # noqa: E402
from amqtransport.testing.otlp import Receiver  # noqa: E402

__all__ = ["Receiver", "Telemetry"]


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


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()
