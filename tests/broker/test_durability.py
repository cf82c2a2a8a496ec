"""Durability with a real broker process: kill -9, restart, torn tails, compaction."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from broker_helpers import StompPy, tear_last_record

from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(90)


def drain(port: int, dest: str, *, expect: int, ack: bool = True, quiet: float = 0.5) -> list[str]:
    c = StompPy(port)
    c.conn.subscribe(dest, id="1", ack="client-individual")
    got = c.get_n(expect) if expect else []
    c.none(quiet)
    if ack and got:
        for m in got:
            c.conn.ack(m.headers["ack"], receipt=f"a-{m.headers['ack']}")
        c.wait_receipts([f"a-{m.headers['ack']}" for m in got])
    c.close()
    return [m.body for m in got]


def test_kill_9_loses_no_receipted_message_and_keeps_acks(tmp_path: Path) -> None:
    n = 300
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        p = StompPy(bp.port)
        rids = [
            p.send("/queue/durable", f"m{i}", **{"amq-idempotency-key": f"k{i}"}) for i in range(n)
        ]
        p.wait_receipts(rids)  # every receipt means: on disk
        # consume and ack the first 100 (receipted acks)
        c = StompPy(bp.port)
        c.conn.subscribe(
            "/queue/durable",
            id="1",
            ack="client-individual",
            headers={"activemq.prefetchSize": "100"},
        )
        first = c.get_n(100)
        for m in first:
            c.conn.ack(m.headers["ack"], receipt=f"a{m.body}")
        c.wait_receipts([f"a{m.body}" for m in first])
        bp.kill()  # SIGKILL: no flush, no goodbye
        bp.start()
        bodies = drain(bp.port, "/queue/durable", expect=n - 100)
        assert bodies == [f"m{i}" for i in range(100, n)]
        # the producer replays everything (as failover would): all duplicates
        p2 = StompPy(bp.port)
        p2.wait_receipts(
            [
                p2.send("/queue/durable", f"m{i}", **{"amq-idempotency-key": f"k{i}"})
                for i in range(n)
            ]
        )
        assert drain(bp.port, "/queue/durable", expect=0) == []
        p2.close()
        assert "Traceback" not in bp.log_text()


def test_torn_tail_recovery(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with BrokerProcess(data, log_dir=tmp_path) as bp:
        p = StompPy(bp.port)
        p.wait_receipts([p.send("/queue/torn", f"m{i}" * 20) for i in range(10)])
        p.close()
        bp.kill()
        seg = sorted((data / "journal").glob("seg-*.log"), key=lambda f: f.stat().st_size)[-1]
        tear_last_record(seg, 15)  # the last record is now cut in the middle
        bp.start()
        assert drain(bp.port, "/queue/torn", expect=9, ack=False) == [
            f"m{i}" * 20 for i in range(9)
        ]
        assert "truncating" in bp.log_text()
        p = StompPy(bp.port)  # the journal takes new records after the cut
        p.wait_receipts([p.send("/queue/torn", "after")])
        p.close()
        bp.restart(hard=True)
        assert drain(bp.port, "/queue/torn", expect=10)[-1] == "after"


def test_compaction_reclaims_segments(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cfg = tmp_path / "broker.toml"
    cfg.write_text("[broker]\nsegment_size = 65536\ncompact_interval_ms = 100\n")
    with BrokerProcess(data, args=["--config", str(cfg)], log_dir=tmp_path) as bp:
        p = StompPy(bp.port)
        body = "x" * 2000
        p.wait_receipts(
            [p.send("/queue/big", body) for i in range(200)]
        )  # ~400 KB: several segments
        segs = list((data / "journal").glob("seg-*.log"))
        assert len(segs) >= 5
        assert len(drain(bp.port, "/queue/big", expect=200)) == 200
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(list((data / "journal").glob("seg-*.log"))) > 2:
            time.sleep(0.1)
        after = list((data / "journal").glob("seg-*.log"))
        assert len(after) <= 2, (len(segs), sorted(a.name for a in after))
        p.close()
        bp.restart(hard=True)
        assert drain(bp.port, "/queue/big", expect=0) == []


def test_sigterm_stops_cleanly(tmp_path: Path) -> None:
    bp = BrokerProcess(tmp_path / "data", log_dir=tmp_path).start()
    try:
        p = StompPy(bp.port)
        p.send("/queue/t", "no receipt asked", receipt=False)
        p.wait_receipts([p.send("/queue/t", "receipted")])
        p.close()
        assert bp.terminate() == 0
        assert "stopped" in bp.log_text()
        bp.start()
        assert drain(bp.port, "/queue/t", expect=2) == ["no receipt asked", "receipted"]
    finally:
        bp.kill()


def amq_broker(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m amqtransport broker ARGS`` to completion (60 s at most), output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "amqtransport", "broker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def test_cli_rejects_a_bad_config_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("max_frame_sise = 10\n")
    result = amq_broker("run", "--config", str(cfg), "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "max_frame_sise" in result.stderr and result.stderr.startswith("error:")
    users = tmp_path / "users"
    users.write_text("no colon here\n")
    result = amq_broker("run", "--users", str(users), "--data-dir", str(tmp_path))
    assert result.returncode == 2 and "user:password" in result.stderr


def test_cli_with_users_file(tmp_path: Path) -> None:
    users = tmp_path / "users"
    hashed = amq_broker("hash-password", "--user", "bob", "pw", check=True).stdout.strip()
    users.write_text(f"# users\nalice:plain\n{hashed}\n")
    with BrokerProcess(tmp_path / "data", args=["--users", str(users)], log_dir=tmp_path) as bp:
        c = StompPy(bp.port, login="bob", passcode="pw")
        c.wait_receipts([c.send("/queue/u", "x")])
        c.close()
        bad = StompPy(bp.port, login="bob", passcode="nope", wait=False)
        assert bad.wait_disconnected(5)
        err = bad.errors.get(timeout=5)
        assert "authentication failed" in err.headers["message"]


def test_kill_9_under_concurrent_producers_and_consumers(tmp_path: Path) -> None:
    """Receipted sends survive, receipted acks stay acked, while everything runs at once."""
    import threading

    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        receipted: set[str] = set()
        acked: set[str] = set()  # ack receipted: must never come back
        ack_sent: set[str] = set()  # ack sent: may or may not have made it
        lock = threading.Lock()
        stop = threading.Event()

        def produce(pid: int) -> None:
            p = StompPy(bp.port)
            i = 0
            while not stop.is_set() and i < 400:
                body = f"p{pid}-{i}"
                rid = p.send("/queue/chaos", body)
                try:
                    p.wait_receipts([rid], timeout=2)
                except AssertionError:
                    return  # the broker died under us
                with lock:
                    receipted.add(body)
                i += 1

        def consume() -> None:
            c = StompPy(bp.port)
            c.conn.subscribe("/queue/chaos", id="1", ack="client-individual", headers={"activemq.prefetchSize": "10"})
            while not stop.is_set():
                try:
                    m = c.messages.get(timeout=0.2)
                except Exception:  # noqa: BLE001 - queue.Empty
                    continue
                rid = f"a-{m.body}"
                with lock:
                    ack_sent.add(m.body)
                c.conn.ack(m.headers["ack"], receipt=rid)
                try:
                    c.wait_receipts([rid], timeout=2)
                except AssertionError:
                    return
                with lock:
                    acked.add(m.body)

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(3)]
        threads += [threading.Thread(target=consume) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with lock:
                if len(receipted) >= 300 and len(acked) >= 100:
                    break
            time.sleep(0.05)
        bp.kill()
        stop.set()
        for t in threads:
            t.join(10)
        with lock:
            sent, done, tried = set(receipted), set(acked), set(ack_sent)
        assert len(sent) >= 300 and len(done) >= 100, (len(sent), len(done))
        bp.start()
        c = StompPy(bp.port)
        c.conn.subscribe("/queue/chaos", id="1", ack="auto")
        left: list[str] = []
        while True:
            try:
                left.append(c.messages.get(timeout=1.0).body)
            except Exception:  # noqa: BLE001 - queue.Empty: drained
                break
        c.close()
        assert not (set(left) & done), "a message whose ack was receipted came back"
        assert sent - tried <= set(left), f"lost: {sorted(sent - tried - set(left))[:5]}"
        assert len(left) == len(set(left))
