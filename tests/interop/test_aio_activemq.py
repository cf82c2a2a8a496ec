"""The asyncio client (amqtransport.aio) against a real ActiveMQ Classic 5.17
shared-store master/slave pair, the master SIGKILLed mid-run (the sync client's twin
is tests/interop/test_client_activemq.py)."""

from __future__ import annotations

import asyncio

import pytest

import amqtransport.aio as aio
from amqtransport.processes.activemq import ActiveMQPair

pytestmark = [pytest.mark.activemq, pytest.mark.timeout(240)]


def test_async_producers_survive_a_master_kill_and_the_slave_has_every_receipted_message(
        activemq_pair: ActiveMQPair) -> None:
    """20 tasks share one asyncio failover connection; the master is SIGKILLed after 100
    receipts. Every send that returned is on the slave, and the consumer (on the slave,
    client-individual) sees each once: ActiveMQ may store a replayed send twice, the
    duplicate filter drops the copy."""
    pair = activemq_pair
    master, slave = pair.master.uri.split("?")[0], pair.slave.uri.split("?")[0]
    seen: list[str] = []

    class Events:
        def on_interrupted(self, error: BaseException) -> None:
            seen.append("interrupted")

        async def on_resumed(self, address: str) -> None:
            seen.append(f"resumed {address}")

    async def main() -> tuple[set[str], list[str], str | None]:
        receipted: set[str] = set()
        async with aio.connect(pair.uri, listener=Events(), heartbeat=(1000, 1000)) as conn:
            assert conn.connected_uri == master
            killed = asyncio.Event()

            async def worker(w: int) -> None:
                for i in range(20):
                    body = f"w{w}-{i}"
                    await conn.send("/queue/interop.aio", body)
                    receipted.add(body)
                    if len(receipted) >= 100 and not killed.is_set():
                        killed.set()
                        await asyncio.to_thread(pair.master.kill)

            await asyncio.gather(*(worker(w) for w in range(20)))
            producer_on = conn.connected_uri
        async with aio.connect(pair.uri) as conn:
            sub = await conn.subscribe("/queue/interop.aio", ack="client-individual")
            got: list[str] = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while loop.time() < deadline and not receipted <= set(got):
                msg = await sub.receive(timeout=1.0)
                if msg is not None:
                    got.append(msg.text)
                    await msg.ack()
            while (msg := await sub.receive(timeout=1.0)) is not None:
                got.append(msg.text)
                await msg.ack()
        return receipted, got, producer_on

    receipted, got, producer_on = asyncio.run(main())
    assert len(receipted) == 400
    assert producer_on == slave
    assert seen[:2] == ["interrupted", f"resumed {slave}"]
    assert receipted <= set(got), f"missing {sorted(receipted - set(got))[:10]}"
    assert len(got) == len(set(got)), "a message reached the application twice"
    assert set(got) == receipted
