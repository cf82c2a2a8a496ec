"""The cost of the OpenTelemetry instrumentation (amqtransport/otel/) on the sync
pipelined producer (window 100, persistent 256-byte receipted sends through
``failover:(tcp://x)`` to our broker process, fsync on), in the same run:

1. instrumentation installed with no SDK (the API's global no-op providers, as
   ``opentelemetry-instrument`` leaves them without an SDK) vs not installed, the two
   alternating, both orders, geometric mean of the two ratios (goal: >= 0.97, i.e. at
   most 3 % fewer messages per second);
2. the SDK with 100 % sampling, a ``BatchSpanProcessor`` (its exporter drops the
   batches: the cost measured is the client's) and a metric reader vs not installed;
3. the broker's side: two broker processes, one with ``--otel-endpoint`` (an OTLP/HTTP
   receiver in this process that counts and discards), one without, the client
   instrumented with the SDK sampling 1 % of its traces (parent-based ratio) against
   both, alternating (goal: >= 0.95).

Run: .venv/bin/python benchmarks/bench_otel.py [rounds]   (AMQ_BENCH_QUICK=1: smaller runs)
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import compare, print_table, quick, scale, work_dir  # noqa: E402
from bench_client import producer_rate  # noqa: E402

from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402


def instrumented(run: Callable[[], float], **providers: Any) -> Callable[[], float]:
    """``run`` with the instrumentation installed (``providers``: instrument()'s)."""
    from amqtransport.otel import AmqtransportInstrumentor

    def go() -> float:
        inst = AmqtransportInstrumentor()
        inst.instrument(**providers)
        try:
            return run()
        finally:
            inst.uninstrument()
    return go


def sdk_providers(sampler: Any = None) -> dict[str, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tp = TracerProvider(sampler=sampler)  # None: the default, parent-based always on (100 %)
    tp.add_span_processor(BatchSpanProcessor(Dropping()))
    return {"tracer_provider": tp, "meter_provider": MeterProvider(metric_readers=[InMemoryMetricReader()])}


class Collector:
    """An OTLP/HTTP endpoint on loopback that answers 200 and counts the requests."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def sampled_providers(ratio: float) -> dict[str, Any]:
    """The SDK sampling ``ratio`` of the traces it starts (parent-based), no metrics."""
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    return {"tracer_provider": sdk_providers(ParentBased(TraceIdRatioBased(ratio)))["tracer_provider"],
            "meter_provider": NoOpMeterProvider()}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else (3 if quick() else 7)
    n = scale(10000, 1000)
    tmp = work_dir("bench-otel-")
    rows: list[dict[str, Any]] = []
    with BrokerProcess(tmp / "data", log_dir=tmp / "logs") as broker:
        uri = f"failover:({broker.uri})"

        cpu: dict[str, list[float]] = {"plain": [], "noop": []}

        def plain() -> float:
            return producer_rate(uri, n)

        def cpu_of(key: str, run: Callable[[], float]) -> Callable[[], float]:
            def go() -> float:
                c0 = time.process_time()
                rate = run()
                cpu[key].append((time.process_time() - c0) / n * 1e6)
                return rate
            return go

        noop = cpu_of("noop", instrumented(plain))
        plain_cpu = cpu_of("plain", plain)
        plain()
        noop()
        c1 = compare(noop, plain_cpu, rounds=rounds)
        c2 = compare(plain_cpu, noop, rounds=rounds)
        rows.append({"case": f"instrumented, no SDK (no-op providers) vs not installed, producer window 100, {n} msgs, "
                             "both orders",
                     "ours msg/s": statistics.median(c1.ours_all + c2.peer_all),
                     "peer msg/s": statistics.median(c1.peer_all + c2.ours_all),
                     "ratio": (c1.ratio / c2.ratio) ** 0.5, "better": "higher"})
        noop_cpu, base_cpu = statistics.median(cpu["noop"][1:]), statistics.median(cpu["plain"][1:])
        rows.append({"case": "  same runs, client process CPU per message, us: instrumented vs not",
                     "ours msg/s": noop_cpu, "peer msg/s": base_cpu, "ratio": base_cpu / noop_cpu,
                     "better": "higher"})
        sdk = instrumented(plain, **sdk_providers())
        c3 = compare(sdk, plain, rounds=rounds)
        c4 = compare(plain, sdk, rounds=rounds)
        rows.append({"case": "instrumented, SDK 100 % sampled, batch processor + metrics vs not installed, both orders",
                     "ours msg/s": statistics.median(c3.ours_all + c4.peer_all),
                     "peer msg/s": statistics.median(c3.peer_all + c4.ours_all),
                     "ratio": (c3.ratio / c4.ratio) ** 0.5, "better": "higher"})
        collector = Collector()
        with BrokerProcess(tmp / "traced", args=["--otel-endpoint", collector.url],
                           log_dir=tmp / "logs-traced") as traced:
            sampled = sampled_providers(0.01)
            with_endpoint = instrumented(lambda: producer_rate(f"failover:({traced.uri})", n), **sampled)
            without = instrumented(plain, **sampled)
            c5 = compare(with_endpoint, without, rounds=rounds)
            c6 = compare(without, with_endpoint, rounds=rounds)
            rows.append({"case": "broker --otel-endpoint vs none, client SDK sampling 1 %, both orders",
                         "ours msg/s": statistics.median(c5.ours_all + c6.peer_all),
                         "peer msg/s": statistics.median(c5.peer_all + c6.ours_all),
                         "ratio": (c5.ratio / c6.ratio) ** 0.5, "better": "higher"})
            print(f"the collector got {collector.requests} POST(s) of broker spans")
    print_table(rows, title="OpenTelemetry instrumentation cost (our broker process, fsync on, 256-byte persistent sends)")


if __name__ == "__main__":
    main()
