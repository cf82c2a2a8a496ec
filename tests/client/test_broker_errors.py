"""A broker ERROR fails the request it answers, never a reconnect loop, never a hang.

Scripted endpoints for the failover state machine (exact frames and reconnect counts),
then our broker as a real process refusing a frame over its size limit (an ERROR with
no ``receipt-id``, then the connection closed), which made the failover client replay
the SEND forever before."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import amqtransport
from amqtransport._backends.memory import MemoryBackend, MemoryStream, ScriptedBroker
from amqtransport.errors import AuthenticationError, BrokerError, TransactionInDoubt
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.stomp.session import error_from_frame
from amqtransport.testing.broker_process import BrokerProcess
from amqtransport.testing.wait import wait_for

pytestmark = pytest.mark.timeout(60)

URI2 = "failover:(tcp://a:1,tcp://b:2)?randomize=false&initialReconnectDelay=1&maxReconnectDelay=5"



def refuse_key(broker: ScriptedBroker, key: str, *, receipt_id: bool, close: bool) -> list[Frame]:
    """Make ``broker`` answer a SEND carrying ``key`` with an ERROR; returns the log of refusals."""
    refused: list[Frame] = []

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command == "SEND" and frame.get(IDEMPOTENCY_HEADER) == key:
            refused.append(frame)
            headers = {"message": "cannot store this message"}
            if receipt_id and frame.get("receipt"):
                headers["receipt-id"] = frame.get("receipt") or ""
            stream.push_frame(Frame.make("ERROR", headers, b"the disk is full"))
            if close:
                stream.hang_up()
            return True
        return False

    broker.on_frame = hook
    return refused


@pytest.mark.parametrize("receipt_id", [True, False], ids=["with-receipt-id", "without-receipt-id"])
def test_refused_send_fails_with_broker_error_and_the_rest_goes_through(receipt_id: bool) -> None:
    backend = MemoryBackend()
    a, b = backend.add("a:1"), backend.add("b:2")
    refused = refuse_key(a, "bad", receipt_id=receipt_id, close=True)
    refuse_key(b, "bad", receipt_id=receipt_id, close=True).clear()
    refused_b: list[Frame] = []
    b.on_frame = a.on_frame  # both nodes refuse it (a full disk on a shared store)
    with amqtransport.connect(URI2, backend=backend, sleep=lambda s: None) as conn:
        conn.send("/queue/x", "first", idempotency_key="good-1")
        t0 = time.monotonic()
        with pytest.raises(BrokerError) as info:
            conn.send("/queue/x", "refused", idempotency_key="bad")
        assert "cannot store this message" in str(info.value)
        assert time.monotonic() - t0 < 5
        conn.send("/queue/x", "after", idempotency_key="good-2")
        transport: Any = conn.transport
        # with a receipt-id: the ERROR names the request at once (one reconnect, as the
        # broker closes the link); without: it is found by replaying it on its own
        assert transport.reconnects == (1 if receipt_id else 2)
        assert len(refused) + len(refused_b) == (1 if receipt_id else 2)
    sends = [f.get(IDEMPOTENCY_HEADER) for f in a.frames("SEND") + b.frames("SEND")]
    assert sends.count("good-2") == 1 and sends.count("good-1") == 1


def test_refusal_in_a_pipeline_blames_only_the_refused_send() -> None:
    """Ten sends in flight, the fourth refused without a receipt-id: the stepwise replay
    finds it; every other one is receipted (none failed in its place)."""
    backend = MemoryBackend()
    a, b = backend.add("a:1"), backend.add("b:2")
    a.hold_receipts = True  # receipts come late (fsync), so all ten are pending at the ERROR
    gate = threading.Event()

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command == "SEND" and frame.get(IDEMPOTENCY_HEADER) == "k3":
            gate.wait(5)
            stream.push_frame(Frame.make("ERROR", {"message": "refused"}, b"too big"))
            stream.hang_up()
            a.up = False  # the rest happens on b, which answers receipts
            return True
        return False

    a.on_frame = b.on_frame = hook
    errors: list[tuple[int, BaseException]] = []
    with amqtransport.connect(URI2, backend=backend, sleep=lambda s: None) as conn:
        t = conn.transport
        recs = []
        for i in range(10):
            if i == 3:
                threading.Timer(0.05, gate.set).start()
            frame = conn._send_frame("/queue/p", f"m{i}", None, True, f"k{i}")
            recs.append(t.request(frame))
        for i, rec in enumerate(recs):
            assert rec is not None
            try:
                t.wait(rec, 10)
            except BrokerError as exc:
                errors.append((i, exc))
    assert [i for i, _ in errors] == [3], errors
    stored = [f.get(IDEMPOTENCY_HEADER) for f in b.frames("SEND")]
    assert set(stored) == {f"k{i}" for i in range(10)}  # k3 tried (refused), the rest stored
    # the refusal is found by the second link that reads the ERROR (a write that fails
    # first closes the link before its reader gets to the ERROR): at most 4 links on b
    assert len(b.connections) <= 4, [[f.command for f in c.frames] for c in b.connections]


def test_error_on_a_link_that_stays_open_fails_the_request_instead_of_hanging() -> None:
    """RabbitMQ answers some frames with an ERROR without receipt-id and keeps the
    connection open: the request must not wait forever."""
    backend = MemoryBackend()
    a = backend.add("a:1")

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command == "SEND" and frame.get("destination") == "/bad/x":
            stream.push_frame(Frame.make("ERROR", {"message": "Unknown destination"},
                                         b"'/bad/x' is not a valid destination."))
            return True  # no receipt, no close
        return False

    a.on_frame = hook
    with amqtransport.connect("failover:(tcp://a:1)?initialReconnectDelay=1", backend=backend,
                              sleep=lambda s: None) as conn:
        with pytest.raises(BrokerError) as info:
            conn.send("/bad/x", "x")
        assert "Unknown destination: '/bad/x' is not a valid destination." in str(info.value)
        conn.send("/queue/ok", "x")  # the connection goes on
    with amqtransport.connect("tcp://a:1", backend=backend) as direct:
        with pytest.raises(BrokerError, match="not a valid destination"):
            direct.send("/bad/x", "x")


def test_unsubscribe_answered_by_an_error_on_an_open_link_returns() -> None:
    backend = MemoryBackend()
    a = backend.add("a:1")

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command == "UNSUBSCRIBE":
            stream.push_frame(Frame.make("ERROR", {"message": "No subscription found"}))
            return True
        return False

    a.on_frame = hook
    with amqtransport.connect("failover:(tcp://a:1)?initialReconnectDelay=1", backend=backend,
                              sleep=lambda s: None) as conn:
        sub = conn.subscribe("/queue/u")
        done = threading.Event()
        threading.Thread(target=lambda: (sub.unsubscribe(), done.set()), daemon=True).start()
        assert done.wait(5), "unsubscribe hung on an ERROR without receipt-id"
        conn.send("/queue/u", "still usable")


def test_refused_fire_and_forget_send_is_dropped_from_the_track_cache() -> None:
    backend = MemoryBackend()
    a = backend.add("a:1")
    refused = refuse_key(a, "bad", receipt_id=False, close=True)
    events: list[str] = []

    class Listener:
        def on_resumed(self, address: str) -> None:
            events.append("resumed")

        def on_failed(self, error: BaseException) -> None:
            events.append("failed")

    with amqtransport.connect("failover:(tcp://a:1)?trackMessages=true&initialReconnectDelay=1&maxReconnectDelay=2",
                              backend=backend, sleep=lambda s: time.sleep(0.001), listener=Listener()) as conn:
        conn.send("/queue/t", "poison", receipt=False, idempotency_key="bad")
        wait_for(lambda: len(refused) >= 2)
        time.sleep(0.3)
        # the cache was dropped after the same refusal twice with nothing else to blame
        assert len(refused) <= 3
        assert conn.transport.cached_sends == 0  # type: ignore[attr-defined]
        conn.send("/queue/t", "good", idempotency_key="g")
    assert "failed" not in events


def test_a_refused_subscription_replay_gives_up_instead_of_looping() -> None:
    backend = MemoryBackend()
    a = backend.add("a:1")
    allow = {"n": 1}

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command == "SUBSCRIBE":
            if allow["n"] > 0:
                allow["n"] -= 1
                return False
            stream.push_frame(Frame.make("ERROR", {"message": "access to /queue/s refused"}))
            stream.hang_up()
            return True
        return False

    a.on_frame = hook
    failed = threading.Event()

    class Listener:
        error: BaseException | None = None

        def on_failed(self, error: BaseException) -> None:
            Listener.error = error
            failed.set()

    conn = amqtransport.connect("failover:(tcp://a:1)?initialReconnectDelay=1&maxReconnectDelay=2",
                                backend=backend, sleep=lambda s: time.sleep(0.001), listener=Listener())
    try:
        sub = conn.subscribe("/queue/s")
        a.drop()
        assert failed.wait(5)
        assert isinstance(Listener.error, BrokerError)
        assert "refused the replay of 1 subscription(s)" in str(Listener.error)
        assert a.connect_count <= 5
        with pytest.raises(BrokerError):
            sub.receive(1)
    finally:
        conn.close()


def test_error_text_has_the_body_and_access_errors_are_authentication_errors() -> None:
    vhost = Frame.make("ERROR", {"message": "Bad CONNECT"}, b"Virtual host '127.0.0.1' access denied")
    err = error_from_frame(vhost)
    assert isinstance(err, AuthenticationError)
    assert str(err) == "Bad CONNECT: Virtual host '127.0.0.1' access denied"
    password = Frame.make("ERROR", {"message": "Bad CONNECT"}, b"Access refused for user 'guest'\n")
    assert isinstance(error_from_frame(password), AuthenticationError)
    plain = error_from_frame(Frame.make("ERROR", {"message": "No subscription found"},
                                        b"UNSUBSCRIBE must refer to an existing subscription.\nSubscription "
                                        b"to \"id='nope'\" not found.\n"))
    assert type(plain) is BrokerError
    assert str(plain) == ("No subscription found: UNSUBSCRIBE must refer to an existing subscription. "
                          "Subscription to \"id='nope'\" not found.")
    assert str(error_from_frame(Frame.make("ERROR", {"message": "same"}, b"same"))) == "same"
    assert str(error_from_frame(Frame.make("ERROR", {}, b""))) == "ERROR frame"


def test_wrong_password_over_failover_stops_at_once() -> None:
    backend = MemoryBackend()
    a, b = backend.add("a:1"), backend.add("b:2")

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command == "CONNECT":
            stream.push_frame(Frame.make("ERROR", {"message": "Bad CONNECT"}, b"Access refused for user 'guest'"))
            return True  # RabbitMQ leaves the socket open a while
        return False

    a.on_frame = b.on_frame = hook
    with pytest.raises(AuthenticationError, match="Access refused for user 'guest'"):
        amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, login="guest", passcode="x")
    assert backend.connect_log == ["a:1"]


# -- our broker, a real process -------------------------------------------------------------


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    config = tmp_path / "broker.toml"
    config.write_text("max_frame_size = 65536\n")
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path / "logs", args=["--config", str(config)]) as proc:
        yield proc


def test_our_broker_refusing_an_oversized_send_is_a_broker_error_not_a_reconnect_loop(broker: BrokerProcess) -> None:
    uri = f"failover:({broker.uri})?initialReconnectDelay=10&maxReconnectDelay=50"
    with amqtransport.connect(uri) as conn:
        sub = conn.subscribe("/queue/big", ack="client-individual")
        conn.send("/queue/big", "small-1", idempotency_key="s1")
        with pytest.raises(BrokerError, match="max_frame_size"):
            conn.send("/queue/big", b"x" * 200_000, idempotency_key="huge")
        conn.send("/queue/big", "small-2", idempotency_key="s2")
        assert conn.transport.reconnects <= 3  # type: ignore[attr-defined]
        got = []
        for _ in range(2):
            msg = sub.receive(10)
            assert msg is not None
            got.append(msg.text)
            msg.ack()
        assert got == ["small-1", "small-2"]
    with amqtransport.connect(broker.uri) as direct:
        with pytest.raises(BrokerError, match="max_frame_size"):
            direct.send("/queue/big", b"x" * 200_000)


def test_our_broker_refusing_a_destination_fails_that_send_only(broker: BrokerProcess) -> None:
    """An ERROR carrying the receipt-id (a SEND to a wildcard queue)."""
    uri = f"failover:({broker.uri})?initialReconnectDelay=10&maxReconnectDelay=50"
    with amqtransport.connect(uri) as conn:
        with conn.producer(window=10) as producer:
            for i in range(5):
                producer.send("/queue/ok", f"m{i}", idempotency_key=f"ok-{i}")
        with pytest.raises(BrokerError, match="wildcards"):
            conn.send("/queue/a.>", "nowhere")
        conn.send("/queue/ok", "after", idempotency_key="ok-after")
        assert conn.transport.reconnects <= 1  # type: ignore[attr-defined]


def test_a_refused_send_among_pipelined_sends_is_raised_once(broker: BrokerProcess) -> None:
    """A producer's send the broker refuses (a wildcard destination) is raised by one
    call only -- the send or ``flush()`` that reaps its receipt -- and the later sends,
    the next ``flush()`` and the ``with`` block's exit go on. Before, ``flush()`` left a
    refused receipt at the head of the window, so every later call raised it again."""
    uri = f"failover:({broker.uri})?initialReconnectDelay=10&maxReconnectDelay=50"
    raised: list[str] = []
    with amqtransport.connect(uri) as conn:
        with conn.producer(window=100) as producer:
            for step in ["send", "flush", *(["send"] * 20), "flush"]:
                try:
                    if step == "send":
                        n = producer.sent
                        producer.send("/queue/a.>" if n == 0 else "/queue/pipelined", f"m{n}")
                    else:
                        producer.flush(10)
                except BrokerError as exc:
                    assert "wildcards" in str(exc)
                    raised.append(step)
            assert producer.outstanding == 0
        assert len(raised) == 1, raised
        sub = conn.subscribe("/queue/pipelined")
        got = []
        while (msg := sub.receive(2)) is not None:
            got.append(msg.text)
    assert sorted(got, key=lambda t: int(t[1:])) == [f"m{i}" for i in range(1, 21)]


def test_an_in_doubt_error_says_so_and_names_the_key_to_resend_with() -> None:
    """A broker whose journal failed answers the SENDs it had queued with
    ``amq-in-doubt:true`` (it cannot tell whether they are stored) and later ones with
    "not applied". The caller learns which, and the idempotency key to resend with --
    also the one the client generated when the caller gave none."""
    backend = MemoryBackend()
    a = backend.add("a:1")
    answers = iter(["true", ""])

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command != "SEND":
            return False
        headers = {"message": "could not persist SEND: journal write failed", "receipt-id": frame.get("receipt") or ""}
        if doubt := next(answers):
            headers["amq-in-doubt"] = doubt
        stream.push_frame(Frame.make("ERROR", headers))
        return True

    a.on_frame = hook
    with amqtransport.connect("failover:(tcp://a:1)?initialReconnectDelay=1", backend=backend,
                              sleep=lambda s: None) as conn:
        with pytest.raises(BrokerError) as first:
            conn.send("/queue/x", "one")  # no key given: the client made one
        with pytest.raises(BrokerError) as second:
            conn.send("/queue/x", "two", idempotency_key="k-2")
    sent = [f.get(IDEMPOTENCY_HEADER) for f in a.frames("SEND")]
    assert first.value.in_doubt and first.value.idempotency_key == sent[0] and sent[0]
    assert not second.value.in_doubt and second.value.idempotency_key == "k-2"


def test_a_commit_answered_in_doubt_is_a_transaction_in_doubt_with_the_keys() -> None:
    """The broker's journal failed with the COMMIT's record queued: it answers the COMMIT
    with ``amq-in-doubt:true``. The caller gets TransactionInDoubt with the keys of the
    transaction's sends (to send them again in a new transaction; the broker's dedupe
    drops those it stored), as for a COMMIT lost in flight -- not a bare BrokerError."""
    backend = MemoryBackend()
    a = backend.add("a:1")

    def hook(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command != "COMMIT":
            return False
        stream.push_frame(Frame.make("ERROR", {"message": "could not persist COMMIT: journal write failed",
                                               "receipt-id": frame.get("receipt") or "", "amq-in-doubt": "true"}))
        return True

    a.on_frame = hook
    with amqtransport.connect("failover:(tcp://a:1)?initialReconnectDelay=1", backend=backend,
                              sleep=lambda s: None) as conn:
        with pytest.raises(TransactionInDoubt) as info, conn.transaction() as tx:
            tx.send("/queue/x", "one", idempotency_key="t-1")
            tx.send("/queue/x", "two")
    sent = [f.get(IDEMPOTENCY_HEADER) for f in a.frames("SEND")]
    assert info.value.keys == tuple(sent) and sent[0] == "t-1" and len(sent) == 2
    assert isinstance(info.value.__cause__, BrokerError) and info.value.__cause__.in_doubt
