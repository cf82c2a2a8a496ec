"""The public asyncio API (amqtransport.aio) against real brokers: the embedded broker
on a loopback socket, and a replicated/shared-store pair whose master is SIGKILLed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import amqtransport.aio as aio
from amqtransport.broker import EmbeddedBroker
from amqtransport.errors import ConnectionClosed, LocalProtocolError, ReconnectExhausted
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as b:
        yield b


def uri_of(b: EmbeddedBroker) -> str:
    return f"tcp://127.0.0.1:{b.port}"


async def drain(sub: aio.AsyncSubscription, idle: float = 0.5) -> list[aio.AsyncMessage]:
    got = []
    while (m := await sub.receive(timeout=idle)) is not None:
        got.append(m)
        await m.ack()
    return got


def test_the_documented_contract(broker: EmbeddedBroker) -> None:
    """Every call of the issue's contract, by name, on one connection."""

    async def main() -> None:
        async with aio.connect(uri_of(broker), login=None, passcode=None) as conn:
            assert isinstance(conn, aio.AsyncConnection) and conn.is_connected and conn.dialect == "amq"
            await conn.send("/queue/c", b"one", headers={"k": "v"}, persistent=True)
            async with conn.producer(window=10) as p:
                for i in range(25):
                    await p.send("/queue/c", f"p{i}")
                assert p.outstanding <= 10
            assert p.outstanding == 0 and p.receipted == 25
            sub = await conn.subscribe("/queue/c", ack="client", headers=None)
            bodies = []
            async for msg in sub:
                bodies.append(msg.body)
                assert msg.headers["destination"] == "/queue/c"
                await msg.ack()
                if len(bodies) == 26:
                    break
            assert bodies[0] == b"one" and bodies[1:] == [f"p{i}".encode() for i in range(25)]
            assert (await sub.receive(timeout=0.3)) is None
            async with conn.transaction() as tx:
                await tx.send("/queue/t", "in tx")
            tsub = await conn.subscribe("/queue/t", ack="client-individual")
            m = await tsub.receive(timeout=5)
            assert m is not None and m.text == "in tx"
            async with conn.transaction() as tx:
                await tx.ack(m)
            await tsub.unsubscribe()
            again = await conn.subscribe("/queue/t", ack="client-individual")
            assert await again.receive(timeout=0.5) is None  # the transactional ACK took
        with pytest.raises(ConnectionClosed):
            await conn.send("/queue/c", "after close")

    asyncio.run(main())


def test_await_connect_and_a_transaction_aborted_by_an_exception(broker: EmbeddedBroker) -> None:
    async def main() -> list[str]:
        conn = await aio.connect(f"failover:({uri_of(broker)})")
        try:
            with pytest.raises(RuntimeError):
                async with conn.transaction() as tx:
                    await tx.send("/queue/ab", "never")
                    raise RuntimeError("boom")
            await conn.send("/queue/ab", "kept")
            sub = await conn.subscribe("/queue/ab")
            m = await sub.receive(timeout=5)
            assert m is not None and m.text == "kept"
            with pytest.raises(LocalProtocolError):
                await m.nack()  # nack needs a client ack mode
            return [m.text for m in await drain(sub)]
        finally:
            await conn.close()

    assert asyncio.run(main()) == []  # the aborted transaction's send never arrived


def test_cancelled_sends_leave_whole_frames_and_a_usable_connection(broker: EmbeddedBroker) -> None:
    """300 tasks send 1 KiB bodies on one connection; half are cancelled at random
    points. The broker parses every frame it got (a torn frame would end the link), the
    connection still works, and every send that returned was delivered exactly once."""

    async def main() -> tuple[set[str], list[str], bool]:
        async with aio.connect(uri_of(broker)) as conn:
            done: set[str] = set()

            async def one(i: int) -> None:
                await conn.send("/queue/cancel", f"{i:04d}".ljust(1024, "x"))
                done.add(f"{i:04d}")

            tasks = [asyncio.create_task(one(i)) for i in range(300)]
            for k, task in enumerate(tasks):
                if k % 2:
                    await asyncio.sleep(0)
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await conn.send("/queue/cancel", "last".ljust(1024, "x"))
            sub = await conn.subscribe("/queue/cancel")
            bodies = [m.text[:4] for m in await drain(sub, idle=1.0)]
            return done, bodies, conn.is_connected

    done, bodies, connected = asyncio.run(main())
    assert connected
    assert "last" in bodies
    assert len(bodies) == len(set(bodies)), "a message was delivered twice"
    assert done <= set(bodies), f"returned but not delivered: {sorted(done - set(bodies))[:5]}"
    assert all(len(b) == 4 for b in bodies)


def test_a_refused_send_in_a_producer_raises_once_and_the_producer_goes_on(broker: EmbeddedBroker) -> None:
    """The broker refuses one send of a pipelined producer (a bad destination): that
    error is raised once, by the producer call that reaps it (as in the sync
    producer, that call's own message is then not sent), and the producer keeps
    working. Before, the refused receipt stayed at the head of the window and every
    later send and the flush raised it again."""
    from amqtransport.errors import BrokerError

    async def main() -> tuple[list[int], list[str]]:
        async with aio.connect(f"failover:({uri_of(broker)})?initialReconnectDelay=10") as conn:
            raised: list[int] = []
            async with conn.producer(window=5) as p:
                await p.send("bad-destination", "refused")
                for i in range(20):
                    try:
                        await p.send("/queue/prod", str(i))
                    except BrokerError:
                        raised.append(i)
            sub = await conn.subscribe("/queue/prod")
            return raised, [m.text for m in await drain(sub)]

    raised, bodies = asyncio.run(main())
    assert len(raised) == 1
    assert sorted(bodies, key=int) == [str(i) for i in range(20) if i not in raised]


