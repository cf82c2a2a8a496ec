"""The asyncio failover driver (amqtransport/aio/failover.py) over the sans-IO core:
against the embedded broker, then a real broker pair whose master is SIGKILLed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqtransport.aio.failover import AsyncFailoverTransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.errors import ReconnectExhausted
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.stomp.session import ack_frame
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.transports.aio_link import AsyncLink, FrameHandler, LostHandler, open_stream_link
from amqtransport.transports.factory import failover_spec
from amqtransport.transports.link import ConnectParams
from amqtransport.uri import LeafUri

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as b:
        yield b


def send_frame(queue: str, key: str) -> Frame:
    return Frame.make("SEND", {"destination": queue, IDEMPOTENCY_HEADER: key, "persistent": "true"},
                      key.encode())


class Consumer:
    """Acks each MESSAGE on the link it came on (client-individual) and records bodies."""

    def __init__(self, transport: AsyncFailoverTransport) -> None:
        self.transport = transport
        self.bodies: list[str] = []
        self.got = asyncio.Event()
        transport.on_message = self.on_message

    def on_message(self, frame: Frame, generation: int) -> None:
        self.bodies.append(frame.body.decode())
        self.transport.write_if_current(ack_frame("ACK", frame, self.transport.version), generation)
        self.got.set()


class Events:
    """A listener with one plain and two async methods."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_interrupted(self, error: BaseException) -> None:
        self.seen.append("interrupted")

    async def on_resumed(self, address: str) -> None:
        await asyncio.sleep(0)
        self.seen.append("resumed")

    def on_failed(self, error: BaseException) -> None:
        self.seen.append("failed")


