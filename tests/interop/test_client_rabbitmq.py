"""The client against a real RabbitMQ (Debian's rabbitmq-server, STOMP plugin).

One node for the session (amqtransport/testing/rabbitmq_fixtures.py); every test uses
its own destinations. What differs from ActiveMQ and our broker (see
docs/brokers/rabbitmq.md): the ``host`` header is the virtual host, prefetch is
``prefetch-count``, a transactional SEND is answered after its COMMIT, a durable topic
subscription is a queue named from (topic, id), a NACK in client mode is cumulative,
and nothing deduplicates by header: a replayed SEND may be stored twice and the
client's duplicate filter (keyed on our idempotency header, as ``message-id``
changes on every delivery) hides the copy from the application.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

import amqtransport
from amqtransport.errors import AuthenticationError, BrokerError, LocalProtocolError
from amqtransport.testing.rabbitmq import RabbitMQNode

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(180)]


def q(name: str) -> str:
    """A destination name of its own for this test run (the node is shared)."""
    return f"{name}.{uuid.uuid4().hex[:8]}"


def drain(sub: amqtransport.Subscription, n: int, timeout: float = 20.0, ack: bool = True) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        msg = sub.receive(0.5)
        if msg is not None:
            got.append(msg.text)
            if ack:
                msg.ack()
    return got


class Events:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.resumed = threading.Event()
        self.interrupted = threading.Event()

    def on_interrupted(self, error: BaseException) -> None:
        self.calls.append(("interrupted", error))
        self.interrupted.set()

    def on_resumed(self, address: str) -> None:
        self.calls.append(("resumed", address))
        self.resumed.set()


# -- connecting ------------------------------------------------------------------------------


def test_default_connect_works_and_detects_the_dialect(rabbitmq: RabbitMQNode) -> None:
    """No options at all: vhost '/', the default guest login, the dialect from 'server'."""
    with amqtransport.connect(f"failover:({rabbitmq.uri})") as conn:
        assert conn.dialect == "rabbitmq"
        assert (conn.server or "").startswith("RabbitMQ/")
        dest = "/queue/" + q("connect")
        sub = conn.subscribe(dest, ack="client-individual")
        conn.send(dest, "hello")
        assert drain(sub, 1) == ["hello"]


def test_wrong_password_is_an_authentication_error_and_stops_failover(rabbitmq: RabbitMQNode) -> None:
    t0 = time.monotonic()
    with pytest.raises(AuthenticationError, match="Access refused for user 'guest'"):
        amqtransport.connect(f"failover:({rabbitmq.uri})", login="guest", passcode="wrong")
    assert time.monotonic() - t0 < 15


def test_unknown_vhost_names_the_reason(rabbitmq: RabbitMQNode) -> None:
    with pytest.raises(AuthenticationError, match="Virtual host 'nope' access denied"):
        amqtransport.connect(f"{rabbitmq.uri}?vhost=nope")
    with amqtransport.connect(f"failover:({rabbitmq.uri})?vhost=/") as conn:
        assert conn.is_connected


# -- receipts, ack modes, NACK -------------------------------------------------------------------


def test_receipted_pipelined_sends_all_arrive(rabbitmq: RabbitMQNode) -> None:
    dest = "/queue/" + q("receipts")
    with amqtransport.connect(rabbitmq.uri) as conn:
        with conn.producer(window=200) as producer:
            for i in range(2000):
                producer.send(dest, f"m{i}", idempotency_key=f"r-{i}")
        assert producer.receipted == 2000
        sub = conn.subscribe(dest, ack="client-individual", prefetch=500)
        got = drain(sub, 2000, timeout=60)
    assert got == [f"m{i}" for i in range(2000)]


@pytest.mark.parametrize("mode", ["auto", "client", "client-individual"])
def test_ack_modes(rabbitmq: RabbitMQNode, mode: str) -> None:
    dest = "/queue/" + q(f"ack-{mode}")
    with amqtransport.connect(rabbitmq.uri) as conn:
        for i in range(6):
            conn.send(dest, f"m{i}")
        sub = conn.subscribe(dest, ack=mode, prefetch=10)  # type: ignore[arg-type]
        msgs = [sub.receive(10) for _ in range(6)]
        assert [m.text for m in msgs if m is not None] == [f"m{i}" for i in range(6)]
        if mode == "client":
            msgs[2].ack()  # type: ignore[union-attr]  # cumulative: m0..m2
        elif mode == "client-individual":
            for m in msgs[:3]:
                m.ack()  # type: ignore[union-attr]
    # what was not acknowledged comes back to the next consumer
    with amqtransport.connect(rabbitmq.uri) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        again = drain(sub, 3, timeout=5 if mode == "auto" else 20)
        assert sub.receive(0.5) is None
    assert sorted(again) == ([] if mode == "auto" else ["m3", "m4", "m5"])


def test_nack_client_individual_redelivers_that_message(rabbitmq: RabbitMQNode) -> None:
    dest = "/queue/" + q("nack-ci")
    with amqtransport.connect(rabbitmq.uri) as conn:
        for i in range(3):
            conn.send(dest, f"m{i}", idempotency_key=f"nci-{i}")
        sub = conn.subscribe(dest, ack="client-individual", prefetch=10)
        m0, m1, m2 = (sub.receive(10) for _ in range(3))
        assert m0 is not None and m1 is not None and m2 is not None
        m1.nack()
        again = sub.receive(10)
        assert again is not None and again.text == "m1" and again.redelivered
        for m in (m0, m2, again):
            m.ack()
        assert sub.receive(0.5) is None


def test_nack_client_mode_is_cumulative_and_the_client_agrees(rabbitmq: RabbitMQNode) -> None:
    """RabbitMQ requeues every earlier unacked message on a client-mode NACK: the
    filter lets all of them through again (it dropped them as duplicates before), and
    acking a rejected one is refused locally (RabbitMQ would answer 'unknown delivery
    tag' and close the connection)."""
    dest = "/queue/" + q("nack-c")
    with amqtransport.connect(rabbitmq.uri) as conn:
        for i in range(3):
            conn.send(dest, f"m{i}", idempotency_key=f"nc-{i}")
        sub = conn.subscribe(dest, ack="client", prefetch=10)
        m0, m1, m2 = (sub.receive(10) for _ in range(3))
        assert m0 is not None and m1 is not None and m2 is not None
        m1.nack()
        with pytest.raises(LocalProtocolError, match="cumulative"):
            m0.ack()
        again = [sub.receive(10), sub.receive(10)]
        assert sorted(m.text for m in again if m is not None) == ["m0", "m1"]
        assert all(m is not None and m.redelivered for m in again)
        again[-1].ack()  # type: ignore[union-attr]  # cumulative: m2 and both redeliveries
        conn.send(dest, "after")  # the connection is alive and well
        last = sub.receive(10)
        assert last is not None and last.text == "after"
        last.ack()
    with amqtransport.connect(rabbitmq.uri) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        assert sub.receive(1.0) is None  # nothing left unacked


# -- transactions ------------------------------------------------------------------------------------


def test_transaction_commit_and_abort(rabbitmq: RabbitMQNode) -> None:
    """Transactional sends no longer wait for receipts RabbitMQ sends only after the
    COMMIT (the first tx.send hung forever before)."""
    dest = "/queue/" + q("tx")
    with amqtransport.connect(rabbitmq.uri) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        t0 = time.monotonic()
        with conn.transaction() as tx:
            for i in range(5):
                tx.send(dest, f"c{i}")
            assert sub.receive(0.3) is None  # nothing before the commit
        assert time.monotonic() - t0 < 10
        assert drain(sub, 5) == [f"c{i}" for i in range(5)]
        with pytest.raises(RuntimeError):
            with conn.transaction() as tx:
                tx.send(dest, "aborted")
                raise RuntimeError("application failure")
        conn.send(dest, "plain")
        assert drain(sub, 1) == ["plain"]


def test_transactional_ack(rabbitmq: RabbitMQNode) -> None:
    dest, out = "/queue/" + q("txack-in"), "/queue/" + q("txack-out")
    with amqtransport.connect(rabbitmq.uri) as conn:
        conn.send(dest, "work-1")
        conn.send(dest, "work-2")
        sub = conn.subscribe(dest, ack="client-individual", prefetch=1)
        msg = sub.receive(10)
        assert msg is not None and msg.text == "work-1"
        with pytest.raises(RuntimeError):
            with conn.transaction() as tx:  # consume and produce atomically; this one fails
                tx.ack(msg)
                tx.send(out, "result-1")
                raise RuntimeError("boom")
    with amqtransport.connect(rabbitmq.uri) as conn:
        # both are there (the aborted ACK did not count); RabbitMQ may requeue work-1
        # behind work-2 when the first connection's close races this subscribe
        sub = conn.subscribe(dest, ack="client-individual", prefetch=2)
        msgs = {m.text: m for m in (sub.receive(10), sub.receive(10)) if m is not None}
        assert sorted(msgs) == ["work-1", "work-2"]
        with conn.transaction() as tx:
            tx.ack(msgs["work-1"])
            tx.send(out, "result-1")
        msgs["work-2"].ack()
        results = conn.subscribe(out, ack="client-individual")
        assert drain(results, 1) == ["result-1"]
        assert results.receive(0.5) is None
    with amqtransport.connect(rabbitmq.uri) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        assert sub.receive(1.0) is None  # the committed ACK counted


# -- durable subscriptions -------------------------------------------------------------------------


def test_durable_subscription_created_offline_resumed_deleted(rabbitmq: RabbitMQNode) -> None:
    topic = "/topic/" + q("durable")
    name = q("sub")
    with amqtransport.connect(rabbitmq.uri, client_id="app-1") as conn:
        sub = conn.subscribe(topic, ack="client-individual", durable_name=name)
        conn.send(topic, "online")
        assert drain(sub, 1) == ["online"]
    # offline: the subscription keeps collecting
    with amqtransport.connect(rabbitmq.uri) as producer:
        for i in range(3):
            producer.send(topic, f"offline-{i}")
    with amqtransport.connect(rabbitmq.uri, client_id="app-1") as conn:
        sub = conn.subscribe(topic, ack="client-individual", durable_name=name)
        assert drain(sub, 3) == [f"offline-{i}" for i in range(3)]
        t0 = time.monotonic()
        sub.unsubscribe(durable=True)  # deletes it (hung before: wrong id, no receipt)
        assert time.monotonic() - t0 < 10
    with amqtransport.connect(rabbitmq.uri) as producer:
        producer.send(topic, "after-delete")
    with amqtransport.connect(rabbitmq.uri, client_id="app-1") as conn:
        sub = conn.subscribe(topic, ack="client-individual", durable_name=name)
        assert sub.receive(1.0) is None, "the deleted subscription kept a message"
        sub.unsubscribe(durable=True)


def test_durable_subscription_survives_unsubscribe_without_durable(rabbitmq: RabbitMQNode) -> None:
    topic = "/topic/" + q("durable2")
    name = q("sub")
    with amqtransport.connect(rabbitmq.uri) as conn:
        sub = conn.subscribe(topic, durable_name=name)
        sub.unsubscribe()  # stops receiving; the subscription stays
        conn.send(topic, "kept")
        sub2 = conn.subscribe(topic, ack="client-individual", durable_name=name)
        assert drain(sub2, 1) == ["kept"]
        sub2.unsubscribe(durable=True)


# -- prefetch, heart-beats ---------------------------------------------------------------------------


def test_prefetch_spreads_messages_over_two_consumers(rabbitmq: RabbitMQNode) -> None:
    """Without prefetch-count RabbitMQ has no limit: the first consumer took everything."""
    dest = "/queue/" + q("prefetch")
    with amqtransport.connect(rabbitmq.uri) as a, amqtransport.connect(rabbitmq.uri) as b:
        sub_a = a.subscribe(dest, ack="client-individual", prefetch=5)
        sub_b = b.subscribe(dest, ack="client-individual", prefetch=5)
        with amqtransport.connect(rabbitmq.uri) as producer:
            for i in range(20):
                producer.send(dest, f"m{i}")
        time.sleep(1.0)
        assert (sub_a.pending(), sub_b.pending()) == (5, 5)
        got: list[str] = []
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            for sub in (sub_a, sub_b):
                msg = sub.receive(0.1)
                if msg is not None:
                    got.append(msg.text)
                    msg.ack()
    assert sorted(got) == sorted(f"m{i}" for i in range(20))


def test_default_prefetch_still_spreads(rabbitmq: RabbitMQNode) -> None:
    dest = "/queue/" + q("prefetch-default")
    with amqtransport.connect(rabbitmq.uri) as producer:
        for i in range(1500):
            producer.send(dest, f"m{i}", receipt=i % 100 == 99)
        producer.send(dest, "last")
    with amqtransport.connect(rabbitmq.uri) as a, amqtransport.connect(rabbitmq.uri) as b:
        sub_a = a.subscribe(dest, ack="client-individual")
        sub_b = b.subscribe(dest, ack="client-individual")
        deadline = time.monotonic() + 20
        while sub_a.pending() + sub_b.pending() < 1501 and time.monotonic() < deadline:
            time.sleep(0.1)
        # DEFAULT_PREFETCH (1000): a cannot take everything, b gets the rest
        assert sub_a.pending() <= 1000 and sub_b.pending() >= 501
        assert sub_a.pending() + sub_b.pending() == 1501


def test_heartbeats_keep_an_idle_link_and_detect_a_frozen_broker(rabbitmq: RabbitMQNode) -> None:
    events = Events()
    with amqtransport.connect(f"failover:({rabbitmq.uri})?initialReconnectDelay=100&maxReconnectDelay=500",
                              heartbeat=(500, 500), listener=events) as conn:
        link = conn.transport.link
        assert link is not None and 0 < link.send_every_ms <= 1000 and 0 < link.expect_every_ms <= 1000
        time.sleep(2.5)  # idle: beats both ways keep it
        assert events.calls == []
        assert rabbitmq.pid is not None
        os.kill(rabbitmq.pid, signal.SIGSTOP)
        try:
            assert events.interrupted.wait(10), "a frozen broker was not noticed"
            assert type(events.calls[0][1]).__name__ == "HeartbeatTimeout"
        finally:
            os.kill(rabbitmq.pid, signal.SIGCONT)
        assert events.resumed.wait(60)
        dest = "/queue/" + q("hb")
        conn.send(dest, "after")


# -- failover through kill -9 ------------------------------------------------------------------------


def test_failover_through_kill_9_loses_nothing_and_shows_no_duplicate(rabbitmq: RabbitMQNode) -> None:
    """A receipted producer through a SIGKILL of RabbitMQ and its restart: every
    receipted message is there after, and the application sees each once (RabbitMQ
    may store a replayed send twice: the consumer's filter drops the copy)."""
    dest = "/queue/" + q("kill9")
    total, kill_at = 3000, 600
    events = Events()
    receipted: list[int] = []
    uri = f"failover:({rabbitmq.uri})?initialReconnectDelay=100&maxReconnectDelay=1000"
    restarter: threading.Thread | None = None
    # the queue exists before the crash, as in production: RabbitMQ can lose a queue
    # declared seconds before a kill -9 (see RabbitMQNode.persist_definitions)
    with amqtransport.connect(rabbitmq.uri) as conn:
        conn.send(dest, "declared", idempotency_key="kill9-declare")
    rabbitmq.persist_definitions()
    with amqtransport.connect(uri, listener=events, heartbeat=(1000, 1000)) as conn:
        with conn.producer(window=50) as producer:
            for i in range(total):
                producer.send(dest, f"m{i}", idempotency_key=f"kill9-{i}")
                if i == kill_at:
                    rabbitmq.kill()
                    restarter = threading.Thread(target=rabbitmq.start)
                    restarter.start()
            producer.flush()
            receipted = list(range(total))
        assert events.resumed.is_set() and events.interrupted.is_set()
    assert restarter is not None
    restarter.join(120)
    print("queues after the restart:", {k: v for k, v in rabbitmq.queues().items() if "kill9" in k})
    with amqtransport.connect(rabbitmq.uri) as conn:
        sub = conn.subscribe(dest, ack="client-individual", prefetch=1000)
        got: list[str] = []
        deadline = time.monotonic() + 60
        while len(got) < total + 1 and time.monotonic() < deadline:
            msg = sub.receive(1.0)
            if msg is not None:
                got.append(msg.text)
                msg.ack()
        got.remove("declared")
        extra = sub.receive(2.0)
        dropped = conn.duplicates
    assert extra is None, f"more than sent: {extra}"
    assert len(got) == len(set(got)), "the application saw a duplicate"
    missing = {f"m{i}" for i in receipted} - set(got)
    assert not missing, f"{len(missing)} receipted messages lost, e.g. {sorted(missing)[:5]}"
    print(f"kill -9 under a receipted producer: {total} sent, {len(got)} received, {dropped} copies dropped")


# -- the command line with no options ----------------------------------------------------------------


def test_amq_send_and_recv_with_no_extra_options(rabbitmq: RabbitMQNode) -> None:
    """The issue's "done when", on the session node's port instead of 61613."""
    dest = "/queue/" + q("cli")
    amq = [sys.executable, "-m", "amqtransport"]
    uri = f"failover:(tcp://127.0.0.1:{rabbitmq.stomp_port})"
    sent = subprocess.run([*amq, "send", uri, dest, "--count", "1000", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert sent.returncode == 0, sent.stderr
    summary = json.loads(sent.stdout.strip().splitlines()[-1])
    assert summary["sent"] == 1000 and summary["dialect"] == "rabbitmq"
    assert summary["server"].startswith("RabbitMQ/")
    got = subprocess.run([*amq, "recv", uri, dest, "--count", "1000", "--timeout", "10", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout.strip().splitlines()[-1])["received"] == 1000
    bad = subprocess.run([*amq, "send", uri, dest, "--count", "1", "--vhost", "nope"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "Virtual host 'nope' access denied" in bad.stderr


def test_refused_destination_fails_the_send_not_the_connection(rabbitmq: RabbitMQNode) -> None:
    """RabbitMQ answers a SEND to an unknown destination type with an ERROR that has
    no receipt-id and leaves the link open: the send fails, the connection goes on."""
    with amqtransport.connect(f"failover:({rabbitmq.uri})") as conn:
        t0 = time.monotonic()
        with pytest.raises(BrokerError, match="not a valid destination"):
            conn.send("/nowhere/x", "lost")
        assert time.monotonic() - t0 < 30
        dest = "/queue/" + q("after-error")
        sub = conn.subscribe(dest)
        conn.send(dest, "ok")
        assert drain(sub, 1) == ["ok"]