def test_subscription_ack_many_refuses_messages_of_another_subscription(broker: EmbeddedBroker) -> None:
    """``sub.ack_many(messages)`` acknowledges messages of ``sub`` only, as in the sync
    client: a message of another subscription raises ``ValueError`` and nothing is
    acked (it comes back on the next connection). Before, the asyncio twin acked
    whatever it was given."""

    async def main() -> tuple[str, str, list[str]]:
        async with aio.connect(uri_of(broker)) as conn:
            await conn.send("/queue/ackmany.a", "a0")
            sub_a = await conn.subscribe("/queue/ackmany.a", ack="client-individual")
            sub_b = await conn.subscribe("/queue/ackmany.b", ack="client-individual")
            msg = await sub_a.receive(5)
            assert msg is not None
            with pytest.raises(ValueError, match="subscription") as info:
                await sub_b.ack_many([msg])
        async with aio.connect(uri_of(broker)) as conn:
            again = await conn.subscribe("/queue/ackmany.a", ack="client-individual")
            return str(info.value), sub_a.id, [m.text for m in await drain(again)]

    error, sub_a_id, back = asyncio.run(main())
    assert repr(sub_a_id) in error  # names the subscription the message came on
    assert back == ["a0"]


def test_a_thousand_tasks_share_one_connection(broker: EmbeddedBroker) -> None:
    async def main() -> list[str]:
        async with aio.connect(uri_of(broker)) as conn:
            await asyncio.gather(*(conn.send("/queue/many", str(i)) for i in range(1000)))
            sub = await conn.subscribe("/queue/many", ack="client-individual")
            return [m.text for m in await drain(sub)]

    bodies = asyncio.run(main())
    assert sorted(bodies, key=int) == [str(i) for i in range(1000)]


def test_a_timeout_around_any_call_works(broker: EmbeddedBroker) -> None:
    async def main() -> None:
        async with aio.connect(uri_of(broker)) as conn:
            sub = await conn.subscribe("/queue/empty")
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await sub.receive()
            await conn.send("/queue/empty", "still usable")
            m = await sub.receive(timeout=5)
            assert m is not None and m.text == "still usable"

    asyncio.run(main())


def test_a_vm_leaf_starts_the_in_process_broker_as_in_the_sync_client() -> None:
    import amqtransport

    async def main() -> str | None:
        async with aio.connect("vm://aio-test") as conn:
            await conn.send("/queue/vm", "via vm")
        with amqtransport.connect("vm://aio-test") as sync:  # the same in-process broker
            msg = sync.subscribe("/queue/vm").receive(timeout=5)
            return msg.text if msg else None

    assert asyncio.run(main()) == "via vm"


def test_a_refused_connect_to_one_broker_raises_the_connect_error_as_the_sync_client() -> None:
    import amqtransport
    from amqtransport.errors import ConnectError
    from amqtransport.processes.ports import free_port

    uri = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectError) as sync_err:
        amqtransport.connect(uri)

    async def main() -> None:
        await aio.connect(uri)

    with pytest.raises(ConnectError) as async_err:
        asyncio.run(main())
    assert type(async_err.value) is type(sync_err.value)


def test_a_refused_connect_raises_the_failover_error() -> None:
    from amqtransport.processes.ports import free_port

    async def main() -> None:
        await aio.connect(f"failover:(tcp://127.0.0.1:{free_port()})?maxReconnectAttempts=1"
                          "&startupMaxReconnectAttempts=1&initialReconnectDelay=10")

    with pytest.raises(ReconnectExhausted):
        asyncio.run(main())


@pytest.mark.parametrize("mode", ["replicated", "shared-store"])
def test_fifty_tasks_through_a_master_sigkill_deliver_each_returned_send_once(mode: str, tmp_path: Path) -> None:
    """50 tasks share one failover connection; the pair's master is SIGKILLed mid-run.
    Every send that returned is consumed exactly once by a client-individual consumer
    on another connection (its duplicate filter drops redelivered copies); listeners,
    one plain and one async, see the interruption and the resume."""
    seen: list[str] = []

    class Listener:
        def on_interrupted(self, error: BaseException) -> None:
            seen.append("interrupted")

        async def on_resumed(self, address: str) -> None:
            seen.append("resumed")

    with BrokerPair(mode, tmp_path, lock_interval=0.05) as bp:
        bp.wait_master()
        uri = bp.uri + "&initialReconnectDelay=10&maxReconnectDelay=200"

        async def main() -> tuple[set[str], list[str], int]:
            async with aio.connect(uri, listener=Listener()) as prod, aio.connect(uri) as cons:
                sub = await cons.subscribe("/queue/fifty", ack="client-individual")
                returned: set[str] = set()
                killed = asyncio.Event()

                async def worker(w: int) -> None:
                    for i in range(12):
                        await prod.send("/queue/fifty", f"{w}-{i}")
                        returned.add(f"{w}-{i}")
                        if len(returned) >= 150 and not killed.is_set():
                            killed.set()
                            await asyncio.to_thread(bp.kill_master)

                await asyncio.gather(*(worker(w) for w in range(50)))
                got: list[str] = []
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                while loop.time() < deadline and not returned <= set(got):
                    m = await sub.receive(timeout=1.0)
                    if m is not None:
                        got.append(m.text)
                        await m.ack()
                got += [m.text for m in await drain(sub, idle=1.0)]
                return returned, got, prod.transport.reconnects

        returned, got, reconnects = asyncio.run(main())
    assert len(returned) == 600
    assert returned <= set(got), f"{len(returned - set(got))} returned sends never delivered"
    assert len(got) == len(set(got)), "a message reached the application twice"
    assert reconnects >= 1
    assert seen[:2] == ["interrupted", "resumed"]
