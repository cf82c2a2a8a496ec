"""Batched acks (Connection.ack_many / Subscription.ack_many) against the embedded
broker: one ACK frame per message, all in one socket write; what was acked is gone
after a reconnect, what was not comes back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import amqtransport
from amqtransport.broker import EmbeddedBroker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as b:
        yield b


def test_ack_many_acks_each_message_in_one_write(broker: EmbeddedBroker) -> None:
    dest = "/queue/ackmany"
    with amqtransport.connect(broker.uri, heartbeat=(0, 0)) as conn:
        with conn.producer(window=50) as p:
            for i in range(40):
                p.send(dest, f"m{i}")
        sub = conn.subscribe(dest, ack="client-individual")
        got = [sub.receive(5) for _ in range(40)]
        assert all(m is not None for m in got)
        msgs = [m for m in got if m is not None]
        acked = [m for m in msgs if int(m.text[1:]) % 2 == 0]
        writer = conn.transport.link.writer  # type: ignore[attr-defined]
        before = writer.flushes
        sub.ack_many(acked)
        assert writer.flushes == before + 1  # 20 ACK frames, one socket write
        assert sub.receive(0.2) is None
    with amqtransport.connect(broker.uri, heartbeat=(0, 0)) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        back: list[str] = []
        while (m := sub.receive(1.0)) is not None:
            back.append(m.text)
            m.ack()
    assert sorted(back, key=lambda t: int(t[1:])) == [f"m{i}" for i in range(1, 40, 2)]


def test_ack_many_through_failover_and_auto_mode_is_a_no_op(broker: EmbeddedBroker) -> None:
    dest = "/queue/ackmany.fo"
    with amqtransport.connect(f"failover:({broker.uri})", heartbeat=(0, 0)) as conn:
        for i in range(6):
            conn.send(dest, f"m{i}")
        sub = conn.subscribe(dest, ack="client")
        msgs = [sub.receive(5) for _ in range(6)]
        assert all(m is not None for m in msgs)
        conn.ack_many([m for m in msgs[:3] if m is not None])
        auto = conn.subscribe("/queue/ackmany.auto")
        conn.send("/queue/ackmany.auto", "a")
        a = auto.receive(5)
        assert a is not None
        conn.ack_many([a])  # auto mode: nothing to send, no error
        other = conn.subscribe("/queue/ackmany.other", ack="client-individual")
        with pytest.raises(ValueError, match="subscription"):
            other.ack_many([m for m in msgs if m is not None])
    with amqtransport.connect(broker.uri, heartbeat=(0, 0)) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        back = []
        while (m := sub.receive(1.0)) is not None:
            back.append(m.text)
            m.ack()
    assert sorted(back) == ["m3", "m4", "m5"]
