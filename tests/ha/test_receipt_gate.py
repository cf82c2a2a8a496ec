"""Every RECEIPT passes the replication gate and the stall check, not only journal completions.

Real processes: a replicated pair, nodes frozen with SIGSTOP. Before the fix a SUBSCRIBE,
UNSUBSCRIBE, BEGIN or ABORT was receipted at once, so

- a master frozen, replaced and thawed receipted a durable SUBSCRIBE that waited in its
  socket: ``subscribe()`` returned, the new master had no such subscription, and what was
  published before the client was cut never reached it;
- it receipted the client's trackMessages idle barrier (BEGIN + receipted ABORT), which
  trims the replay cache: the fire-and-forget sends before it were lost (the issue
  measured 294 per run);
- a healthy master receipted a durable SUBSCRIBE before its record was durable on the
  slave.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from ha_helpers import frozen, raw_connect, read_frames, wait_for, with_opts

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(180)

TOPIC = "/topic/gate.durable"


def _durable_subscribe_frame(name: str, receipt: str) -> bytes:
    return (f"SUBSCRIBE\ndestination:{TOPIC}\nid:{name}\nack:client-individual\n"
            f"activemq.subscriptionName:{name}\nreceipt:{receipt}\n\n\x00").encode()


def _receipts(frames: list[bytes]) -> list[bytes]:
    return [f for f in frames if f.startswith(b"RECEIPT")]


def _drain(sub: Any, expected: set[str], timeout: float) -> set[str]:
    got: set[str] = set()
    deadline = time.monotonic() + timeout
    while not expected <= got and time.monotonic() < deadline:
        m = sub.receive(timeout=0.5)
        if m is not None:
            got.add(m.text)
            m.ack()
    return got


def test_thawed_master_does_not_receipt_a_durable_subscribe(tmp_path: Path) -> None:
    """(a) A durable SUBSCRIBE written into a frozen master's socket, the slave takes over,
    the master is thawed: it must not receipt it. A real client subscribing through the
    same freeze gets every receipted message published once ``subscribe()`` returned."""
    with BrokerPair("replicated", tmp_path, link_timeout=0.5) as bp:
        old = bp.wait_master(30)
        new = bp.other(old)
        wait_for(lambda: old.status().get("amq-ha-peer-state") == "in-sync", 30, "the slave to sync")
        raw = raw_connect(old.port, client_id="gate-raw")
        client = amqtransport.connect(bp.uri, client_id="gate-real")
        result: dict[str, Any] = {}

        def subscribe() -> None:
            try:
                result["sub"] = client.subscribe(TOPIC, ack="client-individual", durable_name="gate-real")
            except BaseException as exc:  # noqa: BLE001 - reported below
                result["error"] = exc

        try:
            with frozen(old):
                raw.sendall(_durable_subscribe_frame("gate-raw", "sub-raw"))
                t = threading.Thread(target=subscribe, daemon=True)
                t.start()
                time.sleep(0.3)  # the client writes its SUBSCRIBE into the frozen master's socket
                assert bp.wait_master(30, exclude=old) is new
            frames, _closed = read_frames(raw, time.monotonic() + 5)
            t.join(60)
            assert "error" not in result, result
            assert "sub" in result, "subscribe() did not return within 60 s"
            bodies = {f"gate-{i}" for i in range(40)}
            with amqtransport.connect(bp.uri) as pub:  # receipted sends, as soon as subscribe() returned
                for body in sorted(bodies):
                    pub.send(TOPIC, body)
            got = _drain(result["sub"], bodies, 30)
        finally:
            raw.close()
            client.close()
        assert not _receipts(frames), f"the thawed master receipted a durable SUBSCRIBE: {frames[:3]}"
        missing = bodies - got
        assert not missing, f"{len(missing)} receipted messages never reached the durable subscription"


def test_tracked_sends_survive_a_freeze_with_a_barrier_in_flight(tmp_path: Path) -> None:
    """(b) trackMessages fire-and-forget sends written into a frozen master's socket, then
    the idle barrier (BEGIN + receipted ABORT) after them; the slave takes over; the master
    is thawed. The barrier's receipt must not come from the stale master (it would trim the
    replay cache): every send reaches the new master."""
    with BrokerPair("replicated", tmp_path, link_timeout=0.5) as bp:
        old = bp.wait_master(30)
        new = bp.other(old)
        wait_for(lambda: old.status().get("amq-ha-peer-state") == "in-sync", 30, "the slave to sync")
        queue = "/queue/gate.tracked"
        sent: list[str] = []
        uri = with_opts(bp.uri, "trackMessages=true&initialReconnectDelay=10&maxReconnectDelay=200")
        with amqtransport.connect(uri) as conn:
            conn.send(queue, "warm-up", idempotency_key="warm-up")  # connected to the master
            sent.append("warm-up")
            with frozen(old):
                t0 = time.monotonic()
                for i in range(200):
                    body = f"ff-{i}"
                    conn.send(queue, body, idempotency_key=body, receipt=False)
                    sent.append(body)
                time.sleep(1.6)  # tracked sends pause: the client writes its idle barrier
                assert bp.wait_master(30, exclude=old) is new
                time.sleep(max(0.0, 4.0 - (time.monotonic() - t0)))  # a ~4 s freeze
            # the client fails over once the thawed master cuts it, and replays its cache
            conn.send(queue, "after", idempotency_key="after")
            sent.append("after")
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe(queue, ack="client-individual")
            got = _drain(sub, set(sent), 30)
        lost = [b for b in sent if b not in got]
        assert not lost, f"{len(lost)} of {len(sent)} tracked sends lost, e.g. {lost[:5]}"


def test_healthy_master_receipts_a_durable_subscribe_once_replicated(tmp_path: Path) -> None:
    """(c) With the slave frozen (the link still up), a healthy master must not receipt a
    durable SUBSCRIBE: its record is not on the slave's disk. It does once the slave is
    thawed and has it; the slave then keeps the subscription through a takeover."""
    with BrokerPair("replicated", tmp_path, link_timeout=6) as bp:
        master = bp.wait_master(30)
        slave = bp.other(master)
        wait_for(lambda: master.status().get("amq-ha-peer-state") == "in-sync", 30, "the slave to sync")
        raw = raw_connect(master.port, client_id="gate-c")
        try:
            with frozen(slave):
                raw.sendall(_durable_subscribe_frame("gate-c", "sub-c"))
                early, _closed = read_frames(raw, time.monotonic() + 1.5)
            late, _closed = read_frames(raw, time.monotonic() + 10)
        finally:
            raw.close()
        assert not _receipts(early), f"receipted before the slave had the subscription's record: {early[:3]}"
        assert _receipts(late), f"no receipt once the slave was thawed: {late[:3]}"
        os.kill(master.pid, signal.SIGKILL)
        assert bp.wait_master(30, exclude=master) is slave
        bodies = {f"c-{i}" for i in range(10)}
        with amqtransport.connect(bp.uri) as pub:
            for body in sorted(bodies):
                pub.send(TOPIC, body)
        with amqtransport.connect(bp.uri, client_id="gate-c") as c:
            sub = c.subscribe(TOPIC, ack="client-individual", durable_name="gate-c")
            got = _drain(sub, bodies, 20)
        assert got == bodies, f"the new master's durable subscription missed {sorted(bodies - got)}"