async def drain(consumer: Consumer, expected: set[str], timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not expected <= set(consumer.bodies) and loop.time() < deadline:
        consumer.got.clear()
        try:
            async with asyncio.timeout(0.2):
                await consumer.got.wait()
        except TimeoutError:
            pass


def test_send_subscribe_and_receive_on_one_link(broker: EmbeddedBroker) -> None:
    async def main() -> None:
        t = AsyncFailoverTransport.from_uri(f"failover:({broker.uri})")
        await t.start()
        consumer = Consumer(t)
        sub = Frame.make("SUBSCRIBE", {"id": "s1", "destination": "/queue/aio.one", "ack": "client-individual"})
        await t.wait(await t.subscribe("s1", sub), timeout=5)
        keys = [f"m-{i}" for i in range(20)]
        receipts = [await t.request(send_frame("/queue/aio.one", k)) for k in keys]
        for rec in receipts:
            assert rec is not None
            assert (await t.wait(rec, timeout=5)).command == "RECEIPT"
        await drain(consumer, set(keys), 10)
        assert sorted(consumer.bodies) == sorted(keys)
        assert t.is_connected and t.generation == 1
        await t.close()
        assert t.state == "closed"

    asyncio.run(main())


def test_cancelled_waits_leave_the_connection_usable(broker: EmbeddedBroker) -> None:
    async def main() -> None:
        t = AsyncFailoverTransport.from_uri(f"failover:({broker.uri})")
        await t.start()
        consumer = Consumer(t)
        sub = Frame.make("SUBSCRIBE", {"id": "s1", "destination": "/queue/aio.cancel", "ack": "client-individual"})
        await t.wait(await t.subscribe("s1", sub), timeout=5)

        async def one(key: str) -> None:
            rec = await t.request(send_frame("/queue/aio.cancel", key))
            assert rec is not None
            await t.wait(rec)

        tasks = [asyncio.create_task(one(f"c-{i}")) for i in range(200)]
        await asyncio.sleep(0)
        for task in tasks[::2]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await one("after")
        await drain(consumer, {"after"}, 10)
        # every frame that went out was whole: the broker parsed each one (no ERROR, link up)
        assert "after" in consumer.bodies and t.is_connected and t.reconnects == 0
        await t.close()

    asyncio.run(main())


def test_a_refused_first_connect_gives_up_with_the_option_named() -> None:
    async def main() -> None:
        t = AsyncFailoverTransport.from_uri(
            "failover:(tcp://127.0.0.1:1)?startupMaxReconnectAttempts=1&initialReconnectDelay=1")
        events = Events()
        t.add_listener(events)
        with pytest.raises(ReconnectExhausted, match="startupMaxReconnectAttempts"):
            await t.start()
        assert t.state == "failed" and events.seen == ["failed"]

    asyncio.run(main())


@pytest.mark.parametrize("mode", ["replicated", "shared-store"])
def test_sigkill_of_the_master_loses_nothing_receipted(mode: str, tmp_path: Path) -> None:
    """Receipted sends across a master SIGKILL: the subscription is replayed on the new
    master, requests in flight are replayed there, every receipted message is consumed."""
    with BrokerPair(mode, tmp_path, lock_interval=0.05) as bp:
        bp.wait_master()

        async def main() -> tuple[set[str], Consumer, Events, AsyncFailoverTransport]:
            t = AsyncFailoverTransport.from_uri(bp.uri + "&initialReconnectDelay=10&maxReconnectDelay=200")
            events = Events()
            t.add_listener(events)
            await t.start()
            consumer = Consumer(t)
            sub = Frame.make("SUBSCRIBE", {"id": "s1", "destination": "/queue/aio.kill", "ack": "client-individual"})
            await t.wait(await t.subscribe("s1", sub), timeout=10)
            receipted: set[str] = set()
            killed = False

            async def producer(worker: int) -> None:
                nonlocal killed
                for i in range(60):
                    key = f"w{worker}-{i}"
                    rec = await t.request(send_frame("/queue/aio.kill", key))
                    assert rec is not None
                    await t.wait(rec, timeout=60)
                    receipted.add(key)
                    if len(receipted) >= 100 and not killed:
                        killed = True
                        await asyncio.to_thread(bp.kill_master)

            await asyncio.gather(*(producer(w) for w in range(5)))
            await drain(consumer, receipted, 30)
            await t.close()
            return receipted, consumer, events, t

        receipted, consumer, events, t = asyncio.run(main())
    assert len(receipted) == 300
    missing = receipted - set(consumer.bodies)
    assert not missing, f"{len(missing)} receipted message(s) never consumed: {sorted(missing)[:10]}"
    assert t.reconnects >= 1 and t.generation >= 2
    assert events.seen[:2] == ["interrupted", "resumed"]


def test_a_silent_broker_is_detected_by_heart_beats_and_the_transport_fails_over() -> None:
    """Half-open link: the peer completes the handshake (heart-beats every 100 ms), then
    sends nothing. The link is declared lost after two intervals and, with
    maxReconnectAttempts=0, every waiting request fails instead of waiting forever."""
    from amqtransport.errors import HeartbeatTimeout

    async def main() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\0")
            writer.write(b"CONNECTED\nversion:1.2\nheart-beat:100,100\n\n\0")
            await asyncio.sleep(30)  # then silence: no heart-beats, no receipts

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        t = AsyncFailoverTransport.from_uri(f"failover:(tcp://127.0.0.1:{port})?maxReconnectAttempts=0",
                                            ConnectParams(heartbeat=(100, 100)))
        events = Events()
        t.add_listener(events)
        await t.start()
        rec = await t.request(send_frame("/queue/q", "k-1"))
        assert rec is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ReconnectExhausted) as info:
            await t.wait(rec, timeout=10)
        assert loop.time() - started < 2.0
        assert isinstance(info.value.last_error, HeartbeatTimeout)
        assert t.state == "failed" and "failed" in events.seen
        await t.close()
        server.close()

    asyncio.run(main())


