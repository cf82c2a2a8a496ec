"""Failover in the traces: a replicated pair of our brokers (real processes), the
master frozen (SIGSTOP) with a send written to it and unanswered, then SIGKILLed. The
send is replayed on the new master; its span says so (``amqtransport.send.replayed``
and an event naming the lost and the new server), carries the interrupted/reconnected
events, and names the node that served it -- on the sync client, then, with the
killed node back as the slave, on the asyncio client."""

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

from .conftest import Telemetry

pytestmark = pytest.mark.timeout(180)

OPTS = "&initialReconnectDelay=10&maxReconnectDelay=200"


def freeze_then_kill(bp: BrokerPair, master: HaNodeProcess, sending: threading.Event) -> None:
    """Freeze ``master``; once the send is written to it, SIGKILL it."""
    os.kill(master.pid, signal.SIGSTOP)
    sending.set()
    time.sleep(0.5)  # the send is written to the frozen master and waits for its receipt
    master.kill()


def check_replayed(t: Telemetry, dest: str, lost: HaNodeProcess, new: HaNodeProcess) -> None:
    (span,) = t.named(f"send {dest}")
    attrs = dict(span.attributes or {})
    assert attrs["amqtransport.send.replayed"] is True
    assert attrs["server.port"] == new.port, "the node that served it"
    events = {e.name: dict(e.attributes or {}) for e in span.events}
    assert events["amqtransport.send.replayed"] == {
        "amqtransport.failover.lost_server": lost.uri, "amqtransport.failover.new_server": new.uri}
    assert events["amqtransport.failover.interrupted"]["amqtransport.failover.lost_server"] == lost.uri
    assert events["amqtransport.failover.reconnected"] == {"amqtransport.failover.new_server": new.uri}
    assert "error.type" not in attrs


def test_a_replayed_send_carries_its_failover(tmp_path: Path, telemetry: Telemetry) -> None:
    with BrokerPair("replicated", tmp_path) as bp:
        uri = bp.uri + OPTS
        # -- sync client
        first = bp.wait_master()
        with amqtransport.connect(uri) as conn:
            conn.send("/queue/otel.ha.warm", "before")  # connected to the master
            telemetry.exporter.clear()
            sending = threading.Event()
            killer = threading.Thread(target=freeze_then_kill, args=(bp, first, sending))
            killer.start()
            sending.wait(10)
            conn.send("/queue/otel.ha.sync", "across the kill")
            killer.join(30)
        second = bp.wait_master()
        assert second is not first
        check_replayed(telemetry, "/queue/otel.ha.sync", first, second)
        # -- asyncio client, with the killed node back as the slave
        bp.restart(first)
        bp.wait_in_sync(60)
        telemetry.exporter.clear()

        async def main() -> None:
            async with aio.connect(uri) as conn:
                await conn.send("/queue/otel.ha.warm", "before")
                telemetry.exporter.clear()
                sending = threading.Event()
                killer = threading.Thread(target=freeze_then_kill, args=(bp, second, sending))
                killer.start()
                await asyncio.to_thread(sending.wait, 10)
                await conn.send("/queue/otel.ha.async", "across the kill")
                await asyncio.to_thread(killer.join, 30)

        asyncio.run(main())
        assert bp.wait_master() is first
        check_replayed(telemetry, "/queue/otel.ha.async", second, first)
        # both replayed messages are there once, with the producer's context
        with amqtransport.connect(uri) as conn:
            for dest in ("/queue/otel.ha.sync", "/queue/otel.ha.async"):
                sub = conn.subscribe(dest)
                msg = sub.receive(10)
                assert msg is not None and "traceparent" in msg.headers
                assert sub.receive(0.5) is None
