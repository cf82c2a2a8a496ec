"""``amq broker run --otel-endpoint URL``: the broker (a real process) exports a server
span per sampled SEND over OTLP/HTTP to a real receiver started by the test (decoded
with opentelemetry-proto): parented by the producer's span, with the journal fsync as
a child, and on a replicated master the replication wait too; an unsampled SEND makes
no span; a collector that is not there never blocks a send and the dropped spans are
counted in /metrics. Plus the pure parts: traceparent parsing (fuzzed) and the
protobuf encoder round trip."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import amqtransport
from amqtransport.broker.otlp import SPAN_KIND_SERVER, ServerSpan, encode_export, parse_traceparent
from amqtransport.processes.ports import free_port
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.broker_process import BrokerProcess
from amqtransport.testing.wait import wait_for

from .conftest import Receiver, Telemetry

pytestmark = pytest.mark.timeout(120)


def children_of(r: Receiver, span: Any) -> dict[str, Any]:
    return {s.name: s for s in list(r.spans) if s.parent_span_id == span.span_id}


def test_a_sampled_send_gets_a_server_span_with_its_fsync(tmp_path: Path, receiver: Receiver,
                                                          telemetry: Telemetry) -> None:
    with BrokerProcess(tmp_path / "data", args=["--otel-endpoint", receiver.url]) as broker:
        with amqtransport.connect(broker.uri) as conn:
            conn.send("/queue/otlp.one", "traced")
            # a producer whose trace is not sampled: traceparent flags 00
            unsampled = SpanContext(0x1111, 0x2222, is_remote=True, trace_flags=TraceFlags(0))
            with trace.use_span(NonRecordingSpan(unsampled)):
                conn.send("/queue/otlp.one", "not sampled")
            sub = conn.subscribe("/queue/otlp.one")
            flags = [m.headers["traceparent"][-2:] for m in (sub.receive(10), sub.receive(10)) if m is not None]
            assert [int(f, 16) & 1 for f in flags] == [1, 0]  # sampled, not sampled
        wait_for(lambda: len(receiver.named("send /queue/otlp.one")) >= 1 and receiver.named("journal fsync"),
                 timeout=20, what="the broker's spans")
    (client,) = telemetry.named("send /queue/otlp.one")  # the unsampled send recorded nothing either
    (server,) = receiver.named("send /queue/otlp.one")  # nor did the broker
    assert receiver.paths[0] == "/v1/traces"
    assert server.kind == SPAN_KIND_SERVER
    assert server.trace_id == client.context.trace_id.to_bytes(16, "big")
    assert server.parent_span_id == client.context.span_id.to_bytes(8, "big")
    attrs = {kv.key: kv.value for kv in server.attributes}
    assert attrs["messaging.destination.name"].string_value == "/queue/otlp.one"
    assert attrs["messaging.system"].string_value == "amqtransport"
    fsync = children_of(receiver, server)["journal fsync"]
    assert server.start_time_unix_nano <= fsync.start_time_unix_nano <= fsync.end_time_unix_nano
    assert fsync.end_time_unix_nano <= server.end_time_unix_nano
    # the client's span holds the broker's
    assert client.start_time <= server.start_time_unix_nano and server.end_time_unix_nano <= client.end_time
    assert "replication wait" not in children_of(receiver, server)


def test_a_replicated_master_adds_the_replication_wait(tmp_path: Path, receiver: Receiver,
                                                       telemetry: Telemetry) -> None:
    with BrokerPair("replicated", tmp_path, extra_args=["--otel-endpoint", receiver.url]) as bp:
        with amqtransport.connect(bp.uri) as conn:
            conn.send("/queue/otlp.pair", "traced")
        wait_for(lambda: bool(receiver.named("replication wait")), timeout=20,
                 what="the replication wait span")
    (client,) = telemetry.named("send /queue/otlp.pair")
    (server,) = receiver.named("send /queue/otlp.pair")
    assert server.parent_span_id == client.context.span_id.to_bytes(8, "big")
    kids = children_of(receiver, server)
    assert set(kids) == {"journal fsync", "replication wait"}
    assert kids["journal fsync"].end_time_unix_nano == kids["replication wait"].start_time_unix_nano
    assert kids["replication wait"].end_time_unix_nano == server.end_time_unix_nano


def test_an_unreachable_collector_never_blocks_a_send(tmp_path: Path, telemetry: Telemetry) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    http_port = free_port()
    with BrokerProcess(tmp_path / "data", args=["--otel-endpoint", dead, "--http", str(http_port),
                                                "--config", str(_small_queue(tmp_path))]) as broker:
        with amqtransport.connect(broker.uri) as conn, conn.producer(window=50) as p:
            for i in range(300):
                p.send("/queue/otlp.dead", f"m{i}")
        with amqtransport.connect(broker.uri) as conn:
            sub = conn.subscribe("/queue/otlp.dead")
            assert all(sub.receive(10) is not None for _ in range(300))

        def dropped() -> float:
            text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
            line = next(x for x in text.splitlines() if x.startswith("amq_otel_spans_dropped_total "))
            return float(line.split()[1])

        wait_for(lambda: dropped() >= 600, timeout=30, what="every span dropped (2 per send)")
        text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
        assert "amq_otel_spans_exported_total 0" in text


def _small_queue(tmp_path: Path) -> Path:
    cfg = tmp_path / "broker.toml"
    cfg.write_text("otel_queue_size = 16\n")
    return cfg


# -- the pure parts ---------------------------------------------------------------------------

def test_parse_traceparent() -> None:
    tp = parse_traceparent(f"00-{'ab' * 16}-{'cd' * 8}-01")
    assert tp is not None and tp.sampled and tp.trace_id == bytes.fromhex("ab" * 16) and tp.span_id == bytes.fromhex("cd" * 8)
    unsampled = parse_traceparent(f"00-{'ab' * 16}-{'cd' * 8}-00")
    assert unsampled is not None and not unsampled.sampled
    assert parse_traceparent(f"01-{'ab' * 16}-{'cd' * 8}-01-future") is not None  # a later version may add fields
    for bad in ("", "00", f"00-{'0' * 32}-{'cd' * 8}-01", f"00-{'ab' * 16}-{'0' * 16}-01",
                f"ff-{'ab' * 16}-{'cd' * 8}-01", f"00-{'AB' * 16}-{'cd' * 8}-01", f"00-{'ab' * 16}-{'cd' * 8}-01-x",
                f"00-{'ab' * 15}-{'cd' * 8}-01"):
        assert parse_traceparent(bad) is None, bad


@given(st.text(max_size=80))
def test_parse_traceparent_never_raises(text: str) -> None:
    tp = parse_traceparent(text)
    assert tp is None or (len(tp.trace_id) == 16 and len(tp.span_id) == 8)


@given(st.lists(st.tuples(st.binary(min_size=16, max_size=16), st.binary(min_size=8, max_size=8),
                          st.text(max_size=20), st.integers(0, 2**63), st.integers(-2**63, 2**63 - 1),
                          st.booleans()), max_size=5))
def test_encoded_spans_decode_with_opentelemetry_proto(rows: list[tuple[bytes, bytes, str, int, int, bool]]) -> None:
    spans = [ServerSpan(t, s, b"\x01" * 8, name, SPAN_KIND_SERVER, start, start + 5,
                        {"i": i, "b": flag, "s": name, "f": 1.5}, "boom" if flag else None)
             for t, s, name, start, i, flag in rows]
    req = ExportTraceServiceRequest()
    req.ParseFromString(encode_export(spans, {"service.name": "amq-broker"}, "scope", "1"))
    got = [sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    assert len(got) == len(spans)
    for span, pb in zip(spans, got, strict=True):
        assert (pb.trace_id, pb.span_id, pb.parent_span_id, pb.name) == (
            span.trace_id, span.span_id, span.parent_span_id, span.name)
        assert (pb.start_time_unix_nano, pb.end_time_unix_nano, pb.kind) == (span.start_ns, span.end_ns, 2)
        attrs = {kv.key: kv.value for kv in pb.attributes}
        assert attrs["i"].int_value == span.attributes["i"] and attrs["b"].bool_value == span.attributes["b"]
        assert attrs["s"].string_value == span.name and attrs["f"].double_value == 1.5
        assert pb.status.code == (2 if span.error else 0)
    if rows:
        rs = req.resource_spans[0]
        assert rs.resource.attributes[0].value.string_value == "amq-broker"
