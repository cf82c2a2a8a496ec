"""The seam between the broker and its client connections (broker/connection/context.py).

A connection gets a BrokerContext, not the server; a ConnectHook declared on the
server sees every CONNECT first, and one that takes a frame takes the socket with
detach(). Real sockets, one BrokerServer on the test's own event loop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from amqtransport.broker import BrokerConfig, BrokerServer
from amqtransport.broker.config import check_login, hash_password
from amqtransport.broker.connection.context import HookedConnection
from amqtransport.stomp import Frame, FrameParser, NeedData, serialize


class Hook:
    """Takes CONNECT frames with an ``x-hook`` header and answers them itself."""

    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.seen: list[str] = []
        self.registered_when_seen: list[bool] = []

    def intercept_connect(self, conn: HookedConnection, frame: Frame) -> bool:
        self.seen.append(frame.get("x-hook") or "-")
        self.registered_when_seen.append(conn in self.server.connections)
        if frame.get("x-hook") is None:
            return False
        transport = conn.detach()
        assert transport is not None
        assert conn not in self.server.connections  # it left the broker's list
        assert conn.detach() is None  # and has nothing left to give
        transport.write(serialize(Frame.make("CONNECTED", {"version": "1.2", "x-answered-by": "hook"})))
        transport.close()
        return True


async def _exchange(host: str, port: int, frame: Frame) -> list[Frame]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(serialize(frame))
    parser = FrameParser("1.2")
    frames: list[Frame] = []
    try:
        while not frames:
            data = await asyncio.wait_for(reader.read(65536), 5)
            if not data:
                break
            parser.feed(data)
            while not isinstance(event := parser.next_event(), NeedData):
                if isinstance(event, Frame):
                    frames.append(event)
    finally:
        writer.close()
    return frames


def test_a_connect_hook_takes_the_socket_with_detach(tmp_path: Path) -> None:
    async def scenario() -> None:
        server = BrokerServer(BrokerConfig(port=0), data_dir=tmp_path)
        hook = Hook(server)
        server.connect_hook = hook
        await server.start()
        try:
            [answer] = await _exchange(server.host, server.port, Frame.make("CONNECT", {"accept-version": "1.2", "x-hook": "1"}))
            assert answer.command == "CONNECTED" and answer.get("x-answered-by") == "hook"
            assert answer.get("session") is None  # the broker's handler never answered it
            [plain] = await _exchange(server.host, server.port, Frame.make("CONNECT", {"accept-version": "1.2"}))
            assert plain.command == "CONNECTED" and plain.get("session") and plain.get("x-answered-by") is None
            assert hook.seen == ["1", "-"]
            assert hook.registered_when_seen == [True, True]
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_check_login_is_the_one_password_check() -> None:
    users = {"plain": "pw", "hashed": hash_password("secret", salt="s")}
    assert check_login(users, "plain", "pw")
    assert check_login(users, "hashed", "secret")
    assert not check_login(users, "hashed", "secret ")
    assert not check_login(users, "plain", None)  # a missing passcode is the empty one
    assert check_login({"u": ""}, "u", None)
    assert not check_login(users, None, "pw")  # a missing login never is a user
    assert not check_login(users, "nobody", "pw")
    assert not check_login({}, "plain", "pw")
