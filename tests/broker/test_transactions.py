"""Transactions with real broker processes: a COMMIT is one atomic journal record with
everything it does -- queue messages, the durable subscribers' copies of its topic
messages and their idempotency keys, its acks -- and survives SIGKILL and fail-over."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_helpers import StompPy

from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(120)

KEY = "amq-idempotency-key"


def subscribe_durable(port: int, *, consume: int = 0) -> list[str]:
    """(Re-)attach durable subscriber c1/s of /topic/t; returns the bodies it gets."""
    d = StompPy(port, client_id="c1")
    d.conn.subscribe("/topic/t", id="d", ack="auto", headers={"activemq.subscriptionName": "s"}, receipt="s")
    d.wait_receipts(["s"])
    got = [m.body for m in d.get_n(consume)] if consume else []
    d.none(0.5)
    d.close()
    return got


def queue_bodies(port: int, dest: str, n: int) -> list[str]:
    c = StompPy(port)
    c.conn.subscribe(dest, id="1", ack="auto")
    got = [m.body for m in c.get_n(n)] if n else []
    c.none(0.5)
    c.close()
    return got


def commit_mixed(port: int, tag: str, receipt: str = "c") -> None:
    """One transaction: a persistent SEND to /queue/q and one to /topic/t, each with a key."""
    p = StompPy(port)
    p.conn.begin("tx")
    for dest in ("/queue/q", "/topic/t"):
        p.conn.send(dest, f"{dest} {tag}", headers={"persistent": "true", KEY: f"k-{dest}"}, transaction="tx")
    p.conn.commit("tx", receipt=receipt)
    p.wait_receipts([receipt])
    p.close()


def test_a_torn_commit_record_takes_all_of_the_transaction_or_none(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with BrokerProcess(data, log_dir=tmp_path) as bp:
        subscribe_durable(bp.port)
        commit_mixed(bp.port, "1")
        bp.kill()
        # a crash while the commit's bytes were reaching the disk: its tail is torn
        seg = max((data / "journal").glob("seg-*.log"))
        seg.write_bytes(seg.read_bytes()[:-10])
        bp.start()
        in_queue = queue_bodies(bp.port, "/queue/q", 0)
        copies = subscribe_durable(bp.port)
        assert in_queue == copies == [], "a transaction was half applied"


def test_committed_topic_keys_survive_kill_9(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        subscribe_durable(bp.port)
        commit_mixed(bp.port, "1")
        bp.kill()
        bp.start()
        commit_mixed(bp.port, "replayed")  # a client replaying the commit after a failover
        assert queue_bodies(bp.port, "/queue/q", 1) == ["/queue/q 1"]
        assert subscribe_durable(bp.port, consume=1) == ["/topic/t 1"]
        assert "Traceback" not in bp.log_text()


def test_a_slave_applies_the_commit_record_and_its_keys(tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path / "pair", link_timeout=1.0) as pair:
        master = pair.wait_master()
        pair.wait_in_sync()
        subscribe_durable(master.port)
        commit_mixed(master.port, "1")  # receipted: on both nodes
        pair.kill_master()
        new = pair.wait_master(exclude=master)
        commit_mixed(new.port, "replayed")
        assert queue_bodies(new.port, "/queue/q", 1) == ["/queue/q 1"]
        assert subscribe_durable(new.port, consume=1) == ["/topic/t 1"]
