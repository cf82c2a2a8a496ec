"""The ``amq`` writer's task spans (``otelEndpoint``): one span per partition task with
``messaging.batch.message_count``, in the trace of the ``traceparent`` option; every
row's SEND carries the task's context, so the broker's spans (a real broker process
with ``--otel-endpoint``) hang under the task span. A real OTLP/HTTP receiver decodes
both with opentelemetry-proto. Bad options are refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spark_helpers import drain, queue

from amqtransport.processes.broker import BrokerProcess
from amqtransport.spark.options import AmqSparkOptionError, parse_writer_options
from amqtransport.testing.otlp import receiving
from amqtransport.testing.wait import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
DRIVER_SPAN = "00f067aa0ba902b7"


def test_each_task_is_a_span_and_its_rows_carry_it(spark: Any, tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.proto")
    dest, n = queue(), 60
    with receiving() as r, BrokerProcess(tmp_path / "data", args=["--otel-endpoint", r.url]) as broker:
        (spark.range(0, n, 1, 3).selectExpr("concat('row-', cast(id as string)) AS body")
         .write.format("amq").mode("append").option("uri", broker.uri).option("destination", dest)
         .option("otelEndpoint", r.url).option("traceparent", f"00-{TRACE}-{DRIVER_SPAN}-01").save())
        got = drain(broker.uri, dest)
        assert len(got) == n
        wait_for(lambda: len([s for s in r.spans if s.name == f"spark write {dest}"]) == 3
                 and len([s for s in r.spans if s.name == f"send {dest}"]) == n, timeout=30,
                 what="three task spans and a broker span per row")
    tasks = [s for s in r.spans if s.name == f"spark write {dest}"]
    assert {s.trace_id.hex() for s in tasks} == {TRACE}
    assert {s.parent_span_id.hex() for s in tasks} == {DRIVER_SPAN}
    counts = sorted(next(kv.value.int_value for kv in s.attributes if kv.key == "messaging.batch.message_count")
                    for s in tasks)
    assert sum(counts) == n and len(counts) == 3
    task_ids = {s.span_id for s in tasks}
    # every row's SEND named its task: the broker's span of each is a child of a task span
    brokers = [s for s in r.spans if s.name == f"send {dest}"]
    assert {s.parent_span_id for s in brokers} == task_ids
    # and the messages keep the task's context for their consumers
    assert {m.headers["traceparent"].split("-")[2] for m in got} == {t.hex() for t in task_ids}


def test_bad_tracing_options_are_refused_by_name() -> None:
    base = {"uri": "tcp://127.0.0.1:1", "destination": "/queue/x"}
    with pytest.raises(AmqSparkOptionError) as e1:
        parse_writer_options({**base, "otelEndpoint": "grpc://collector:4317"})
    assert e1.value.option == "otelEndpoint" and "http://" in str(e1.value)
    with pytest.raises(AmqSparkOptionError) as e2:
        parse_writer_options({**base, "traceparent": "not-a-context"})
    assert e2.value.option == "traceparent"
    ok = parse_writer_options({**base, "otelEndpoint": "http://127.0.0.1:4318",
                               "traceparent": f"00-{TRACE}-{DRIVER_SPAN}-01"})
    assert ok.otel_endpoint == "http://127.0.0.1:4318" and ok.traceparent is not None
