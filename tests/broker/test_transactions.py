"""Transactions with real broker processes: a COMMIT is one atomic journal record with
everything it does -- queue messages, the durable subscribers' copies of its topic
messages and their idempotency keys, its acks -- and survives SIGKILL and fail-over."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from broker_helpers import Raw, StompPy, tear_last_record

from amqtransport.broker import BrokerConfig, EmbeddedBroker
from amqtransport.broker.dispatch.core import BrokerCore
from amqtransport.broker.dispatch.errors import CoreError
from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.dispatch.model import Subscription, TxState
from amqtransport.broker.store import MessageStore
from amqtransport.stomp import Frame, serialize
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
        tear_last_record(seg, 10)  # the crash tore the record's tail
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


# ---------------------------------------------------------------------- open transactions' size

MIB = 1024 * 1024


def tx_send_frames(tx: str, n: int, size: int, dest: str = "/queue/big") -> list[bytes]:
    return [
        serialize(Frame.make("SEND", {"destination": dest, "transaction": tx, "receipt": f"s{i}"}, b"x" * size))
        for i in range(n)
    ]


def read_until_error(raw: Raw, timeout: float = 30.0) -> tuple[set[str], Frame]:
    """Receipts read before the broker's ERROR, and the ERROR."""
    receipts: set[str] = set()
    while True:
        f = raw.read(timeout=timeout)
        if f.command == "ERROR":
            return receipts, f
        receipts.add(f.get("receipt-id") or "")


def memory(b: EmbeddedBroker) -> dict[str, Any]:
    m = b.stats()["memory"]
    assert isinstance(m, dict)
    return m


def test_open_transactions_count_against_the_memory_limit(make_broker: Callable[..., EmbeddedBroker]) -> None:
    """40 MiB into one open transaction on a broker with memory_limit = 5 MiB: the
    transaction's bytes are counted, and once the limit is reached its next SEND is
    refused (it cannot wait for memory its own transaction holds) and it is rolled back."""
    b = make_broker(memory_limit=5 * MIB, fsync=False)
    p = Raw(b.port)
    p.connect()
    p.send(Frame.make("BEGIN", {"transaction": "t", "receipt": "b"}))
    assert p.read().get("receipt-id") == "b"
    frames = tx_send_frames("t", 40, MIB)

    def write() -> None:
        with contextlib.suppress(OSError):  # the broker closes the connection after its ERROR
            for f in frames:
                p.send_raw(f)

    threading.Thread(target=write, daemon=True).start()
    receipts, error = read_until_error(p)
    assert error.get("receipt-id") in {f"s{i}" for i in range(40)}
    message = error.get("message") or ""
    assert "memory limit" in message and "open transactions hold" in message, message
    assert 4 <= len(receipts) <= 6, receipts  # about memory_limit's worth was accepted
    assert p.closed()
    st = memory(b)
    assert st["peak"] >= 5 * MIB and st["peak"] < 7 * MIB
    assert st["usage"] == 0 and st["transactions"] == 0 and not st["flow_control"]  # rolled back
    q = Raw(b.port)
    q.connect()
    q.send(Frame.make("SUBSCRIBE", {"id": "1", "destination": "/queue/big", "receipt": "sub"}))
    assert q.read().get("receipt-id") == "sub"
    with pytest.raises(AssertionError, match="no frame"):
        q.read(timeout=0.5)  # nothing of the rolled-back transaction was enqueued


def test_max_transaction_size_refuses_a_larger_transaction(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(max_transaction_size=1 * MIB, fsync=False)
    p = Raw(b.port)
    p.connect()
    p.send(Frame.make("BEGIN", {"transaction": "t"}))
    for f in tx_send_frames("t", 3, 400 * 1024):
        p.send_raw(f)
    receipts, error = read_until_error(p)
    assert receipts == {"s0", "s1"} and error.get("receipt-id") == "s2"
    assert "max_transaction_size=1048576" in (error.get("message") or "")
    assert memory(b)["transactions"] == 0
    # a transaction within the limit on another connection is unaffected
    c = StompPy(b.port)
    c.conn.begin("ok")
    c.conn.send("/queue/big", "small", headers={"persistent": "true"}, transaction="ok")
    c.conn.commit("ok", receipt="c")
    c.wait_receipts(["c"])
    assert queue_bodies(b.port, "/queue/big", 1) == ["small"]
    c.close()


class Sink:
    """A connection as the core sees it (unit test of the core with a real store)."""

    writable = True

    def __init__(self) -> None:
        self.got: list[str] = []

    def deliver(self, sub: Subscription, message: Message, delivery_count: int) -> None:
        self.got.append(message.id)


def test_a_commit_over_the_journal_record_limit_is_refused_and_rolled_back(tmp_path: Path) -> None:
    """A transaction's record over the journal's recovery limit is refused with a clear
    error, and the transaction is rolled back (its durable topic messages included)."""
    store = MessageStore(tmp_path, max_record=8192)
    store.open()
    core = BrokerCore(BrokerConfig(), store, clock=time.time, monotonic=time.monotonic)
    sink = Sink()
    for i in range(3):
        core.subscribe(sink, f"d{i}", "/topic/t", durable_name=f"s{i}", client_id="c")
    core.send("/queue/q", (), b"m", persistent=True)
    consumer = core.subscribe(sink, "q", "/queue/q", ack_mode="client-individual")
    [mid] = sink.got
    tx = TxState("t")
    core.acks.ack(consumer, mid, tx=tx)
    for _ in range(3):  # 3 messages (stored once each, for 3 subscriptions): > 8192 bytes
        core.transactions.tx_send(tx, "/topic/t", (), b"x" * 3000, persistent=True)
    assert core.memory.reserved > 3000
    with pytest.raises(CoreError, match="transaction 't' cannot be committed: .* over the journal's limit"):
        core.transactions.commit(tx)
    assert core.memory.reserved == 0
    assert sink.got == [mid, mid]  # the ack was rolled back: redelivered
    assert list(store.live) == [mid]  # nothing of the transaction was written
    assert all(not core.queues[f"durable:c:s{i}"].messages for i in range(3))
    store.close()
