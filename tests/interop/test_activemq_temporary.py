"""Temporary destinations, request/reply and browsing, differential: the same
scenarios against our broker and ActiveMQ 5.17 (one JVM for this module). Our rules are
amqtransport/broker/dispatch/temporary.py and connection/temporary.py; the client's
amqtransport/aio/requests.py."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from differential import BROKERS, broker

import amqtransport
from amqtransport.errors import BrokerError, ConnectionClosed

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=BROKERS)
def broker_uri(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tcp://`` of our broker or of ActiveMQ 5.17 (one JVM for the whole module)."""
    with broker(request.param, tmp_path_factory, "temporary") as uri:
        yield uri


def unique(kind: str = "queue") -> str:
    return f"/{kind}/tmp.{uuid.uuid4().hex[:10]}"


def is_activemq(conn: amqtransport.Connection) -> bool:
    return conn.server is not None and "ActiveMQ" in conn.server


class Responder:
    """A service on its own connection and thread: answers each request on ``queue``
    with its body upper-cased, to its ``reply-to``, with its ``correlation-id``."""

    def __init__(self, uri: str, queue: str) -> None:
        self.conn = amqtransport.connect(uri)
        self.sub = self.conn.subscribe(queue)  # receipted: requests sent from now on reach it
        self.reply_to: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            for msg in self.sub:
                self.reply_to.append(msg.headers["reply-to"])
                self.conn.send(msg.headers["reply-to"], msg.text.upper(),
                               headers={"correlation-id": msg.headers["correlation-id"]})
        except ConnectionClosed:
            pass  # closed by the test while the last reply's receipt was on its way

    def close(self) -> None:
        self.conn.close()
        self.thread.join(timeout=30)


def capture_remote_name(uri: str, owner: amqtransport.Connection, temp: str) -> str:
    """The name other connections see for ``owner``'s temporary destination ``temp``:
    the ``reply-to`` of a message it sends, as a third connection receives it."""
    q = unique()
    with amqtransport.connect(uri) as other:
        sub = other.subscribe(q)
        owner.send(q, "who", headers={"reply-to": temp})
        msg = sub.receive(timeout=10)
        assert msg is not None
        return msg.headers["reply-to"]


def test_request_reply_round_trip_through_a_temp_queue(broker_uri: str) -> None:
    q = unique()
    responder = Responder(broker_uri, q)
    try:
        with amqtransport.connect(broker_uri) as conn:
            replies = [conn.request(q, f"ping-{i}", timeout=20) for i in range(3)]
            assert [r.text for r in replies] == ["PING-0", "PING-1", "PING-2"]
            # the reply arrives on the requester's own name for its reply queue...
            assert all(r.destination is not None and r.destination.startswith("/temp-queue/amq.replies.")
                       for r in replies)
            # ...while the responder saw the name the broker gave it (ActiveMQ's rewrite)
            assert len(set(responder.reply_to)) == 1  # one reply queue per connection
            assert responder.reply_to[0].startswith("/remote-temp-queue/ID:")
    finally:
        responder.close()


def test_a_second_reply_is_dropped_not_handed_to_the_next_request(broker_uri: str) -> None:
    """A request served twice (a redelivery after a failover) is answered once: the
    second reply finds nobody waiting for its correlation-id."""
    q = unique()
    with amqtransport.connect(broker_uri) as service, amqtransport.connect(broker_uri) as conn:
        sub = service.subscribe(q)
        answered = threading.Event()

        def answer_twice() -> None:
            msg = sub.receive(timeout=20)
            assert msg is not None
            for body in ("first", "second"):
                service.send(msg.headers["reply-to"], body, headers={"correlation-id": msg.headers["correlation-id"]})
            answered.set()

        worker = threading.Thread(target=answer_twice, daemon=True)
        worker.start()
        assert conn.request(q, "once", timeout=20).text == "first"
        assert answered.wait(20)
        worker.join(20)
        sub.unsubscribe()
        responder = Responder(broker_uri, q)
        try:
            assert conn.request(q, "next", timeout=20).text == "NEXT"
        finally:
            responder.close()
        assert conn._requests.late == 1


def test_async_request_and_browse(broker_uri: str) -> None:
    import asyncio

    import amqtransport.aio as aio

    q, held = unique(), unique()
    responder = Responder(broker_uri, q)

    async def scenario() -> tuple[str, list[str]]:
        async with aio.connect(broker_uri) as conn:
            reply = await conn.request(q, "async", timeout=20)
            for i in range(3):
                await conn.send(held, f"h{i}")
            return reply.text, [m.text async for m in conn.browse(held)]

    try:
        text, browsed = asyncio.run(scenario())
    finally:
        responder.close()
    assert text == "ASYNC" and browsed == ["h0", "h1", "h2"]


