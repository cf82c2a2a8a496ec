"""Broker dialects on scripted endpoints: the exact frames each dialect sends.

The scripted broker announces itself with a ``server`` header (RabbitMQ/3.10.8,
ActiveMQ/5.17.2, ActiveMQ-Artemis/2.31.2, amqtransport/0.1); the client must detect
the dialect from it or take the URI's ``dialect`` option. Real brokers:
tests/interop/test_client_rabbitmq.py, test_dedupe_brokers.py.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import amqtransport
from amqtransport._backends.memory import MemoryBackend, MemoryStream, ScriptedBroker
from amqtransport.errors import LocalProtocolError, TransactionInDoubt
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.testing.wait import wait_for
from amqtransport.transports.dialect import DIALECT_NAMES, detect

pytestmark = pytest.mark.timeout(30)

SERVERS = {"rabbitmq": "RabbitMQ/3.10.8", "activemq": "ActiveMQ/5.17.2", "artemis": "ActiveMQ-Artemis/2.31.2",
           "amq": "amqtransport/0.1"}


def broker_of(kind: str) -> tuple[MemoryBackend, ScriptedBroker]:
    backend = MemoryBackend()
    broker = backend.add("a:1")
    broker.server = SERVERS[kind]
    return backend, broker


@pytest.mark.parametrize(("server", "name"), [
    ("RabbitMQ/3.10.8", "rabbitmq"), ("ActiveMQ/5.17.2", "activemq"), ("ActiveMQ-Artemis/2.31.2", "artemis"),
    ("amqtransport/0.1", "amq"), ("Apache/Apollo 1.7", "generic"), (None, "generic"), ("", "generic")])
def test_detect_from_the_server_header(server: str | None, name: str) -> None:
    assert detect(server).name == name


@pytest.mark.parametrize("kind", DIALECT_NAMES)
def test_connected_info_names_the_dialect(kind: str) -> None:
    backend, broker = broker_of(kind)
    with amqtransport.connect("failover:(tcp://a:1)", backend=backend) as conn:
        assert conn.dialect == kind and conn.server == SERVERS[kind]
    backend, broker = broker_of("activemq")
    with amqtransport.connect(f"tcp://a:1?dialect={kind}", backend=backend) as conn:
        assert conn.dialect == kind  # the URI option wins over the server header


def test_host_header_is_the_vhost_slash_by_default() -> None:
    backend, broker = broker_of("rabbitmq")
    with amqtransport.connect("tcp://a:1", backend=backend):
        pass
    with amqtransport.connect("failover:(tcp://a:1)?vhost=/prod", backend=backend):
        pass
    with amqtransport.connect("tcp://a:1?host=/leaf", backend=backend, vhost="/kwarg"):
        pass
    assert [f.get("host") for f in broker.frames("CONNECT")] == ["/", "/prod", "/kwarg"]


@pytest.mark.parametrize(("kind", "expected"), [
    ("rabbitmq", {"prefetch-count": "7"}),
    ("activemq", {"activemq.prefetchSize": "7"}),
    ("amq", {"activemq.prefetchSize": "7"}),
    ("artemis", {"consumer-window-size": str(7 * 1024)}),  # bytes there, not messages
])
def test_prefetch_header_per_dialect(kind: str, expected: dict[str, str]) -> None:
    backend, broker = broker_of(kind)
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        conn.subscribe("/queue/p", prefetch=7)
        conn.subscribe("/queue/none")
    with_prefetch, without = broker.frames("SUBSCRIBE")
    keys = {"prefetch-count", "activemq.prefetchSize", "consumer-window-size"}
    assert {k: v for k, v in with_prefetch.header_map.items() if k in keys} == expected
    # RabbitMQ has no limit of its own: one is always sent there
    assert {k: v for k, v in without.header_map.items() if k in keys} == (
        {"prefetch-count": "1000"} if kind == "rabbitmq" else {})


def test_durable_subscription_frames_activemq() -> None:
    backend, broker = broker_of("activemq")
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        with pytest.raises(LocalProtocolError, match="client_id"):
            conn.subscribe("/topic/t", durable_name="orders")
        with pytest.raises(ValueError, match="queue"):
            conn.subscribe("/queue/q", durable_name="orders")
    with amqtransport.connect("tcp://a:1", backend=backend, client_id="app-1") as conn:
        sub = conn.subscribe("/topic/t", durable_name="orders")
        sub.unsubscribe(durable=True)
    assert broker.frames("CONNECT")[-1].get("client-id") == "app-1"
    (subscribe,) = broker.frames("SUBSCRIBE")
    assert subscribe.get("activemq.subscriptionName") == "orders"
    plain, delete = broker.frames("UNSUBSCRIBE")  # the consumer first, then the subscription
    assert plain.header_map.keys() <= {"id", "receipt"} and plain.get("id") == sub.id
    assert delete.get("activemq.subscriptionName") == "orders" and delete.get("client-id") == "app-1"


def test_durable_subscription_frames_rabbitmq() -> None:
    backend, broker = broker_of("rabbitmq")
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:  # no client id needed there
        sub = conn.subscribe("/topic/t", durable_name="orders")
        sub.unsubscribe()  # keeps it
        again = conn.subscribe("/topic/t", durable_name="orders")
        assert again.id == sub.id  # the queue is named from (topic, id): the id must be stable
        again.unsubscribe(durable=True)
    s1, s2 = broker.frames("SUBSCRIBE")
    assert s1.get("durable") == "true" and s1.get("auto-delete") == "false"
    u1, u2 = broker.frames("UNSUBSCRIBE")
    assert u1.get("durable") is None and u2.get("durable") == "true"


def test_durable_subscription_frames_artemis() -> None:
    backend, broker = broker_of("artemis")
    with amqtransport.connect("tcp://a:1", backend=backend, client_id="c") as conn:
        conn.subscribe("/topic/t", durable_name="orders").unsubscribe(durable=True)
    assert broker.frames("SUBSCRIBE")[0].get("durable-subscription-name") == "orders"
    assert broker.frames("UNSUBSCRIBE")[-1].get("durable-subscription-name") == "orders"


def test_durable_unsubscribe_is_replayed_after_a_failover() -> None:
    """Deleting a durable subscription is broker state: unlike a plain UNSUBSCRIBE it
    is written again on the next link when its receipt did not come."""
    backend = MemoryBackend()
    a, b = backend.add("a:1"), backend.add("b:2")
    a.server = b.server = SERVERS["activemq"]
    resumed = threading.Event()

    class L:
        def on_resumed(self, address: str) -> None:
            resumed.set()

    with amqtransport.connect("failover:(tcp://a:1,tcp://b:2)?randomize=false", backend=backend, client_id="c",
                              sleep=lambda s: None, listener=L()) as conn:
        sub = conn.subscribe("/topic/t", durable_name="orders")

        def drop_on_durable_unsubscribe(stream: MemoryStream, frame: Frame) -> bool:
            if frame.command == "UNSUBSCRIBE" and frame.get("activemq.subscriptionName"):
                a.up = False
                stream.hang_up()
                return True
            return False

        a.on_frame = drop_on_durable_unsubscribe
        sub.unsubscribe(durable=True)
        assert resumed.wait(5)
    assert [f.get("activemq.subscriptionName") for f in b.frames("UNSUBSCRIBE")] == ["orders"]
    assert b.frames("SUBSCRIBE") == []  # the subscription itself is not replayed


@pytest.mark.parametrize(("uri", "has_length"), [
    ("tcp://a:1?dialect=activemq", False), ("tcp://a:1?dialect=artemis", False), ("tcp://a:1?dialect=rabbitmq", True),
    ("tcp://a:1?dialect=amq", True), ("tcp://a:1?dialect=rabbitmq&textMode=true", False),
    ("tcp://a:1?dialect=activemq&textMode=false", True)])
def test_text_mode(uri: str, has_length: bool) -> None:
    backend, broker = broker_of("amq")
    with amqtransport.connect(uri, backend=backend) as conn:
        conn.send("/queue/t", "text body")
        conn.send("/queue/t", b"bytes body")
        conn.send("/queue/t", "text\x00with nul")  # a NUL needs content-length in any mode
    text, binary, nul = broker.frames("SEND")  # as the broker parsed them off the wire
    assert ("content-length" in text.header_map) is has_length and text.body == b"text body"
    assert binary.get("content-length") == "10" and nul.body == b"text\x00with nul"


def test_duplicate_id_header() -> None:
    backend, broker = broker_of("artemis")
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        conn.send("/queue/d", "x", idempotency_key="k1")
    with amqtransport.connect("tcp://a:1?duplicateIdHeader=none", backend=backend) as conn:
        conn.send("/queue/d", "x", idempotency_key="k2")
    with amqtransport.connect("tcp://a:1?dialect=activemq&duplicateIdHeader=_AMQ_DUPL_ID", backend=backend) as conn:
        conn.send("/queue/d", "x", idempotency_key="k3")
    with amqtransport.connect("tcp://a:1?dialect=activemq", backend=backend) as conn:
        conn.send("/queue/d", "x", idempotency_key="k4")
    assert [f.get("_AMQ_DUPL_ID") for f in broker.frames("SEND")] == ["k1", None, "k3", None]
    assert [f.get(IDEMPOTENCY_HEADER) for f in broker.frames("SEND")] == ["k1", "k2", "k3", "k4"]


def test_artemis_routing_types() -> None:
    backend, broker = broker_of("artemis")
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        conn.send("/queue/q", "x")
        conn.send("/topic/t", "x")
        conn.send("/queue/q", "x", headers={"destination-type": "MULTICAST"})  # the caller's wins
        conn.subscribe("/queue/q")
        conn.subscribe("/topic/t")
    assert [f.get("destination-type") for f in broker.frames("SEND")] == ["ANYCAST", "MULTICAST", "MULTICAST"]
    assert [f.get("subscription-type") for f in broker.frames("SUBSCRIBE")] == ["ANYCAST", "MULTICAST"]
    backend, broker = broker_of("activemq")
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        conn.send("/queue/q", "x")
    assert broker.frames("SEND")[0].get("destination-type") is None


def test_artemis_heartbeat_floor_when_the_dialect_is_given() -> None:
    backend, broker = broker_of("artemis")
    with amqtransport.connect("tcp://a:1?dialect=artemis&heartBeat=100,0", backend=backend):
        pass
    assert broker.frames("CONNECT")[0].get("heart-beat") == "500,0"


# -- transactions -------------------------------------------------------------------------------


def rabbit_like_transactions(broker: ScriptedBroker) -> None:
    """Answer a transactional SEND's receipt only after its COMMIT's (RabbitMQ)."""
    held: dict[str, list[str]] = {}

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        tx = frame.get("transaction")
        if frame.command == "SEND" and tx is not None:
            held.setdefault(tx, []).append(frame.get("receipt") or "")
            return True
        if frame.command == "COMMIT":
            stream.push_frame(Frame.make("RECEIPT", {"receipt-id": frame.get("receipt") or ""}))
            for rid in held.pop(frame.get("transaction") or "", []):
                stream.push_frame(Frame.make("RECEIPT", {"receipt-id": rid}))
            return True
        return False

    broker.on_frame = hook


def test_transactional_sends_wait_for_receipts_only_after_the_commit() -> None:
    backend, broker = broker_of("rabbitmq")
    rabbit_like_transactions(broker)
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        done = threading.Event()

        def work() -> None:
            with conn.transaction() as tx:
                for i in range(3):
                    tx.send("/queue/t", f"m{i}")
            done.set()

        threading.Thread(target=work, daemon=True).start()
        assert done.wait(5), "a transactional send waited for a receipt that comes after the COMMIT"
    assert [f.command for f in broker.received[1:]] == ["BEGIN", "SEND", "SEND", "SEND", "COMMIT", "DISCONNECT"]


def test_link_lost_after_commit_receipt_before_the_sends_is_in_doubt() -> None:
    backend = MemoryBackend()
    a, b = backend.add("a:1"), backend.add("b:2")
    a.server = b.server = SERVERS["rabbitmq"]

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command == "SEND" and frame.get("transaction"):
            return True  # receipts come after the COMMIT's ...
        if frame.command == "COMMIT":
            stream.push_frame(Frame.make("RECEIPT", {"receipt-id": frame.get("receipt") or ""}))
            a.up = False
            stream.hang_up()  # ... but the link dies before them
            return True
        return False

    a.on_frame = hook
    with amqtransport.connect("failover:(tcp://a:1,tcp://b:2)?randomize=false", backend=backend,
                              sleep=lambda s: None) as conn:
        with pytest.raises(TransactionInDoubt) as info:
            with conn.transaction() as tx:
                tx.send("/queue/t", "one", idempotency_key="d-1")
                tx.send("/queue/t", "two", idempotency_key="d-2")
        assert info.value.keys == ("d-1", "d-2")


def test_transactional_ack_frames() -> None:
    backend, broker = broker_of("activemq")
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/in", ack="client-individual")
        mid = broker.deliver("/queue/in", "work", {IDEMPOTENCY_HEADER: "w1"}).get("ack")
        msg = sub.receive(2)
        assert msg is not None
        with conn.transaction() as tx:
            tx.ack(msg)
            tx.send("/queue/out", "result")
            tx_id = tx.id
    (ack,) = broker.frames("ACK")
    assert ack.get("id") == mid and ack.get("transaction") == tx_id
    commands = [f.command for f in broker.received]
    assert commands.index("ACK") < commands.index("COMMIT")


def test_artemis_transactional_ack_goes_after_the_commit() -> None:
    """Artemis ignores ACKs inside a transaction: acknowledge once it committed."""
    backend, broker = broker_of("artemis")
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/in", ack="client-individual")
        broker.deliver("/queue/in", "work", {IDEMPOTENCY_HEADER: "w1"})
        msg = sub.receive(2)
        assert msg is not None
        with conn.transaction() as tx:
            tx.ack(msg)
            tx.send("/queue/out", "result")
    (ack,) = broker.frames("ACK")
    assert ack.get("transaction") is None
    commands = [f.command for f in broker.received]
    assert commands.index("COMMIT") < commands.index("ACK")


def test_aborted_transactional_ack_lets_the_redelivery_through() -> None:
    backend, broker = broker_of("activemq")
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/in", ack="client-individual")
        broker.deliver("/queue/in", "work", {IDEMPOTENCY_HEADER: "w1"})
        msg = sub.receive(2)
        assert msg is not None
        with pytest.raises(RuntimeError):
            with conn.transaction() as tx:
                tx.ack(msg)
                raise RuntimeError("failed")
        broker.deliver("/queue/in", "work", {IDEMPOTENCY_HEADER: "w1", "redelivered": "true"})
        again = sub.receive(2)
        assert again is not None and again.redelivered, "the filter dropped the redelivery of a rolled-back ack"
        assert broker.frames("ABORT")


def test_uri_dialect_options_are_validated() -> None:
    from amqtransport.errors import UriError
    from amqtransport.uri import parse_uri

    with pytest.raises(UriError, match="expected one of amq, activemq, artemis, rabbitmq"):
        parse_uri("tcp://a:1?dialect=kafka")
    with pytest.raises(UriError, match="textMode"):
        parse_uri("tcp://a:1?textMode=yes")
    with pytest.raises(UriError, match="duplicateIdHeader"):
        parse_uri("tcp://a:1?duplicateIdHeader=a:b")
    node: Any = parse_uri("failover:(tcp://a:1,tcp://b:2?dialect=amq)?dialect=rabbitmq&vhost=/v")
    assert [(leaf.options.dialect, leaf.options.host) for leaf in node.components] == [
        ("rabbitmq", "/v"), ("amq", "/v")]
    assert str(node) == "failover:(tcp://a:1?host=/v&dialect=rabbitmq,tcp://b:2?host=/v&dialect=amq)"


def test_nack_in_client_mode_on_activemq_nacks_each_message() -> None:
    """ActiveMQ rejects only the message a NACK names: to keep the one client-mode
    rule (a NACK covers every earlier unacked message) the client NACKs each."""
    backend, broker = broker_of("activemq")
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/n", ack="client")
        ids = [broker.deliver("/queue/n", f"m{i}", {IDEMPOTENCY_HEADER: f"n{i}"}).get("ack") for i in range(3)]
        msgs = [sub.receive(2) for _ in range(3)]
        msgs[1].nack()  # type: ignore[union-attr]
        wait_for(lambda: [f.get("id") for f in broker.frames("NACK")] == ids[:2])
