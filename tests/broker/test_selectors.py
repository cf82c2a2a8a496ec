"""Selectors in our broker beyond what the differential test compares with ActiveMQ:
durable selectors across a restart (the Sub record), the record's encoding, a selective
consumer on a deep paged queue (each message evaluated about once, not per delivery),
wildcard queue consumers, and the depth/console view of set-aside messages."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import amqtransport
from amqtransport.broker import BrokerConfig, EmbeddedBroker
from amqtransport.broker.dispatch.core import BrokerCore
from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.dispatch.model import Subscription
from amqtransport.broker.store import Sub, decode, encode, paging, records
from amqtransport.selector import Selector, compile_selector


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


def test_sub_record_carries_the_selector_and_old_records_still_decode() -> None:
    with_sel = Sub("durable:c:n", "t", "c", "n", "color = 'red'")
    assert decode(encode(with_sel)) == with_sel
    plain = Sub("durable:c:n", "t", "c", "n")
    raw = encode(plain)
    assert raw[0] == 6  # the record type of earlier versions, unchanged when there is no selector
    assert decode(raw) == plain


def test_durable_selector_survives_a_restart(make_broker: Callable[..., EmbeddedBroker], tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = make_broker(data_dir=data)
    with amqtransport.connect(uri(b), client_id="c1") as c:
        c.subscribe("/topic/news", durable_name="d", selector="kind = 'keep'")
    b.stop()
    b = make_broker(data_dir=data)
    with amqtransport.connect(uri(b)) as c:
        for i, kind in enumerate(["keep", "drop", "keep"]):
            c.send("/topic/news", f"m{i}", headers={"kind": kind})
    b.stop()
    b = make_broker(data_dir=data)  # the copies were filtered by the recovered selector
    with amqtransport.connect(uri(b), client_id="c1") as c:
        sub = c.subscribe("/topic/news", durable_name="d", selector="kind = 'keep'")
        assert take(sub, 2) == ["m0", "m2"]


def test_durable_resubscribed_with_another_selector_starts_over(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker), client_id="c2") as c:
        c.subscribe("/topic/t2", durable_name="d", selector="n = '1'")
    with amqtransport.connect(uri(broker)) as c:
        c.send("/topic/t2", "old", headers={"n": "1"})
    with amqtransport.connect(uri(broker), client_id="c2") as c:
        sub = c.subscribe("/topic/t2", durable_name="d", selector="n = '2'")  # as ActiveMQ: a new subscription
        assert take(sub, 0) == []
        c.send("/topic/t2", "new", headers={"n": "2"})
        assert take(sub, 1) == ["new"]


def test_selective_consumer_on_a_deep_paged_queue_evaluates_each_message_about_once(
    make_broker: Callable[..., EmbeddedBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    b = make_broker(page_window=50)
    calls = [0]
    real = Selector.matches

    def counting(self: Selector, view: object) -> bool:
        calls[0] += 1
        return real(self, view)  # type: ignore[arg-type]

    monkeypatch.setattr(Selector, "matches", counting)
    n = 2000
    with amqtransport.connect(uri(b)) as c:
        p = c.producer(window=200)
        for i in range(n):
            p.send("/queue/deep", f"m{i}", headers={"hit": "yes" if i % 100 == 7 else "no"})
        p.flush()
        sub = c.subscribe("/queue/deep", ack="client-individual", prefetch=5, selector="hit = 'yes'")
        got = take(sub, n // 100)
        assert got == [f"m{i}" for i in range(7, n, 100)]
        print(f"{calls[0]} selector evaluations for {n} messages")
        assert calls[0] <= 2 * n, f"{calls[0]} selector evaluations for {n} messages"
        sub.unsubscribe()
        stats = b.stats()["queues"]["/queue/deep"]  # type: ignore[index]
        assert stats["depth"] == n - n // 100
        rest = c.subscribe("/queue/deep", ack="client-individual")
        others = take(rest, n - n // 100)
    assert others == [f"m{i}" for i in range(n) if i % 100 != 7]  # queue order kept


@pytest.mark.parametrize("selector", ["hit = 'yes'", "hit LIKE 'y%'"])
def test_a_selective_drain_of_a_deep_paged_queue_leaves_the_misses_paged(
    make_broker: Callable[..., EmbeddedBroker], monkeypatch: pytest.MonkeyPatch, selector: str
) -> None:
    """The misses are looked at where they are (dispatch/scan.py): never read back into a
    Message (nor, when the selector names a header's value, even decoded), and still in
    their places for the consumer that comes next."""
    b = make_broker(page_window=50)
    n = 2000
    with amqtransport.connect(uri(b)) as c:
        p = c.producer(window=200)
        for i in range(n):
            p.send("/queue/deeper", f"m{i}", headers={"hit": "yes" if i % 100 == 7 else "no"})
        p.flush()
        made, decoded = [0], [0]
        real_materialize, real_headers = paging.materialize, records._decode_headers

        def materialize(*args: object) -> Message:
            made[0] += 1
            return real_materialize(*args)  # type: ignore[arg-type]

        def headers(raw: bytes) -> tuple[tuple[str, str], ...]:
            decoded[0] += 1
            return real_headers(raw)

        monkeypatch.setattr(paging, "materialize", materialize)
        monkeypatch.setattr(records, "_decode_headers", headers)
        sub = c.subscribe("/queue/deeper", ack="client-individual", prefetch=5, selector=selector)
        got = take(sub, n // 100)
        assert got == [f"m{i}" for i in range(7, n, 100)]
        print(f"{made[0]} messages read back, {decoded[0]} header blocks decoded, {n} paged")
        assert made[0] <= n // 100, f"{made[0]} paged messages read back into Messages for {n // 100} matches"
        if selector == "hit = 'yes'":  # a necessary header value: the misses are never decoded
            assert decoded[0] <= 2 * (n // 100), f"{decoded[0]} header blocks decoded for {n // 100} matches"
        else:
            assert decoded[0] <= n + n // 10  # each looked at about once
        monkeypatch.undo()
        assert b.stats()["queues"]["/queue/deeper"]["depth"] == n - n // 100  # type: ignore[index]
        rest = c.subscribe("/queue/deeper", ack="client-individual")  # beside the selective one
        others = take(rest, n - n // 100)
    assert others == [f"m{i}" for i in range(n) if i % 100 != 7]  # the passed ones, in their places


def test_consumers_arriving_after_a_scan_get_the_passed_messages_first_in_order(
    make_broker: Callable[..., EmbeddedBroker]
) -> None:
    b = make_broker(page_window=20)
    with amqtransport.connect(uri(b)) as c:
        p = c.producer(window=100)
        for i in range(300):
            p.send("/queue/passed", f"m{i}", headers={"hit": "yes" if i % 50 == 7 else "no", "d": str(i % 10)})
        p.flush()
        hits = c.subscribe("/queue/passed", ack="client-individual", prefetch=100, selector="hit = 'yes'")
        assert take(hits, 6) == [f"m{i}" for i in range(7, 300, 50)]
        for i in range(300, 310):  # behind everything the scan passed
            c.send("/queue/passed", f"m{i}", headers={"hit": "no", "d": str(i % 10)})
        threes = c.subscribe("/queue/passed", ack="client-individual", selector="d = '3'")
        assert take(threes, 31) == [f"m{i}" for i in range(3, 310, 10)]
        c.send("/queue/passed", "m310", headers={"hit": "yes", "d": "0"})
        assert take(hits, 1) == ["m310"]
        rest = c.subscribe("/queue/passed", ack="client-individual")
        expected = [f"m{i}" for i in range(310) if not (i < 300 and i % 50 == 7) and i % 10 != 3]
        assert take(rest, len(expected)) == expected


def test_a_scan_takes_non_persistent_and_expired_messages_in_their_places(
    make_broker: Callable[..., EmbeddedBroker]
) -> None:
    """Behind paged messages, non-persistent ones wait in memory in their places in the
    list: the scan evaluates them there too; an expired candidate is dropped, not delivered."""
    b = make_broker(page_window=10)
    with amqtransport.connect(uri(b)) as c:
        p = c.producer(window=100)
        for i in range(60):
            p.send("/queue/mixed", f"m{i}", headers={"hit": "yes" if i % 5 == 2 else "no"}, persistent=i % 2 == 0)
        p.send("/queue/mixed", "gone", headers={"hit": "yes", "expires": "1"})  # expired long ago
        p.flush()
        hits = c.subscribe("/queue/mixed", ack="client-individual", prefetch=3, selector="hit = 'yes'")
        assert take(hits, 12) == [f"m{i}" for i in range(2, 60, 5)]
        assert b.stats()["queues"]["/queue/mixed"]["depth"] == 48  # type: ignore[index]
        rest = c.subscribe("/queue/mixed", ack="client-individual")
        assert take(rest, 48) == [f"m{i}" for i in range(60) if i % 5 != 2]


def test_a_slow_selective_consumer_does_not_hold_up_another_on_a_deep_paged_queue(
    make_broker: Callable[..., EmbeddedBroker]
) -> None:
    b = make_broker(page_window=10)
    with amqtransport.connect(uri(b)) as c:
        p = c.producer(window=100)
        for i in range(400):
            p.send("/queue/two", f"m{i}", headers={"who": "a" if i % 4 == 1 else "b" if i % 4 == 3 else "-"})
        p.flush()
        slow = c.subscribe("/queue/two", ack="client-individual", prefetch=1, selector="who = 'a'")
        first = slow.receive(timeout=10)
        assert first is not None and first.text == "m1"  # not acked: its next match waits for it
        fast = c.subscribe("/queue/two", ack="client-individual", prefetch=20, selector="who = 'b'")
        assert take(fast, 100) == [f"m{i}" for i in range(3, 400, 4)]
        first.ack()
        assert take(slow, 99) == [f"m{i}" for i in range(5, 400, 4)]
        rest = c.subscribe("/queue/two", ack="client-individual")
        assert take(rest, 200) == [f"m{i}" for i in range(0, 400, 2)]


def test_a_scan_by_priority_keeps_priority_order_and_a_restart_keeps_the_rest(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    b = make_broker(page_window=10, data_dir=data)
    sent = [(f"m{i}", i % 10, i % 7 == 3) for i in range(200)]
    with amqtransport.connect(uri(b)) as c:
        p = c.producer(window=100)
        for text, prio, hit in sent:
            p.send("/queue/ranked", text, headers={"priority": str(prio), "hit": "yes" if hit else "no"})
        p.flush()
        hits = c.subscribe("/queue/ranked", ack="client-individual", prefetch=7, selector="hit = 'yes'")
        want = [t for t, _p, _h in sorted((e for e in sent if e[2]), key=lambda e: -e[1])]
        assert take(hits, len(want)) == want  # highest priority first, FIFO within one
    b.stop()
    b = make_broker(page_window=10, data_dir=data)
    with amqtransport.connect(uri(b)) as c:
        rest = c.subscribe("/queue/ranked", ack="client-individual")
        want = [t for t, _p, _h in sorted((e for e in sent if not e[2]), key=lambda e: -e[1])]
        assert take(rest, len(want)) == want


def test_a_new_consumer_gets_what_nobody_wanted_in_order(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as c:
        red = c.subscribe("/queue/mix", selector="color = 'red'")
        for i, color in enumerate(["blue", "red", "green", "blue", "red"]):
            c.send("/queue/mix", f"m{i}", headers={"color": color})
        assert take(red, 2) == ["m1", "m4"]
        assert broker.stats()["queues"]["/queue/mix"]["depth"] == 3  # type: ignore[index]
        blue = c.subscribe("/queue/mix", selector="color <> 'green'")
        assert take(blue, 2) == ["m0", "m3"]
        rest = c.subscribe("/queue/mix")
        assert take(rest, 1) == ["m2"]


def test_wildcard_queue_consumer_applies_its_selector_to_every_queue(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as c:
        c.send("/queue/orders.eu", "eu-big", headers={"amount": "500"})
        c.send("/queue/orders.eu", "eu-small", headers={"amount": "5"})
        c.send("/queue/orders.us", "us-big", headers={"amount": "900"})
        sub = c.subscribe("/queue/orders.>", selector="amount > 100")
        assert sorted(take(sub, 2)) == ["eu-big", "us-big"]


def test_browse_shows_paged_messages_in_order_and_takes_nothing(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(page_window=20)
    with amqtransport.connect(uri(b)) as c:
        for i in range(100):
            c.send("/queue/browsed", f"m{i}", headers={"odd": str(i % 2)})
        sub = c.subscribe("/queue/browsed", headers={"browser": "true"}, selector="odd = '1'")
        seen = []
        while (m := sub.receive(timeout=10)) is not None and m.headers.get("browser") != "end":
            seen.append(m.text)
        assert seen == [f"m{i}" for i in range(1, 100, 2)]
        assert b.stats()["queues"]["/queue/browsed"]["depth"] == 100  # type: ignore[index]


def test_no_local_covers_transactional_sends(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as c:
        sub = c.subscribe("/topic/txnl", headers={"activemq.noLocal": "true"})
        with c.transaction() as tx:
            tx.send("/topic/txnl", "own-in-tx")
        with amqtransport.connect(uri(broker)) as other:
            other.send("/topic/txnl", "other")
        assert take(sub, 1) == ["other"]


class _Sink:
    """A connection as the core sees it."""

    writable = True

    def __init__(self) -> None:
        self.got: list[bytes] = []

    def deliver(self, sub: Subscription, message: Message, delivery_count: int) -> None:
        self.got.append(message.body)


def test_expiry_sweep_drops_set_aside_messages_too() -> None:
    now = [1000.0]
    core = BrokerCore(BrokerConfig(), None, clock=lambda: now[0], monotonic=lambda: now[0])
    sink = _Sink()
    core.subscribe(sink, "s", "/queue/exp", selector=compile_selector("keep = 'yes'"))
    core.send("/queue/exp", (("keep", "no"), ("expires", "1001000")), b"short", persistent=False)
    core.send("/queue/exp", (("keep", "no"),), b"forever", persistent=False)
    core.send("/queue/exp", (("keep", "yes"),), b"wanted", persistent=False)
    q = core.queues["/queue/exp"]
    assert sink.got == [b"wanted"] and len(q.unmatched) == 2
    now[0] = 1002.0
    assert core.sweep_expired() == 1
    assert [m.body for m in q.unmatched] == [b"forever"] and q.depth == 1 and q.expired == 1
