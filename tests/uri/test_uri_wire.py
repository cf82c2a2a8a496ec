"""ActiveMQ URI options reach the wire (issue 29): ``wireFormat.maxInactivityDuration`` is the
CONNECT heart-beat, ``jms.prefetchPolicy.*`` the SUBSCRIBE prefetch, ``jms.userName``/``jms.clientID``
the CONNECT login and client-id; an ignored option is logged once.

Two peers: a recording fake broker (a real socket server that answers CONNECT, SUBSCRIBE and
receipts and keeps every frame it read) and the real ActiveMQ 5.17 (one node for the module),
where the prefetch must change what the broker does.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import amqtransport
from amqtransport import aio
from amqtransport.processes.activemq import ActiveMQNode
from amqtransport.testing.pytest_fixtures import require_activemq
from amqtransport.transports import factory


class RecordingBroker:
    """Answers like ActiveMQ 5.17 (``server:ActiveMQ/5.17.2``) and records the frames it reads."""

    def __init__(self, heart_beat: str = "0,0") -> None:
        self.heart_beat = heart_beat  # what CONNECTED promises (the broker itself never beats)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.frames: list[tuple[str, dict[str, str]]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while not self._stop:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\x00" in buf:
                    raw, buf = buf.split(b"\x00", 1)
                    raw = raw.lstrip(b"\r\n")
                    if not raw:
                        continue
                    lines = raw.split(b"\n\n", 1)[0].decode().split("\n")
                    headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                    self.frames.append((lines[0], headers))
                    reply = self._reply(lines[0], headers)
                    if reply:
                        conn.sendall(reply)

    def _reply(self, command: str, headers: dict[str, str]) -> bytes:
        if command in ("CONNECT", "STOMP"):
            return f"CONNECTED\nversion:1.2\nserver:ActiveMQ/5.17.2\nheart-beat:{self.heart_beat}\n\n\x00".encode()
        if "receipt" in headers:
            return f"RECEIPT\nreceipt-id:{headers['receipt']}\n\n\x00".encode()
        return b""

    def first(self, command: str) -> dict[str, str]:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for cmd, headers in list(self.frames):
                if cmd == command:
                    return headers
            time.sleep(0.01)
        raise AssertionError(f"no {command} frame reached the broker: {self.frames}")

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def fake() -> Iterator[RecordingBroker]:
    broker = RecordingBroker()
    yield broker
    broker.close()


# ------------------------------------------------------------------ the recording fake broker
@pytest.mark.parametrize(("query", "heart_beat"), [
    ("wireFormat.maxInactivityDuration=0", "0,0"),
    ("wireFormat.maxInactivityDuration=7000", "7000,7000"),
    ("useInactivityMonitor=false", "0,0"),
    ("wireFormat.maxInactivityDuration=7000&heartBeat=1000,2000", "1000,2000"),  # heartBeat wins
])
def test_heartbeat_from_max_inactivity_duration_reaches_connect(fake: RecordingBroker, query: str,
                                                                heart_beat: str) -> None:
    with amqtransport.connect(f"tcp://127.0.0.1:{fake.port}?{query}"):
        assert fake.first("CONNECT")["heart-beat"] == heart_beat


def test_nested_heartbeat_through_a_failover(fake: RecordingBroker) -> None:
    uri = f"failover:(tcp://127.0.0.1:{fake.port})?nested.wireFormat.maxInactivityDuration=0&maxReconnectAttempts=0"
    with amqtransport.connect(uri):
        assert fake.first("CONNECT")["heart-beat"] == "0,0"


@pytest.mark.parametrize(("query", "destination", "prefetch"), [
    ("jms.prefetchPolicy.queuePrefetch=1", "/queue/a", "1"),
    ("jms.prefetchPolicy.all=50", "/topic/a", "50"),
    ("jms.prefetchPolicy.all=50&jms.prefetchPolicy.topicPrefetch=7", "/topic/a", "7"),
    ("jms.prefetchPolicy.queuePrefetch=0", "/queue/a", "1"),  # a pull consumer: the least STOMP can ask for
    ("jms.prefetchPolicy.topicPrefetch=7", "/queue/a", None),  # queues keep the broker's default
])
def test_prefetch_policy_reaches_subscribe(fake: RecordingBroker, query: str, destination: str,
                                           prefetch: str | None) -> None:
    with amqtransport.connect(f"failover:(tcp://127.0.0.1:{fake.port})?maxReconnectAttempts=0&{query}") as conn:
        conn.subscribe(destination)
        assert fake.first("SUBSCRIBE").get("activemq.prefetchSize") == prefetch


def test_durable_and_browser_prefetch(fake: RecordingBroker) -> None:
    uri = (f"tcp://127.0.0.1:{fake.port}?jms.prefetchPolicy.topicPrefetch=9&jms.prefetchPolicy.durableTopicPrefetch=4"
           "&jms.prefetchPolicy.queueBrowserPrefetch=6")
    with amqtransport.connect(uri, client_id="c1") as conn:
        conn.subscribe("/topic/t", durable_name="d1")
        conn.subscribe("/queue/q", headers={"browser": "true"})
        deadline = time.monotonic() + 10
        while len([f for f in fake.frames if f[0] == "SUBSCRIBE"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    durable, browser = [h for cmd, h in fake.frames if cmd == "SUBSCRIBE"][:2]
    assert durable["activemq.prefetchSize"] == "4" and browser["activemq.prefetchSize"] == "6"


def test_explicit_prefetch_wins_over_the_policy(fake: RecordingBroker) -> None:
    with amqtransport.connect(f"tcp://127.0.0.1:{fake.port}?jms.prefetchPolicy.all=50") as conn:
        conn.subscribe("/queue/a", prefetch=3)
        assert fake.first("SUBSCRIBE")["activemq.prefetchSize"] == "3"


def test_jms_credentials_reach_connect(fake: RecordingBroker) -> None:
    with amqtransport.connect(f"tcp://127.0.0.1:{fake.port}?jms.userName=app&jms.password=s3cret&jms.clientID=c1"):
        connect = fake.first("CONNECT")
    assert (connect["login"], connect["passcode"], connect["client-id"]) == ("app", "s3cret", "c1")


async def _aio_subscribe(port: int) -> None:
    uri = f"tcp://127.0.0.1:{port}?wireFormat.maxInactivityDuration=0&jms.prefetchPolicy.queuePrefetch=2"
    async with aio.connect(uri) as conn:
        await conn.subscribe("/queue/a")


def test_the_asyncio_client_too(fake: RecordingBroker) -> None:
    import asyncio

    asyncio.run(_aio_subscribe(fake.port))
    assert fake.first("CONNECT")["heart-beat"] == "0,0"
    assert fake.first("SUBSCRIBE")["activemq.prefetchSize"] == "2"


def test_ignored_options_are_logged_once_at_info(fake: RecordingBroker, caplog: pytest.LogCaptureFixture) -> None:
    factory._logged_ignored.discard("jms.useCompression")
    caplog.set_level(logging.INFO, logger="amqtransport.transports.factory")
    for _ in range(2):
        with amqtransport.connect(f"tcp://127.0.0.1:{fake.port}?jms.useCompression=true"):
            pass
    lines = [r for r in caplog.records if "jms.useCompression" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "ignored" in lines[0].getMessage() and "compression" in lines[0].getMessage()


def test_initial_delay_holds_off_the_first_heartbeat_deadline() -> None:
    """A broker that promises beats every 100 ms and sends none: the link is half-open after
    2 intervals, unless wireFormat.maxInactivityDurationInitalDelay holds the first deadline off."""
    broker = RecordingBroker(heart_beat="100,100")
    try:
        base = f"tcp://127.0.0.1:{broker.port}?wireFormat.maxInactivityDuration=100"
        with amqtransport.connect(base + "&wireFormat.maxInactivityDurationInitalDelay=60000") as patient:
            with amqtransport.connect(base) as strict:
                deadline = time.monotonic() + 20
                while strict.is_connected and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert not strict.is_connected  # found half-open after ~200 ms
            assert patient.is_connected  # still within its initial delay
    finally:
        broker.close()


# ------------------------------------------------------------------ the real ActiveMQ 5.17
@pytest.fixture(scope="module")
def activemq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQNode]:
    require_activemq()
    node = ActiveMQNode(tmp_path_factory.mktemp("activemq-uris"), "uris")
    try:
        node.start()
        yield node
    finally:
        node.stop(timeout=5)


@pytest.mark.activemq
@pytest.mark.parametrize(("query", "expected"), [
    ("wireFormat.maxInactivityDuration=0", "0,0"),
    ("wireFormat.maxInactivityDuration=4000", "4000,4000"),
])
def test_activemq_answers_the_heartbeat_we_asked_for(activemq: ActiveMQNode, query: str, expected: str) -> None:
    with amqtransport.connect(f"{activemq.uri}?{query}") as conn:
        assert conn.server and conn.server.startswith("ActiveMQ/5.17")
        frame = conn.transport.connected_frame  # type: ignore[attr-defined]
        assert frame is not None and frame.get("heart-beat") == expected


@pytest.mark.activemq
def test_activemq_honours_the_prefetch_of_the_policy(activemq: ActiveMQNode) -> None:
    """queuePrefetch=1: an unacknowledged message holds the first consumer's only slot, so the
    broker hands the second message to the second consumer (without the policy the first one,
    with ActiveMQ's default prefetch of 1000 for STOMP, takes both)."""
    queue = f"/queue/uris-{uuid.uuid4().hex[:8]}"
    uri = f"{activemq.uri}?jms.prefetchPolicy.queuePrefetch=1"
    with amqtransport.connect(uri) as first, amqtransport.connect(uri) as second, \
            amqtransport.connect(activemq.uri) as producer:
        a = first.subscribe(queue, ack="client-individual")
        producer.send(queue, "one")
        producer.send(queue, "two")
        got = a.receive(timeout=10)
        assert got is not None and got.text == "one"
        b = second.subscribe(queue, ack="client-individual")
        other = b.receive(timeout=10)
        assert other is not None and other.text == "two"
        assert a.receive(timeout=0.5) is None
        got.ack()
        other.ack()
