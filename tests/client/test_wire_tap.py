"""The public wire tap (amqtransport/wire_tap.py) on both clients against the embedded
broker on a loopback socket: every MESSAGE reaches the tap before the duplicate filter
(so it sees the copy the filter drops), a raising tap does not stop delivery, and a
removed tap is no longer called."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import amqtransport
import amqtransport.aio as aio
from amqtransport.broker import EmbeddedBroker
from amqtransport.stomp import Frame

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as b:
        yield b


def uri_of(b: EmbeddedBroker) -> str:
    return f"tcp://127.0.0.1:{b.port}"


def test_sync_tap_sees_every_message_and_the_copy_the_filter_drops(broker: EmbeddedBroker) -> None:
    seen: list[tuple[bytes, int]] = []

    def broken(frame: Frame, generation: int) -> None:
        raise RuntimeError("a tap that raises")

    with amqtransport.connect(uri_of(broker)) as conn:
        conn.add_wire_tap(broken)
        conn.add_wire_tap(lambda frame, generation: seen.append((frame.body, generation)))
        sub = conn.subscribe("/queue/tap.sync", ack="client-individual")
        for i in range(3):
            conn.send("/queue/tap.sync", f"m{i}")
        got = [sub.receive(5) for _ in range(3)]
        assert [m.body for m in got if m is not None] == [b"m0", b"m1", b"m2"]
        assert [body for body, _ in seen] == [b"m0", b"m1", b"m2"]
        assert {gen for _, gen in seen} == {conn.transport.generation}
        # the same frame again, as a redelivery arrives: the filter drops it, the tap sees it
        first = got[0]
        assert first is not None and conn.transport.on_message is not None
        conn.transport.on_message(first.frame, first.generation)
        assert conn.duplicates == 1 and sub.receive(0.3) is None
        assert [body for body, _ in seen] == [b"m0", b"m1", b"m2", b"m0"]
        for m in got:
            assert m is not None
            m.ack()
        conn.remove_wire_tap(broken)
        conn.remove_wire_tap(broken)  # twice: ignored


def test_async_tap_sees_every_message_and_can_be_removed(broker: EmbeddedBroker) -> None:
    seen: list[bytes] = []

    def tap(frame: Frame, generation: int) -> None:
        seen.append(frame.body)

    async def main() -> None:
        async with aio.connect(uri_of(broker)) as conn:
            conn.add_wire_tap(tap)
            sub = await conn.subscribe("/queue/tap.async", ack="auto")
            await conn.send("/queue/tap.async", "a0")
            first = await sub.receive(timeout=5)
            assert first is not None and first.body == b"a0"
            conn.remove_wire_tap(tap)
            await conn.send("/queue/tap.async", "a1")
            second = await sub.receive(timeout=5)
            assert second is not None and second.body == b"a1"

    asyncio.run(main())
    assert seen == [b"a0"]
