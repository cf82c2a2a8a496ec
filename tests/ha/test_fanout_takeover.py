"""A durable topic message stored once (a Fan record, store/fanout.py) reaches the slave in
the record stream: after a SIGKILL of the master every durable subscriber of the new
master still gets every message, the ones acked before the takeover excepted."""

from __future__ import annotations

from pathlib import Path

import pytest

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(180)


def drain(uri: str, cid: str, n: int, ack: int = 0) -> list[str]:
    got: list[str] = []
    with amqtransport.connect(uri, client_id=cid) as c:
        sub = c.subscribe("/topic/fan", durable_name="s", ack="client-individual")
        while len(got) < n and (m := sub.receive(timeout=20)) is not None:
            got.append(m.text)
            if len(got) <= ack:
                m.ack()
        while (m := sub.receive(timeout=0.5)) is not None:
            got.append(m.text)
        if ack:
            c.send("/queue/fence", "x")  # its receipt (both disks) covers the acks before it
    return got


def test_every_durable_subscriber_gets_every_message_after_a_takeover(tmp_path: Path) -> None:
    subs = ["a", "b", "c", "d"]
    with BrokerPair("replicated", tmp_path) as bp:
        bp.wait_in_sync(30)
        for cid in subs:
            with amqtransport.connect(bp.uri, client_id=cid) as c:
                c.subscribe("/topic/fan", durable_name="s", ack="client-individual")
        with amqtransport.connect(bp.uri) as c:
            for i in range(20):
                c.send("/topic/fan", f"before-{i}")
        assert drain(bp.uri, "a", 20, ack=5)[:5] == [f"before-{i}" for i in range(5)]
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        with amqtransport.connect(bp.uri) as c:
            for i in range(10):
                c.send("/topic/fan", f"after-{i}")
        want = [f"before-{i}" for i in range(20)] + [f"after-{i}" for i in range(10)]
        assert drain(bp.uri, "a", 25) == want[5:]
        for cid in subs[1:]:
            assert drain(bp.uri, cid, 30) == want, cid
