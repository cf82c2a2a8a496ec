"""One trace from a producer, through a failover, the broker's journal and replication
and a bridge, to the consumer (issue 25's end-to-end test). A spoke pair and a hub pair
of our brokers (real processes, replicated, ``--otel-endpoint``), a bridge agent
(``otel_endpoint``) from spoke to hub, a real OTLP/HTTP receiver, the clients
instrumented with the SDK's in-memory exporter.

Message A: the sync client sends it while the spoke's master is frozen, then SIGKILLed;
the send is replayed on the new master, and an asyncio consumer on the hub processes it.
Message B: with the killed node back as the spoke's slave, the asyncio client sends it,
a sync consumer on the hub processes it. For each, the producer's span, the spoke broker's, the bridge's
forward span, the hub broker's and the consumer's share one trace id, each under the
one before; A's send carries its failover events."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import amqtransport
import amqtransport.aio as aio
from amqtransport.testing.broker_pair import BrokerPair, HaNodeProcess
from amqtransport.testing.wait import wait_for
from bridge.agent import BridgeAgent
from bridge.config import parse_config

from .conftest import Receiver, Telemetry

pytestmark = pytest.mark.timeout(240)

QUEUE = "/queue/e2e.orders"
FAST = "initialReconnectDelay=10&maxReconnectDelay=200"


def agent_for(spoke: BrokerPair, hub: BrokerPair, endpoint: str) -> BridgeAgent:
    return BridgeAgent(parse_config(f'''
local_uri = "failover:({spoke.a.uri},{spoke.b.uri})?randomize=false&initialReconnectDelay=50"
status_listen = ""
otel_endpoint = "{endpoint}"
[[network_connector]]
name = "spoke-to-hub"
uri = "masterslave:({hub.a.uri},{hub.b.uri})?initialReconnectDelay=100"
static_include = ["{QUEUE}"]
heartbeat_ms = 1000
prefetch = 20
'''))


def freeze_then_kill(master: HaNodeProcess, written: threading.Event) -> None:
    os.kill(master.pid, signal.SIGSTOP)
    written.set()
    time.sleep(0.5)
    master.kill()


def sid(n: int) -> bytes:
    return n.to_bytes(8, "big")


def check_chain(t: Telemetry, r: Receiver, body: str, replayed: bool, spoke_slave: bool) -> None:
    """producer send -> spoke broker span, forward span -> (bridge's send) -> hub broker
    span; the consumer's process span under the forward span's line; one trace."""
    sends = [s for s in t.named(f"send {QUEUE}") if s.parent is None or s.parent.is_remote is False]
    producer = next(s for s in sends if dict(s.attributes or {}).get("messaging.message.body.size") == len(body)
                    and s.parent is None)
    trace_id = producer.context.trace_id
    tid = trace_id.to_bytes(16, "big")
    mine = [s for s in list(r.spans) if s.trace_id == tid]
    by_id = {s.span_id: s for s in mine}
    broker_spans = [s for s in mine if s.name == f"send {QUEUE}"]
    spoke_span = next(s for s in broker_spans if s.parent_span_id == sid(producer.context.span_id))
    forward = next(s for s in mine if s.name == f"forward {QUEUE}")
    assert forward.parent_span_id == sid(producer.context.span_id)
    # the replayed send went to a new master with no slave yet: no replication wait there
    want = {"journal fsync", "replication wait"} if spoke_slave else {"journal fsync"}
    assert {k.name for k in mine if k.parent_span_id == spoke_span.span_id} == want
    # the bridge's own client send (instrumented in this process) sits under the forward span
    bridge_send = next(s for s in t.named(f"send {QUEUE}") if s.context.trace_id == trace_id
                       and s.parent is not None and s.parent.span_id == int.from_bytes(forward.span_id, "big"))
    hub_span = next(s for s in broker_spans if s.parent_span_id == sid(bridge_send.context.span_id))
    assert hub_span.span_id in by_id and {k.name for k in mine if k.parent_span_id == hub_span.span_id} >= {
        "journal fsync", "replication wait"}
    (process,) = [s for s in t.named(f"process {QUEUE}") if s.context.trace_id == trace_id]
    assert process.parent is not None and process.parent.span_id == bridge_send.context.span_id
    events = {e.name: dict(e.attributes or {}) for e in producer.events}
    if replayed:
        assert dict(producer.attributes or {})["amqtransport.send.replayed"] is True
        assert {"amqtransport.failover.interrupted", "amqtransport.failover.reconnected",
                "amqtransport.send.replayed"} <= set(events)
    else:
        assert "amqtransport.send.replayed" not in events


def test_one_trace_from_producer_through_failover_and_bridge_to_consumer(
        tmp_path: Path, receiver: Receiver, telemetry: Telemetry) -> None:
    otel = ["--otel-endpoint", receiver.url]
    with BrokerPair("replicated", tmp_path / "spoke", extra_args=otel) as spoke, \
            BrokerPair("replicated", tmp_path / "hub", extra_args=otel) as hub, \
            agent_for(spoke, hub, receiver.url) as agent:
        wait_for(lambda: agent.registry.snapshot()["bridges"][0]["state"] == "up", 60, what="bridge up")
        spoke_uri, hub_uri = f"{spoke.uri}&{FAST}", f"{hub.uri}&{FAST}"
        # -- A: sync producer across the spoke master's death, asyncio consumer on the hub
        master = spoke.wait_master()
        with amqtransport.connect(spoke_uri) as conn:
            conn.send("/queue/e2e.warm", "w")
            written = threading.Event()
            killer = threading.Thread(target=freeze_then_kill, args=(master, written))
            killer.start()
            written.wait(10)
            conn.send(QUEUE, "A-sync")
            killer.join(30)

        async def consume_async() -> str:
            async with aio.connect(hub_uri) as c:
                sub = await c.subscribe(QUEUE, ack="client-individual")
                msg = await sub.receive(timeout=60)
                assert msg is not None
                async with msg.process():
                    return msg.text

        assert asyncio.run(consume_async()) == "A-sync"

        # -- B: asyncio producer, sync consumer, the killed node back as the spoke's slave
        spoke.restart(master)
        spoke.wait_in_sync(60)

        async def produce_async() -> None:
            async with aio.connect(spoke_uri) as c:
                await c.send(QUEUE, "B-asyncio")

        asyncio.run(produce_async())
        with amqtransport.connect(hub_uri) as conn:
            sub = conn.subscribe(QUEUE, ack="client-individual")
            msg = sub.receive(60)
            assert msg is not None and msg.text == "B-asyncio"
            with msg.process():
                pass

        def chains_exported() -> bool:
            # a span is exported when it ends, a parent after its children and in another batch:
            # wait for every broker's send span too (spoke and hub, A and B), not only the children
            return (len(receiver.named(f"forward {QUEUE}")) >= 2 and len(receiver.named("replication wait")) >= 3
                    and len(receiver.named(f"send {QUEUE}")) >= 4)
        wait_for(chains_exported, 30, what="the brokers' and the bridge's spans")
        check_chain(telemetry, receiver, "A-sync", replayed=True, spoke_slave=False)
        check_chain(telemetry, receiver, "B-asyncio", replayed=False, spoke_slave=True)
