"""STOMP over WebSocket on the broker's ``ws`` port, driven with ``wsproto`` over a real
socket: the handshake (subprotocols, Origin, bad requests), frames split across and
packed into messages, text and binary replies, limits, close codes, and that a
WebSocket client is a connection like any other (counted, limited, authenticated)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ws_client import WsClient, frame
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
)
from wsproto.utilities import LocalProtocolError

from amqtransport.broker import BrokerConfig, EmbeddedBroker
from amqtransport.broker.connection.websocket import choose_subprotocol, origin_allowed

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    """Factory: an in-process broker with config overrides; each is stopped at teardown."""
    started: list[EmbeddedBroker] = []

    def make(users: dict[str, str] | None = None, **overrides: Any) -> EmbeddedBroker:
        b = EmbeddedBroker(port=0, data_dir=tmp_path / f"broker{len(started)}", users=users,
                           config=BrokerConfig(**overrides))
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def ws_broker(make_broker: Callable[..., EmbeddedBroker]) -> EmbeddedBroker:
    return make_broker(ws="127.0.0.1:0", ws_allowed_origins=["http://app.example"])


def address(b: EmbeddedBroker) -> tuple[str, int]:
    assert b.server.ws_address is not None
    return b.server.ws_address


def test_subprotocol_and_origin_rules() -> None:
    assert choose_subprotocol(["v12.stomp", "v11.stomp", "v10.stomp"]) == "v12.stomp"
    assert choose_subprotocol(["mqtt", "v11.stomp", "v12.stomp"]) == "v11.stomp"  # the client's order
    assert choose_subprotocol([]) is None
    with pytest.raises(ValueError, match="none of the offered subprotocols mqtt is STOMP"):
        choose_subprotocol(["mqtt"])
    assert origin_allowed(None, ["http://a"]) and origin_allowed("http://x", ["*"])
    assert origin_allowed("http://App.Example/", ["http://app.example"])
    assert not origin_allowed("http://evil.example", ["http://app.example"])


def test_a_stomp_session_over_websocket(ws_broker: EmbeddedBroker) -> None:
    c = WsClient(address(ws_broker), subprotocols=["v12.stomp", "v11.stomp", "v10.stomp"],
                 origin="http://app.example")
    assert isinstance(c.handshake, AcceptConnection) and c.handshake.subprotocol == "v12.stomp"
    c.send_text(frame("CONNECT", {"accept-version": "1.2", "host": "x", "heart-beat": "0,0"}))
    assert c.stomp().startswith("CONNECTED\nversion:1.2")
    assert len(ws_broker.server.connections) == 1, "a WebSocket client is a connection"
    c.send_text(frame("SUBSCRIBE", {"id": "1", "destination": "/queue/ws", "ack": "client-individual"}))
    # one SEND split over two messages, then two SENDs packed into one message
    whole = frame("SEND", {"destination": "/queue/ws", "receipt": "r1"}, "one")
    c.send_text(whole[:20])
    c.send_text(whole[20:])
    c.send_text(frame("SEND", {"destination": "/queue/ws", "receipt": "r2"}, "two")
                + frame("SEND", {"destination": "/queue/ws", "receipt": "r3"}, "three"))
    got = ""
    deadline = time.monotonic() + 5
    while not all(x in got for x in ("receipt-id:r3", "\n\nthree\x00")) and time.monotonic() < deadline:
        got += c.stomp()
    for r in ("r1", "r2", "r3"):
        assert f"receipt-id:{r}" in got
    for body in ("one", "two", "three"):
        assert f"\n\n{body}\x00" in got
    # the TCP client sees what the WebSocket client sent
    import amqtransport

    with amqtransport.connect(ws_broker.uri) as tcp:
        tcp.send("/queue/ws.back", "from tcp")
    c.send_text(frame("SUBSCRIBE", {"id": "2", "destination": "/queue/ws.back"}))
    assert "\n\nfrom tcp\x00" in c.stomp()
    c.send_text(frame("DISCONNECT", {"receipt": "bye"}))
    assert "receipt-id:bye" in c.stomp()
    c.close()


def test_binary_messages_get_binary_replies_and_a_fragmented_message_works(ws_broker: EmbeddedBroker) -> None:
    c = WsClient(address(ws_broker), subprotocols=["v11.stomp"])
    assert c.handshake.subprotocol == "v11.stomp"
    connect = frame("CONNECT", {"accept-version": "1.1", "host": "x"}).encode()
    c.send_bytes(connect)
    m = c.next(lambda e: isinstance(e, BytesMessage))
    assert bytes(m.data).startswith(b"CONNECTED\nversion:1.1")
    # one message in three WebSocket frames (continuations)
    send = frame("SEND", {"destination": "/queue/frag", "receipt": "f"}, "x" * 3000)
    c.send_text(send[:1000], final=False)
    c.send_text(send[1000:2000], final=False)
    c.send_text(send[2000:], final=True)
    assert "receipt-id:f" in c.stomp()
    c.close()


def test_ping_close_and_connect_without_subprotocol(ws_broker: EmbeddedBroker) -> None:
    c = WsClient(address(ws_broker))  # no subprotocol: accepted, STOMP negotiates by accept-version
    assert isinstance(c.handshake, AcceptConnection) and c.handshake.subprotocol is None
    c.sock.sendall(c.ws.send(Ping(payload=b"hi")))
    pong = c.next(lambda e: isinstance(e, Pong))
    assert bytes(pong.payload) == b"hi"
    c.send_text(frame("CONNECT", {"accept-version": "1.2", "host": "x"}))
    assert c.stomp().startswith("CONNECTED")
    c.sock.sendall(c.ws.send(CloseConnection(code=1000, reason="done")))
    closed = c.next(lambda e: isinstance(e, CloseConnection))
    assert closed.code == 1000
    deadline = time.monotonic() + 5
    while ws_broker.server.connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not ws_broker.server.connections, "the connection is gone with the WebSocket"
    c.close()


@pytest.mark.parametrize("case", ["origin", "subprotocol", "not-websocket", "garbage"])
def test_bad_handshakes_are_refused_with_a_reason(ws_broker: EmbeddedBroker, case: str) -> None:
    if case in ("origin", "subprotocol"):
        c = WsClient(address(ws_broker), origin="http://evil.example" if case == "origin" else None,
                     subprotocols=["mqtt"] if case == "subprotocol" else ["v12.stomp"])
        assert isinstance(c.handshake, RejectConnection)
        assert c.handshake.status_code == (403 if case == "origin" else 400)
        body = c.next(lambda e: isinstance(e, RejectData))
        reason = bytes(body.data).decode()
        assert ("origin http://evil.example is not allowed" in reason if case == "origin"
                else "none of the offered subprotocols mqtt is STOMP" in reason), reason
        c.close()
        return
    with socket.create_connection(address(ws_broker), timeout=5) as s:
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n" if case == "not-websocket" else b"\x16\x03\x01garbage\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 4"), data[:200]
    assert not ws_broker.server.connections


def test_oversized_frame_is_refused_and_the_broker_goes_on(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(ws="127.0.0.1:0", max_frame_size=4096)
    c = WsClient(address(b), subprotocols=["v12.stomp"])
    c.send_text(frame("CONNECT", {"accept-version": "1.2", "host": "x"}))
    assert c.stomp().startswith("CONNECTED")
    c.send_text(frame("SEND", {"destination": "/queue/big"}, "y" * 10_000))
    err = c.stomp()
    assert err.startswith("ERROR") and "frame" in err
    # the socket is closed by the broker (a close frame, then EOF)
    c.next(lambda e: isinstance(e, CloseConnection))
    c.close()
    d = WsClient(address(b), subprotocols=["v12.stomp"])
    d.send_text(frame("CONNECT", {"accept-version": "1.2", "host": "x"}))
    assert d.stomp().startswith("CONNECTED")
    d.close()


def test_authentication_and_max_connections_apply(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(users={"alice": "secret"}, ws="127.0.0.1:0", max_connections=1)
    bad = WsClient(address(b), subprotocols=["v12.stomp"])
    bad.send_text(frame("CONNECT", {"accept-version": "1.2", "host": "x", "login": "alice", "passcode": "wrong"}))
    assert bad.stomp().startswith("ERROR")
    bad.close()
    deadline = time.monotonic() + 5
    while b.server.connections and time.monotonic() < deadline:  # the refused one is gone
        time.sleep(0.02)
    good = WsClient(address(b), subprotocols=["v12.stomp"])
    good.send_text(frame("CONNECT", {"accept-version": "1.2", "host": "x", "login": "alice", "passcode": "secret"}))
    assert good.stomp().startswith("CONNECTED")
    deadline = time.monotonic() + 5
    while len(b.server.connections) != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    extra = WsClient(address(b), subprotocols=["v12.stomp"])  # the TCP port's limit counts it too
    try:
        extra.send_text(frame("CONNECT", {"accept-version": "1.2", "host": "x", "login": "alice", "passcode": "secret"}))
    except LocalProtocolError:
        pass  # refused at once: its ERROR and close frame came in the same read as the handshake's answer
    text = ""
    try:
        text = extra.stomp(timeout=3)
    except (ConnectionError, TimeoutError, OSError):
        pass
    assert not text.startswith("CONNECTED"), text
    extra.close()
    good.close()


def test_a_silent_handshake_is_dropped(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(ws="127.0.0.1:0", connect_timeout_ms=300)
    with socket.create_connection(address(b), timeout=5) as s:
        t0 = time.monotonic()
        assert s.recv(10) == b""
        assert time.monotonic() - t0 < 4



def test_amq_broker_run_ws_shows_the_connection_in_the_console_and_metrics(tmp_path: Path) -> None:
    from http_helpers import metric, running_console

    from amqtransport.testing.ports import free_port

    ws_port = free_port()
    with running_console(tmp_path, args=["--ws", f"127.0.0.1:{ws_port}"]) as console:
        c = WsClient(("127.0.0.1", ws_port), subprotocols=["v12.stomp"])
        c.send_text(frame("CONNECT", {"accept-version": "1.2", "host": "x"}))
        assert c.stomp().startswith("CONNECTED")
        conns = console.json("/api/connections")["connections"]
        assert [x["transport"] for x in conns] == ["ws"], conns
        assert metric(console.metrics(), "amq_websocket_connections") == 1.0
        assert "<td>ws</td>" in console.get("/connections").text
        c.close()
