"""Durable topic subscriptions with the message stored once (store/fanout.py), seen by
clients of a real broker process: every subscriber gets every message across a kill -9,
one subscriber's acks leave the others' copies, the journal is reclaimed once every
subscriber has acked, and a journal written before the change recovers."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from broker_helpers import StompPy

from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(120)

FIXTURE = Path(__file__).parent / "fixtures" / "journal_v1"


def subscribe(port: int, cid: str, name: str = "s", ack: str = "client-individual", **hdrs: str) -> StompPy:
    c = StompPy(port, client_id=cid)
    c.conn.subscribe(
        "/topic/news", id="d", ack=ack, headers={"activemq.subscriptionName": name, **hdrs}, receipt=f"sub-{cid}"
    )
    c.wait_receipts([f"sub-{cid}"])
    return c


def receive(port: int, cid: str, n: int, *, ack: int = 0, name: str = "s") -> list[str]:
    """The next ``n`` messages of durable subscription ``cid``:``name`` (then nothing more);
    the first ``ack`` of them are acked."""
    c = subscribe(port, cid, name)
    got = c.get_n(n, timeout=20) if n else []
    c.none(0.5)
    for m in got[:ack]:
        c.conn.ack(m.headers["ack"], receipt=f"a-{m.headers['ack']}")
    c.wait_receipts([f"a-{m.headers['ack']}" for m in got[:ack]])
    c.close()
    return [m.body for m in got]


def publish(port: int, bodies: list[str], body: str = "") -> None:
    p = StompPy(port)
    p.wait_receipts([p.send("/topic/news", b + body) for b in bodies])
    p.close()


def test_every_durable_subscriber_gets_every_message_and_acks_only_its_own(tmp_path: Path) -> None:
    """With a page window of 4 the offline subscriptions page from their 5th message on:
    the later copies go straight to their paged lists, as positions of the one record."""
    subs = [f"c{i}" for i in range(6)]
    sent = [f"m{i}" for i in range(30)]
    cfg = tmp_path / "broker.toml"
    cfg.write_text("[broker]\npage_window = 4\n")
    with BrokerProcess(tmp_path / "data", args=["--config", str(cfg)], log_dir=tmp_path) as bp:
        for cid in subs:
            subscribe(bp.port, cid).close()
        publish(bp.port, sent)
        assert receive(bp.port, "c5", 30, ack=30) == sent  # read back from the journal, before any restart
        bp.restart(hard=True)  # SIGKILL: recovery from the journal
        assert receive(bp.port, "c0", 30, ack=10) == sent  # c0 acks the first 10
        bp.restart(hard=True)
        assert receive(bp.port, "c0", 20) == sent[10:]
        for cid in subs[1:5]:
            assert receive(bp.port, cid, 30) == sent, cid
        assert receive(bp.port, "c5", 0) == []
        assert "Traceback" not in bp.log_text()


def test_the_journal_is_reclaimed_once_every_subscriber_has_acked(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cfg = tmp_path / "broker.toml"
    cfg.write_text("[broker]\nsegment_size = 65536\ncompact_interval_ms = 100\n")
    journal = data / "journal"
    with BrokerProcess(data, args=["--config", str(cfg)], log_dir=tmp_path) as bp:
        for cid in ("a", "b", "c"):
            subscribe(bp.port, cid).close()
        sent = [f"m{i}-" for i in range(150)]
        publish(bp.port, sent, "x" * 2000)  # ~300 KB stored once: several segments
        segs = sorted(journal.glob("seg-*.log"))
        assert 4 <= len(segs) <= 8, [s.name for s in segs]  # once, not three times (~15)
        assert len(receive(bp.port, "a", 150, ack=150)) == 150
        assert len(receive(bp.port, "b", 150, ack=150)) == 150
        time.sleep(1)  # compaction runs every 100 ms: c's copies keep every segment
        assert all(s.exists() for s in segs[:-1])
        assert len(receive(bp.port, "c", 150, ack=150)) == 150
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(s.exists() for s in segs[:-1]):
            time.sleep(0.1)
        assert not any(s.exists() for s in segs[:-1]), sorted(s.name for s in journal.glob("seg-*.log"))
        bp.restart(hard=True)
        for cid in ("a", "b", "c"):
            assert receive(bp.port, cid, 0) == []


def test_a_journal_written_before_the_change_recovers_every_message(tmp_path: Path) -> None:
    """tests/broker/fixtures/journal_v1 (written at 6baca03, one Enq per subscription)."""
    shutil.copytree(FIXTURE, tmp_path / "data")
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        assert receive(bp.port, "c1", 15, name="s1") == [f"t{i}" for i in range(5, 20)]
        assert receive(bp.port, "c2", 20, name="s2") == [f"t{i}" for i in range(20)]
        c3 = StompPy(bp.port, client_id="c3")
        c3.conn.subscribe("/topic/news", id="d", ack="auto", headers={"activemq.subscriptionName": "s3",
                                                                       "selector": "n > 9"})
        assert [m.body for m in c3.get_n(10)] == [f"t{i}" for i in range(10, 20)]
        c3.close()
        q = StompPy(bp.port)
        q.conn.subscribe("/queue/plain", id="q", ack="auto")
        assert [m.body for m in q.get_n(5)] == [f"q{i}" for i in range(5)]
        q.close()
        assert "Traceback" not in bp.log_text()
