"""The broker keeps a message's W3C trace context untouched: ``traceparent``,
``tracestate`` and ``baggage`` arrive as sent through paging (more messages than the
queue keeps in memory), a restart from the journal, the dead-letter queue, and a
replicated pair's failover (SIGKILL of the master, consumed from the new one)."""

from __future__ import annotations

from pathlib import Path

import pytest

import amqtransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.broker.config import BrokerConfig
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(120)

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")


def context_headers(i: int) -> dict[str, str]:
    return {"traceparent": f"00-{i + 1:032x}-{i + 7:016x}-01",
            "tracestate": f"vendor=v{i},other=o{i}", "baggage": f"tenant=t{i},job=j%20{i}"}


def check(msg: object, i: int) -> None:
    assert msg is not None, f"message {i} missing"
    headers = msg.headers  # type: ignore[attr-defined]
    assert {k: headers.get(k) for k in TRACE_HEADERS} == context_headers(i), f"message {i}"


def test_paging_restart_and_dead_letter_keep_the_trace_context(tmp_path: Path) -> None:
    config = BrokerConfig(page_window=2, max_redeliveries=0)
    with EmbeddedBroker(port=0, data_dir=tmp_path, config=config) as b:
        with amqtransport.connect(b.uri) as conn:
            for i in range(8):  # six of the eight wait on disk (page_window=2)
                conn.send("/queue/trace.paged", f"p{i}", context_headers(i))
            for i in range(3):
                conn.send("/queue/trace.kept", f"k{i}", context_headers(100 + i))
            conn.send("/queue/trace.poison", "x", context_headers(200))
            sub = conn.subscribe("/queue/trace.paged")
            for i in range(8):
                check(sub.receive(10), i)
            poison = conn.subscribe("/queue/trace.poison", ack="client-individual")
            msg = poison.receive(10)
            check(msg, 200)
            assert msg is not None
            msg.nack()  # max_redeliveries=0: straight to the DLQ
            dead = conn.subscribe("/queue/DLQ.trace.poison").receive(10)
            check(dead, 200)
        port = b.port
    with EmbeddedBroker(port=port, data_dir=tmp_path, config=config) as b:  # restarted from the journal
        with amqtransport.connect(b.uri) as conn:
            sub = conn.subscribe("/queue/trace.kept")
            for i in range(3):
                check(sub.receive(10), 100 + i)


def test_replication_keeps_the_trace_context(tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path) as bp:
        uri = bp.uri + "&initialReconnectDelay=10&maxReconnectDelay=200"
        with amqtransport.connect(uri) as conn:
            for i in range(3):
                conn.send("/queue/trace.replicated", f"r{i}", context_headers(300 + i))
        bp.kill_master()
        bp.wait_master()
        with amqtransport.connect(uri) as conn:
            sub = conn.subscribe("/queue/trace.replicated")
            for i in range(3):
                check(sub.receive(10), 300 + i)
