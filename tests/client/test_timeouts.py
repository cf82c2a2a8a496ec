"""``timeout=`` on every call of both clients that waits for the broker, against a
peer that keeps the link up but never receipts what it is sent (a real socket server:
it answers the STOMP handshake, then only the frames it is told to).

A call that times out raises ``SendTimeout`` naming the idempotency key to send again
with; a commit raises ``TransactionInDoubt`` with the keys of its sends; a SUBSCRIBE
that timed out is withdrawn (an UNSUBSCRIBE follows, the connection has no such
subscription). Before, only ``Producer.flush`` and ``receive`` took a timeout, and the
sync client's direct transport raised ``SendTimeout`` without the key."""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

import amqtransport
import amqtransport.aio as aio
from amqtransport.errors import SendTimeout, TransactionInDoubt
from amqtransport.testing.wait import wait_for

pytestmark = pytest.mark.timeout(90)

WAIT = 0.3  # the timeout the calls are given
BOUND = 15.0  # a call must give up well before this (loose: the machine is shared)


class MutePeer(socketserver.ThreadingTCPServer):
    """Answers CONNECT, then RECEIPTs only for the commands in ``answer``; records every
    command it reads."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answer: set[str]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.commands: list[str] = []

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.server_address[1]}"


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, MutePeer)
        sock: socket.socket = self.request
        buf = b""
        while True:
            data = sock.recv(65536)
            if not data:
                return
            buf += data
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                lines = raw.lstrip(b"\r\n").decode("utf-8", "replace").split("\n")
                command = lines[0].strip()
                headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                server.commands.append(command)
                if command in ("CONNECT", "STOMP"):
                    sock.sendall(b"CONNECTED\nversion:1.2\nheart-beat:0,0\nserver:mute/1\n\n\0")
                elif command in server.answer and "receipt" in headers:
                    sock.sendall(f"RECEIPT\nreceipt-id:{headers['receipt']}\n\n\0".encode())


@pytest.fixture
def peer() -> Iterator[MutePeer]:
    server = MutePeer({"BEGIN", "UNSUBSCRIBE", "ABORT"})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def bounded(started: float) -> None:
    assert time.monotonic() - started < BOUND


@pytest.mark.parametrize("failover", [False, True], ids=["tcp", "failover"])
def test_every_blocking_call_of_the_sync_client_takes_a_timeout(peer: MutePeer, failover: bool) -> None:
    uri = f"failover:({peer.uri})" if failover else peer.uri
    with amqtransport.connect(uri, heartbeat=(0, 0)) as conn:
        t0 = time.monotonic()
        with pytest.raises(SendTimeout) as sent:
            conn.send("/queue/t", "x", idempotency_key="k-send", timeout=WAIT)
        assert sent.value.idempotency_key == "k-send" and "k-send" in str(sent.value)
        bounded(t0)

        with pytest.raises(SendTimeout):
            conn.subscribe("/queue/t", ack="client-individual", timeout=WAIT)
        wait_for(lambda: "UNSUBSCRIBE" in peer.commands, 5, "the withdrawn subscription's UNSUBSCRIBE")
        assert conn._subs == {}

        p = conn.producer(window=1)
        p.send("/queue/t", "a", idempotency_key="k-a")  # room in the window: does not wait
        with pytest.raises(SendTimeout) as full:
            p.send("/queue/t", "b", idempotency_key="k-b", timeout=WAIT)
        assert full.value.idempotency_key == "k-a"  # the oldest, which it waited for
        p.send("/queue/t", "c", idempotency_key="k-c", timeout=WAIT)  # k-a is given up: room again
        with pytest.raises(SendTimeout) as flushed:
            p.flush(WAIT)
        assert flushed.value.idempotency_key == "k-c" and p.outstanding == 0

        with pytest.raises(TransactionInDoubt) as doubt:
            with conn.transaction(timeout=WAIT) as tx:  # the peer receipts BEGIN
                tx.send("/queue/t", "t1", idempotency_key="k-t1")
                tx.send("/queue/t", "t2", idempotency_key="k-t2")
        assert list(doubt.value.keys) == ["k-t1", "k-t2"]
        tx2 = conn.transaction()
        with tx2:
            with pytest.raises(TransactionInDoubt):
                tx2.commit(timeout=WAIT)
        bounded(t0)


def test_every_blocking_call_of_the_asyncio_client_takes_a_timeout(peer: MutePeer) -> None:
    async def main() -> None:
        async with aio.connect(peer.uri, heartbeat=(0, 0)) as conn:
            t0 = time.monotonic()
            with pytest.raises(SendTimeout) as sent:
                await conn.send("/queue/t", "x", idempotency_key="k-send", timeout=WAIT)
            assert sent.value.idempotency_key == "k-send"
            with pytest.raises(SendTimeout):
                await conn.subscribe("/queue/t", ack="client-individual", timeout=WAIT)
            assert conn._subs == {}
            p = conn.producer(window=1)
            await p.send("/queue/t", "a", idempotency_key="k-a")
            with pytest.raises(SendTimeout) as full:
                await p.send("/queue/t", "b", idempotency_key="k-b", timeout=WAIT)
            assert full.value.idempotency_key == "k-a"
            await p.send("/queue/t", "c", idempotency_key="k-c")
            with pytest.raises(SendTimeout) as flushed:
                await p.flush(WAIT)
            assert flushed.value.idempotency_key == "k-c"
            with pytest.raises(TransactionInDoubt) as doubt:
                async with conn.transaction(timeout=WAIT) as tx:
                    await tx.send("/queue/t", "t1", idempotency_key="k-t1")
            assert list(doubt.value.keys) == ["k-t1"]
            bounded(t0)

    asyncio.run(main())
    wait_for(lambda: "UNSUBSCRIBE" in peer.commands, 5, "the withdrawn subscription's UNSUBSCRIBE")


def test_a_begin_that_times_out_raises_send_timeout_and_leaves_no_transaction(peer: MutePeer) -> None:
    peer.answer.discard("BEGIN")
    with amqtransport.connect(f"failover:({peer.uri})", heartbeat=(0, 0)) as conn:
        with pytest.raises(SendTimeout):
            with conn.transaction(timeout=WAIT):
                pytest.fail("the BEGIN was never receipted")
        assert conn.transport._core.txs.open == {}  # type: ignore[attr-defined]
