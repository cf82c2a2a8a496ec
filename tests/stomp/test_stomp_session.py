"""The sans-IO STOMP session: CONNECT built, CONNECTED checked, ERROR classified,
ACK/NACK per version; bad input from a broker is one clear error, never a crash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.errors import (
    AuthenticationError,
    BrokerError,
    ConnectError,
    LocalProtocolError,
    RemoteProtocolError,
)
from amqtransport.stomp import Frame, FrameParser, serialize
from amqtransport.stomp.session import (
    ClientSession,
    ack_frame,
    error_from_frame,
    error_text,
    parse_ack,
)


def connected(**headers: str) -> bytes:
    return serialize(Frame.make("CONNECTED", {"version": "1.2", **headers}), "1.2")


def test_connect_frame_carries_what_was_asked_in_order() -> None:
    s = ClientSession(host="vh", login="me", passcode="pw", client_id="cid", heartbeat=(100, 200),
                      extra_headers=[("x-extra", "1")])
    assert s.frame.headers == (("accept-version", "1.0,1.1,1.2"), ("host", "vh"), ("login", "me"),
                               ("passcode", "pw"), ("client-id", "cid"), ("heart-beat", "100,200"),
                               ("x-extra", "1"))
    parsed = FrameParser("1.2")
    parsed.feed(s.connect_bytes())
    assert parsed.next_event() == s.frame


def test_optional_headers_are_left_out_and_the_heartbeat_floor_applies() -> None:
    s = ClientSession(heartbeat=(100, 0), min_heartbeat_ms=500)
    assert s.frame.header_map == {"accept-version": "1.0,1.1,1.2", "host": "/", "heart-beat": "500,0"}


def test_connected_negotiates_version_and_heartbeats_across_reads() -> None:
    s = ClientSession(heartbeat=(1000, 2000))
    data = connected(**{"heart-beat": "3000,500", "server": "amqtransport/1"})
    assert s.feed(data[:7]) is None
    terms = s.feed(data[7:] + b"MESSAGE\ndestination:/queue/a\n\nx\x00")
    assert terms is not None
    assert (terms.version, terms.send_every_ms, terms.expect_every_ms) == ("1.2", 1000, 3000)
    assert terms.server == "amqtransport/1"
    # what followed CONNECTED in the same read is still in the parser, for the link's reader
    event = s.parser.next_event()
    assert isinstance(event, Frame) and event.command == "MESSAGE"
    with pytest.raises(LocalProtocolError):
        s.feed(b"more")


def test_version_10_broker_without_version_header() -> None:
    s = ClientSession()
    terms = s.feed(serialize(Frame.make("CONNECTED", {}), "1.2"))
    assert terms is not None and terms.version == "1.0" and s.parser.version == "1.0"


@pytest.mark.parametrize(("headers", "body", "kind"), [
    ({"message": "authentication failed: bad login or passcode"}, b"", AuthenticationError),
    ({"message": "Bad CONNECT"}, b"Virtual host '/x' access refused for user 'guest'", AuthenticationError),
    ({"message": "broker is fenced"}, b"", BrokerError),
])
def test_error_answer_raises_its_classified_error(headers: dict[str, str], body: bytes,
                                                  kind: type[BrokerError]) -> None:
    s = ClientSession(context="tcp://h:1: ")
    with pytest.raises(kind) as info:
        s.feed(serialize(Frame.make("ERROR", headers, body), "1.2"))
    assert type(info.value) is kind
    assert str(info.value).startswith("tcp://h:1: CONNECT refused: ")
    assert info.value.frame is not None and info.value.frame.command == "ERROR"


@pytest.mark.parametrize(("data", "words"), [
    (b"", "connection closed during the STOMP handshake"),
    (serialize(Frame.make("RECEIPT", {"receipt-id": "1"}), "1.2"), "expected CONNECTED, got RECEIPT"),
    (serialize(Frame.make("CONNECTED", {"version": "1.2", "heart-beat": "x"}), "1.2"), "bad handshake"),
    (serialize(Frame.make("CONNECTED", {"version": "2.0"}), "1.2"), "no common STOMP version"),
    (b"HELLO\n\n\x00", "bad handshake"),
])
def test_nonsense_is_a_connect_error_naming_it(data: bytes, words: str) -> None:
    with pytest.raises(ConnectError, match=words):
        ClientSession().feed(data)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=5))
def test_fuzz_feed_gives_terms_none_or_a_family_error(chunks: list[bytes]) -> None:
    s = ClientSession()
    for chunk in chunks:
        try:
            if s.feed(chunk) is not None:
                return
        except (ConnectError, BrokerError):
            return


def test_error_text_joins_message_and_body() -> None:
    assert error_text(Frame.make("ERROR", {"message": "Bad CONNECT"}, b"vhost\n denied")) == "Bad CONNECT: vhost denied"
    assert error_text(Frame.make("ERROR", {"message": "same"}, b"same")) == "same"
    assert error_text(Frame.make("ERROR", {}, b"")) == "ERROR frame"
    assert isinstance(error_from_frame(Frame.make("ERROR", {"message": "disk full"})), BrokerError)


MESSAGE = Frame.make("MESSAGE", {"subscription": "s1", "message-id": "m-7", "ack": "a-7", "destination": "/q/x"})


@pytest.mark.parametrize(("version", "headers"), [
    ("1.2", {"id": "a-7"}),
    ("1.1", {"message-id": "m-7", "subscription": "s1"}),
    ("1.0", {"message-id": "m-7"}),
])
def test_ack_per_version_and_back(version: str, headers: dict[str, str]) -> None:
    frame = ack_frame("ACK", MESSAGE, version)
    assert frame.header_map == headers
    ref = parse_ack(frame, version)
    assert ref.id == ("a-7" if version == "1.2" else "m-7")
    assert ref.subscription == ("s1" if version == "1.1" else None)
    tx = ack_frame("ACK", MESSAGE, version, transaction="tx-1")
    assert tx.headers[0] == ("transaction", "tx-1") and parse_ack(tx, version).transaction == "tx-1"


def test_nack_needs_11_and_missing_headers_are_named() -> None:
    with pytest.raises(LocalProtocolError, match="NACK needs STOMP 1.1"):
        ack_frame("NACK", MESSAGE, "1.0")
    with pytest.raises(RemoteProtocolError, match="NACK is not part of STOMP 1.0"):
        parse_ack(Frame.make("NACK", {"message-id": "m"}), "1.0")
    with pytest.raises(RemoteProtocolError, match="'id'"):
        parse_ack(Frame.make("ACK", {}), "1.2")
    with pytest.raises(RemoteProtocolError, match="'message-id'"):
        parse_ack(Frame.make("ACK", {"id": "x"}), "1.1")
    # a 1.2 client that names message-id (older habits) is still understood
    assert parse_ack(Frame.make("ACK", {"message-id": "m"}), "1.2").id == "m"


# -- the server side, and the HA requests that use both sides ------------------------------


def test_server_session_skips_heartbeats_and_returns_the_first_frame_across_chunks() -> None:
    from amqtransport.stomp.session import ServerSession

    client = ClientSession(host="amq-ha", accept_version="1.2", extra_headers=[("amq-ha-status", "1")])
    wire = b"\n\r\n" + client.connect_bytes()
    server = ServerSession()
    got = [server.feed(wire[i:i + 7]) for i in range(0, len(wire), 7)]
    assert [g for g in got if g is not None] == [client.frame]
    assert got[-1] == client.frame
    with pytest.raises(LocalProtocolError):
        server.feed(b"\n")


def test_server_session_refuses_garbage_with_a_protocol_error() -> None:
    from amqtransport.stomp.session import ServerSession

    with pytest.raises(RemoteProtocolError):
        ServerSession().feed(b"CONNECT\nno-colon-here\n\n\x00")


def test_ha_requests_handshake_through_the_session_against_a_real_ha_port() -> None:
    """The blocking and the asyncio HA request against a listening HA port (a node-less
    stand-in answering through :class:`ServerSession`): CONNECTED is the answer, an
    ERROR is returned by the blocking request and raised as ReplicaRefused by the other."""
    import asyncio
    import socket
    import threading

    from amqtransport.broker.ha.wire import ReplicaRefused, ha_request, ha_request_sync
    from amqtransport.stomp.session import ServerSession

    def serve(answer: Frame) -> tuple[socket.socket, list[Frame]]:
        lsock = socket.create_server(("127.0.0.1", 0))
        seen: list[Frame] = []

        def run() -> None:
            for _ in range(2):
                conn, _addr = lsock.accept()
                with conn:
                    session = ServerSession()
                    while (frame := session.feed(conn.recv(5))) is None:
                        pass
                    seen.append(frame)
                    conn.sendall(serialize(answer, "1.2"))

        threading.Thread(target=run, daemon=True).start()
        return lsock, seen

    lsock, seen = serve(Frame.make("CONNECTED", [("version", "1.2"), ("amq-ha-role", "master")]))
    port = lsock.getsockname()[1]
    with lsock:
        assert ha_request_sync("127.0.0.1", port, 2.0).get("amq-ha-role") == "master"

        async def ask() -> Frame:
            frame, _r, writer = await ha_request("127.0.0.1", port, {"amq-ha-status": "1"}, 2.0)
            writer.close()
            return frame

        assert asyncio.run(ask()).get("amq-ha-role") == "master"
    assert [f.get("amq-ha-status") for f in seen] == ["1", "1"]
    assert all(f.get("host") == "amq-ha" and f.get("accept-version") == "1.2" for f in seen)

    lsock, seen = serve(Frame.make("ERROR", [("message", "not the master")]))
    port = lsock.getsockname()[1]
    with lsock:
        assert ha_request_sync("127.0.0.1", port, 2.0).command == "ERROR"
        with pytest.raises(ReplicaRefused, match="not the master"):
            asyncio.run(ask())