def test_a_temp_topic_in_reply_to_is_rewritten_too(broker_uri: str) -> None:
    with amqtransport.connect(broker_uri) as owner:
        sub = owner.subscribe("/temp-topic/events")
        remote = capture_remote_name(broker_uri, owner, "/temp-topic/events")
        assert remote.startswith("/remote-temp-topic/ID:")
        with amqtransport.connect(broker_uri) as other:
            other.send(remote, "to-the-temp-topic")
        msg = sub.receive(timeout=10)
        assert msg is not None and msg.text == "to-the-temp-topic" and msg.destination == "/temp-topic/events"


def test_a_temp_queue_name_is_scoped_to_its_connection(broker_uri: str) -> None:
    with amqtransport.connect(broker_uri) as a, amqtransport.connect(broker_uri) as b:
        mine = a.subscribe("/temp-queue/same-name")
        b.send("/temp-queue/same-name", "b's own")  # b's temp queue of that name: not a's
        assert mine.receive(timeout=1) is None
        a.send("/temp-queue/same-name", "a's own")
        msg = mine.receive(timeout=10)
        assert msg is not None and msg.text == "a's own"


def test_a_temp_queue_is_gone_when_its_connection_closes(broker_uri: str) -> None:
    with amqtransport.connect(broker_uri) as sender:
        owner = amqtransport.connect(broker_uri)
        sub = owner.subscribe("/temp-queue/inbox")
        remote = capture_remote_name(broker_uri, owner, "/temp-queue/inbox")
        sender.send(remote, "while-open")
        got = sub.receive(timeout=10)
        assert got is not None and got.text == "while-open"
        owner.close()
        # the broker deletes it as it processes the owner's going (ActiveMQ: a moment after
        # the DISCONNECT receipt): send until a SEND is refused
        deadline = time.monotonic() + 30
        refused: BrokerError | None = None
        while refused is None and time.monotonic() < deadline:
            try:
                sender.send(remote, "after-close")
            except BrokerError as exc:
                refused = exc
            else:
                time.sleep(0.1)
        assert refused is not None, "a SEND to the closed connection's temp queue was still accepted after 30 s"
        assert re.search(r"temp-queue://ID:\S+", str(refused))
        assert refused.frame is not None and "does not exist" in refused.frame.body.decode()
        sender.send(unique(), "the sender's connection stays")


def test_another_connection_subscribing_to_a_temp_queue_differs_on_purpose(broker_uri: str) -> None:
    """Ours refuses it (ERROR naming the rule; the connection stays), as ActiveMQ's JMS
    client does. ActiveMQ 5.17's STOMP connector accepts the SUBSCRIBE and shares the
    messages between the owner and the intruder."""
    with amqtransport.connect(broker_uri) as owner, amqtransport.connect(broker_uri) as intruder:
        mine = owner.subscribe("/temp-queue/private", prefetch=1)
        remote = capture_remote_name(broker_uri, owner, "/temp-queue/private")
        if is_activemq(owner):
            theirs = intruder.subscribe(remote, prefetch=1)
            for i in range(6):
                intruder.send(remote, f"m{i}")
            stolen = []
            while (m := theirs.receive(timeout=2)) is not None:
                stolen.append(m.text)
            kept = []
            while (m := mine.receive(timeout=2)) is not None:
                kept.append(m.text)
            assert stolen and kept and sorted(stolen + kept) == [f"m{i}" for i in range(6)]
            return
        with pytest.raises(BrokerError, match="temporary destination of another connection"):
            intruder.subscribe(remote)
        intruder.send(remote, "sending is allowed")
        msg = mine.receive(timeout=10)
        assert msg is not None and msg.text == "sending is allowed"


def test_browse_leaves_the_queue_intact(broker_uri: str) -> None:
    q = unique()
    with amqtransport.connect(broker_uri) as conn:
        for i in range(4):
            conn.send(q, f"m{i}", headers={"n": str(i)})
        assert [m.text for m in conn.browse(q)] == ["m0", "m1", "m2", "m3"]
        assert [m.text for m in conn.browse(q, selector="n >= 2")] == ["m2", "m3"]
        assert [m.text for m in conn.browse(q)] == ["m0", "m1", "m2", "m3"]  # nothing was consumed
        sub = conn.subscribe(q)
        got = [sub.receive(timeout=10) for _ in range(4)]
        assert [m.text for m in got if m is not None] == ["m0", "m1", "m2", "m3"]
        assert list(conn.browse(q)) == []  # consumed now: an empty browse still ends