def test_heart_beats_keep_the_link_up_and_their_end_is_noticed() -> None:
    """The read deadline (one timer, re-armed from the last byte) never fires while the
    broker beats every 50 ms (deadline 500 ms: 2 x 250) for 1.5 s; once the beats stop
    the link is declared half-open. The broker is a thread of its own, so a stalled
    event loop finds the beats waiting (read before the timer runs)."""
    import socket
    import threading

    from amqtransport.errors import HeartbeatTimeout

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    beating, done = threading.Event(), threading.Event()
    beating.set()

    def beats() -> None:
        conn, _ = srv.accept()
        with conn:
            while b"\0" not in conn.recv(65536):
                pass
            conn.sendall(b"CONNECTED\nversion:1.2\nheart-beat:250,250\n\n\0")
            while beating.is_set():
                time.sleep(0.05)
                conn.sendall(b"\n")
            done.wait(60)  # then silence, the socket open

    async def main() -> None:
        t = AsyncFailoverTransport.from_uri(f"failover:(tcp://127.0.0.1:{srv.getsockname()[1]})?maxReconnectAttempts=0",
                                            ConnectParams(heartbeat=(250, 250)))
        await t.start()
        await asyncio.sleep(1.5)
        assert t.is_connected and t.state != "failed"
        beating.clear()
        rec = await t.request(send_frame("/queue/q", "k-1"))
        assert rec is not None
        with pytest.raises(ReconnectExhausted) as info:
            await t.wait(rec, timeout=20)
        assert isinstance(info.value.last_error, HeartbeatTimeout)
        await t.close()

    server = threading.Thread(target=beats, daemon=True)
    server.start()
    try:
        asyncio.run(main())
    finally:
        done.set()
        srv.close()


