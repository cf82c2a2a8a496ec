"""Message priority in our broker's queues (dispatch/priority.py) beyond the differential
test against ActiveMQ (tests/interop/test_activemq_priority.py): across the paging
boundary, after a restart, redelivery within a priority, transactions, bad input, and
``prioritized_messages = false``. The takeover case is tests/ha/test_priority_failover.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import amqtransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.broker.dispatch.errors import CoreError
from amqtransport.broker.dispatch.priority import parse_priority
from amqtransport.errors import BrokerError


def uri(b: EmbeddedBroker) -> str:
    return f"tcp://127.0.0.1:{b.port}"


def take(sub: amqtransport.Subscription, count: int) -> list[str]:
    out: list[str] = []
    while len(out) < count and (m := sub.receive(timeout=10)) is not None:
        out.append(m.text)
        m.ack()
    while (m := sub.receive(timeout=0.2)) is not None:
        out.append(m.text)
        m.ack()
    return out


def send_all(c: amqtransport.Connection, q: str, items: list[tuple[str, int]]) -> None:
    p = c.producer(window=100)
    for body, prio in items:
        p.send(q, body, headers={"priority": str(prio)})
    p.flush()


def expected(items: list[tuple[str, int]]) -> list[str]:
    return [b for b, _p in sorted(items, key=lambda e: -e[1])]  # stable: FIFO within a priority


MIXED = [(f"m{i}", (i * 7) % 10) for i in range(40)]


def test_higher_priority_first_fifo_within(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as c:
        send_all(c, "/queue/prio", MIXED)
        c.send("/queue/prio", "default")  # no header: 4
        sub = c.subscribe("/queue/prio", ack="client-individual", prefetch=1)
        got = take(sub, 41)
    want = expected([*MIXED, ("default", 4)])
    assert got == want


def test_prioritized_messages_false_is_fifo(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(prioritized_messages=False)
    with amqtransport.connect(uri(b)) as c:
        send_all(c, "/queue/fifo", MIXED)
        sub = c.subscribe("/queue/fifo", ack="client-individual", prefetch=1)
        assert take(sub, 40) == [b for b, _ in MIXED]


def test_priority_across_the_paging_boundary(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(page_window=20)
    low = [(f"low{i}", 0) for i in range(30)]  # 20 resident, 10 paged
    mid = [(f"mid{i}", 4) for i in range(30)]  # outrank every paged one: stay resident
    high = [(f"high{i}", 9) for i in range(5)]
    more_low = [(f"late{i}", 0) for i in range(5)]  # paged behind the first low ones
    with amqtransport.connect(uri(b)) as c:
        send_all(c, "/queue/paged", [*low, *mid, *high, *more_low])
        assert b.stats()["queues"]["/queue/paged"]["paged"] > 0  # type: ignore[index]
        sub = c.subscribe("/queue/paged", ack="client-individual", prefetch=1)
        got = take(sub, 70)
    assert got == expected([*low, *mid, *high, *more_low])


def test_priority_after_a_restart_and_redelivery_keeps_its_place(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    b = make_broker(data_dir=data)
    with amqtransport.connect(uri(b)) as c:
        send_all(c, "/queue/durable-prio", MIXED)
    b.stop()
    b = make_broker(data_dir=data)
    want = expected(MIXED)
    with amqtransport.connect(uri(b)) as c:
        sub = c.subscribe("/queue/durable-prio", ack="client-individual", prefetch=3)
        assert len([p for _b, p in MIXED if p == 9]) > 3
        first = [m.text for m in (sub.receive(timeout=10) for _ in range(3)) if m is not None]
        assert first == want[:3]
        sub.unsubscribe()  # not acked: back in front of their priority
        c.send("/queue/durable-prio", "urgent", headers={"priority": "9"})
        sub = c.subscribe("/queue/durable-prio", ack="client-individual", prefetch=1)
        got = take(sub, 41)
    # the three handed out and not acked go back before the other messages of their
    # priority (9s here), so before the 9 sent later; then the rest as before
    nines = [b for b, p in MIXED if p == 9]
    assert got[: len(nines) + 1] == [*nines, "urgent"]
    assert got[len(nines) + 1 :] == want[len(nines) :]


def test_transactional_sends_are_ordered_at_commit(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as c:
        with c.transaction() as tx:
            for body, prio in MIXED[:10]:
                tx.send("/queue/tx-prio", body, headers={"priority": str(prio)})
        sub = c.subscribe("/queue/tx-prio", ack="client-individual", prefetch=1)
        assert take(sub, 10) == expected(MIXED[:10])


@pytest.mark.parametrize("bad", ["10", "-1", "abc", "", "5.0", " 5x"])
def test_bad_priority_is_refused_and_the_connection_keeps_working(broker: EmbeddedBroker, bad: str) -> None:
    with amqtransport.connect(uri(broker)) as c:
        with pytest.raises(BrokerError, match="priority header must be an integer from 0 to 9"):
            c.send("/queue/bad-prio", "x", headers={"priority": bad})
        with pytest.raises(BrokerError, match="priority header must be an integer from 0 to 9"):
            with c.transaction() as tx:
                tx.send("/queue/bad-prio", "x", headers={"priority": bad})
        c.send("/queue/bad-prio", "fine", headers={"priority": "7"})
        sub = c.subscribe("/queue/bad-prio")
        assert take(sub, 1) == ["fine"]


@given(st.text(max_size=6))
def test_parse_priority_accepts_exactly_0_to_9(value: str) -> None:
    try:
        p = parse_priority(value)
    except CoreError as exc:
        assert repr(value) in str(exc)
        assert value.strip() not in {str(i) for i in range(10)}
    else:
        assert value.strip() == str(p) or value.strip().lstrip("0") in ("", str(p))
        assert 0 <= p <= 9
