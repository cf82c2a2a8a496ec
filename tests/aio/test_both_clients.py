"""Client behaviour written once and run with both clients: the sync
``amqtransport.connect`` and the asyncio ``amqtransport.aio.connect``, against a real
replicated pair whose master is SIGKILLed. The driver-level behaviour (replay,
transactions across failover, priority backup, schedule, heart-beats) is
tests/transports/test_failover_drivers.py; this is the client layer above it (the
duplicate filter and acknowledgements)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

import amqtransport
import amqtransport.aio as aio
from amqtransport.received import ReceivedMessage
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(180)

T = TypeVar("T")


class Client(Protocol):
    """The calls the test body makes, the same for both clients."""

    def send(self, destination: str, body: str) -> None: ...

    def subscribe(self, destination: str, ack: str) -> object: ...

    def receive(self, sub: object, timeout: float) -> ReceivedMessage | None: ...

    def ack(self, msg: ReceivedMessage) -> None: ...

    @property
    def duplicates(self) -> int: ...

    def close(self) -> None: ...


class SyncClient:
    def __init__(self, uri: str) -> None:
        self.conn = amqtransport.connect(uri)

    def send(self, destination: str, body: str) -> None:
        self.conn.send(destination, body)

    def subscribe(self, destination: str, ack: str) -> object:
        return self.conn.subscribe(destination, ack=ack)  # type: ignore[arg-type]

    def receive(self, sub: object, timeout: float) -> ReceivedMessage | None:
        assert isinstance(sub, amqtransport.Subscription)
        return sub.receive(timeout)

    def ack(self, msg: ReceivedMessage) -> None:
        assert isinstance(msg, amqtransport.Message)
        msg.ack()

    @property
    def duplicates(self) -> int:
        return self.conn.duplicates

    def close(self) -> None:
        self.conn.close()


class AsyncClient:
    """The asyncio client on its own loop in a thread; each call waits for its coroutine."""

    def __init__(self, uri: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.conn: aio.AsyncConnection = self.run(aio.connect(uri).__aenter__())

    def run(self, coro: Coroutine[object, object, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def send(self, destination: str, body: str) -> None:
        self.run(self.conn.send(destination, body))

    def subscribe(self, destination: str, ack: str) -> object:
        return self.run(self.conn.subscribe(destination, ack=ack))  # type: ignore[arg-type]

    def receive(self, sub: object, timeout: float) -> ReceivedMessage | None:
        assert isinstance(sub, aio.AsyncSubscription)
        return self.run(sub.receive(timeout))

    def ack(self, msg: ReceivedMessage) -> None:
        assert isinstance(msg, aio.AsyncMessage)
        self.run(msg.ack())

    @property
    def duplicates(self) -> int:
        return self.conn.duplicates

    def close(self) -> None:
        self.run(self.conn.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(params=["sync", "asyncio"])
def make_client(request: pytest.FixtureRequest) -> Iterator[type[SyncClient] | type[AsyncClient]]:
    yield SyncClient if request.param == "sync" else AsyncClient


def test_redeliveries_after_a_failover_reach_the_application_once(
        make_client: type[SyncClient] | type[AsyncClient], tmp_path: Path) -> None:
    """A client-individual consumer holds 5 unacknowledged messages when the master is
    SIGKILLed; the new master redelivers all 5 on the new link. The duplicate filter
    drops the 5 copies (the application never sees them), and the application's ACKs
    of the originals (their link is dead) are carried out on the copies, so the queue
    ends empty."""
    with BrokerPair("replicated", tmp_path, lock_interval=0.05) as bp:
        bp.wait_master()
        uri = bp.uri + "&initialReconnectDelay=10&maxReconnectDelay=200"
        client: Client = make_client(uri)
        try:
            for i in range(5):
                client.send("/queue/both", f"m{i}")
            sub = client.subscribe("/queue/both", "client-individual")
            held = [client.receive(sub, 5) for _ in range(5)]
            assert all(m is not None for m in held)
            bp.wait_in_sync(timeout=30)
            bp.kill_master()
            deadline = 60.0
            while client.duplicates < 5 and deadline > 0:
                extra = client.receive(sub, 0.5)
                assert extra is None, f"a redelivered copy reached the application: {extra}"
                deadline -= 0.5
            assert client.duplicates == 5
            for msg in held:
                assert msg is not None
                client.ack(msg)
            assert client.receive(sub, 1.0) is None
        finally:
            client.close()
        check = make_client(uri)
        try:
            after = check.subscribe("/queue/both", "client-individual")
            assert check.receive(after, 2.0) is None, "the copies were not acknowledged"
        finally:
            check.close()