def test_an_error_that_comes_with_connected_ends_the_link_at_once() -> None:
    """A broker that writes CONNECTED and an ERROR in one packet, then keeps the socket
    open and says nothing more: the ERROR is read with CONNECTED and handled as soon as
    the link is installed (it used to wait in the parser for bytes that never came, and
    a send waited for its receipt until its timeout)."""

    async def main() -> None:
        async def refusing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\0")
            writer.write(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\0ERROR\nmessage:go away\n\n\0")
            await asyncio.sleep(30)  # then silence, the socket open

        server = await asyncio.start_server(refusing, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        t = AsyncFailoverTransport.from_uri(f"failover:(tcp://127.0.0.1:{port})?maxReconnectAttempts=0")
        await t.start()
        with pytest.raises(ReconnectExhausted) as info:
            rec = await t.request(send_frame("/queue/q", "k-1"))
            assert rec is not None
            await t.wait(rec, timeout=20)
        assert "go away" in str(info.value)
        await t.close()
        server.close()

    asyncio.run(main())


def test_a_broker_that_closes_right_after_connected_is_reported_lost() -> None:
    """CONNECTED, then the end of the stream: whether the end is read with CONNECTED or
    after the link was installed, the link is reported lost (never left a zombie)."""

    async def main() -> None:
        async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\0")
            writer.write(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\0")
            writer.close()

        server = await asyncio.start_server(closing, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        t = AsyncFailoverTransport.from_uri(f"failover:(tcp://127.0.0.1:{port})?maxReconnectAttempts=0")
        await t.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while t.state != "failed" and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert t.state == "failed"
        await t.close()
        server.close()

    asyncio.run(main())


def test_an_async_listener_cancelled_by_close_before_it_ran_is_never_left_unawaited() -> None:
    """close() cancels the listener tasks still pending; a listener coroutine whose task
    never got to run is closed, not garbage collected un-awaited (a RuntimeWarning)."""
    import gc
    import warnings

    async def main() -> None:
        t = AsyncFailoverTransport.from_uri("failover:(tcp://127.0.0.1:1)?maxReconnectAttempts=0")
        events = Events()
        t.add_listener(events)
        t._notify("on_interrupted", RuntimeError("lost"))  # spawns the listener's task ...
        await t.close()  # ... which close() cancels before its first step
        assert events.seen == []

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]


def test_priority_backup_switches_back_once_the_first_broker_is_up() -> None:
    from amqtransport.testing.ports import free_port

    async def main() -> None:
        port_a = free_port()
        with EmbeddedBroker(port=0) as b:
            uri = f"failover:(tcp://127.0.0.1:{port_a},{b.uri})?randomize=false&priorityBackup=true"
            t = AsyncFailoverTransport.from_uri(uri + "&initialReconnectDelay=10&maxReconnectDelay=50")
            events = Events()
            t.add_listener(events)
            await t.start()
            assert t.connected_address == b.uri
            consumer = Consumer(t)
            sub = Frame.make("SUBSCRIBE", {"id": "s1", "destination": "/queue/aio.prio", "ack": "client-individual"})
            await t.wait(await t.subscribe("s1", sub), timeout=5)
            with EmbeddedBroker(port=port_a) as a:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10
                while t.connected_address != a.uri and loop.time() < deadline:
                    await asyncio.sleep(0.02)
                assert t.connected_address == a.uri and t.generation == 2
                assert events.seen == ["resumed"]  # a switch, not a loss
                rec = await t.request(send_frame("/queue/aio.prio", "on-a"))
                assert rec is not None
                await t.wait(rec, timeout=5)
                await drain(consumer, {"on-a"}, 10)  # the subscription moved with the link
                assert consumer.bodies == ["on-a"]
                await t.close()

    asyncio.run(main())


def test_a_pre_connected_backup_is_taken_first_on_a_loss() -> None:
    async def main() -> None:
        with EmbeddedBroker(port=0) as b:
            a = EmbeddedBroker(port=0).start()
            opened: list[str] = []

            async def counting(leaf: LeafUri, params: ConnectParams, on_frame: FrameHandler,
                               on_lost: LostHandler) -> AsyncLink:
                link = await open_stream_link(leaf, params, on_frame, on_lost)
                opened.append(link.address)
                return link

            spec = failover_spec(f"failover:({a.uri},{b.uri})?randomize=false&backup=true")
            t = AsyncFailoverTransport(spec.leaves, spec.options, open_link=counting)
            await t.start()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while t.backup_links < 1 and loop.time() < deadline:
                await asyncio.sleep(0.02)
            assert t.backup_links == 1 and t.connected_address == a.uri
            await asyncio.to_thread(a.stop)
            deadline = loop.time() + 10
            while t.connected_address != b.uri and loop.time() < deadline:
                await asyncio.sleep(0.02)
            # on the link opened in advance: no new connect to b
            assert t.connected_address == b.uri and opened == [a.uri, b.uri]
            assert t.backup_links == 0
            rec = await t.request(send_frame("/queue/aio.backup", "on-b"))
            assert rec is not None
            await t.wait(rec, timeout=5)
            await t.close()

    asyncio.run(main())


def test_a_raising_message_handler_does_not_end_the_link(broker: EmbeddedBroker) -> None:
    async def main() -> None:
        t = AsyncFailoverTransport.from_uri(f"failover:({broker.uri})")
        await t.start()
        seen: list[str] = []

        def handler(frame: Frame, generation: int) -> None:
            seen.append(frame.body.decode())
            raise RuntimeError("a bug in the application's handler")

        t.on_message = handler
        sub = Frame.make("SUBSCRIBE", {"id": "s1", "destination": "/queue/aio.raise"})
        await t.wait(await t.subscribe("s1", sub), timeout=5)
        for key in ("one", "two"):
            rec = await t.request(send_frame("/queue/aio.raise", key))
            assert rec is not None
            await t.wait(rec, timeout=5)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while len(seen) < 2 and loop.time() < deadline:
            await asyncio.sleep(0.02)
        assert seen == ["one", "two"] and t.reconnects == 0 and t.is_connected
        await t.close()

    asyncio.run(main())


def test_a_tracked_send_cancelled_while_disconnected_is_not_replayed_later() -> None:
    """trackMessages caches fire-and-forget sends for the next link; one whose caller was
    cancelled before it was written must not go out later (written whole or not at all)."""
    from amqtransport.testing.ports import free_port

    async def main() -> None:
        port = free_port()
        with EmbeddedBroker(port=port) as b:
            t = AsyncFailoverTransport.from_uri(
                f"failover:({b.uri})?trackMessages=true&initialReconnectDelay=10&maxReconnectDelay=50")
            await t.start()
            await asyncio.to_thread(b.stop)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while t.is_connected and loop.time() < deadline:
                await asyncio.sleep(0.02)
            kept = asyncio.create_task(t.request(send_frame("/queue/aio.track", "kept"), receipt=False))
            dropped = asyncio.create_task(t.request(send_frame("/queue/aio.track", "dropped"), receipt=False))
            await asyncio.sleep(0.05)
            assert t.cached_sends == 2
            dropped.cancel()
            with pytest.raises(asyncio.CancelledError):
                await dropped
            assert t.cached_sends == 1
            kept.cancel()
            await asyncio.gather(kept, return_exceptions=True)
            assert t.cached_sends == 0
            await t.close()

    asyncio.run(main())
