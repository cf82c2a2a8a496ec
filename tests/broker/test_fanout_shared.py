"""Offline durable subscriptions cost a topic's publisher nothing per subscription
(store/fanout.py, pages.py ``SharedTail``, dispatch/topics.py plans): the work of a
publish does not grow with the subscriptions, and the shared tail gives every queue
exactly the copies it would have had, whatever reads, acks, restarts and checkpoints
come in between."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from broker_helpers import MessageSink
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqtransport.broker.config import BrokerConfig
from amqtransport.broker.dispatch.core import BrokerCore
from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.store import MessageStore, Sub

T0 = time.time()


def _calls_per_publish(tmp: Path, subs: int, n: int = 40) -> float:
    """Python function calls (a deterministic count, no clock) per persistent topic SEND
    with ``subs`` offline durable subscriptions, after a warm-up."""
    store = MessageStore(tmp, checkpoints=False)
    store.open()
    core = BrokerCore(BrokerConfig(), store, clock=time.time, monotonic=time.monotonic)
    sink = MessageSink()
    for i in range(subs):
        core.unsubscribe(core.subscribe(sink, f"d{i}", "/topic/t", durable_name=f"s{i}", client_id=f"c{i}"))
    for _i in range(5):
        core.send("/topic/t", (), b"warm", persistent=True)
    calls = 0

    def count(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        for i in range(n):
            core.send("/topic/t", (("n", str(i)),), b"x" * 256, persistent=True)
    finally:
        sys.setprofile(None)
    assert store.count == subs * (n + 5)
    store.close()
    return calls / n


def test_a_publish_does_the_same_work_for_50_offline_subscriptions_as_for_1(tmp_path: Path) -> None:
    """Failed before: each subscription's copy cost a Message (within the page window) or
    its id hash and paged entry, several calls a copy (at 50: ~10x the calls of 1)."""
    one = _calls_per_publish(tmp_path / "1", 1)
    fifty = _calls_per_publish(tmp_path / "50", 50)
    assert fifty <= one * 1.2 + 5, (one, fifty)


def test_offline_subscribers_get_every_message_in_order_after_coming_back(tmp_path: Path) -> None:
    """The broker core: 5 offline subscriptions, one comes back and reads part, the others
    stay away; a restart from the journal; every subscription sees all of its messages."""
    store = MessageStore(tmp_path, checkpoints=False)
    store.open()
    core = BrokerCore(BrokerConfig(page_window=8), store, clock=time.time, monotonic=time.monotonic)
    sink = MessageSink()
    for i in range(5):
        core.unsubscribe(core.subscribe(sink, f"d{i}", "/topic/t", durable_name=f"s{i}", client_id=f"c{i}"))
    for i in range(30):
        core.send("/topic/t", (("n", str(i)),), f"m{i}".encode(), persistent=True)
    sub = core.subscribe(sink, "d0", "/topic/t", durable_name="s0", client_id="c0")  # auto ack: all 30
    assert [m.body for m in sink.got] == [f"m{i}".encode() for i in range(30)]
    core.unsubscribe(sub)
    for i in range(30, 40):
        core.send("/topic/t", (("n", str(i)),), f"m{i}".encode(), persistent=True)
    store.close()
    again = MessageStore(tmp_path, checkpoints=False)
    again.open()
    got = {d: [m.body.decode() for m in ms] for d, ms in again.messages_by_destination().items()}
    assert got == {
        "durable:c0:s0": [f"m{i}" for i in range(30, 40)],
        **{f"durable:c{i}:s{i}": [f"m{k}" for k in range(40)] for i in range(1, 5)},
    }
    again.close()


QUEUES = [f"durable:c{i}:s{i}" for i in range(4)]

_op = st.one_of(
    st.tuples(st.just("all"), st.just(0)),  # a topic message for every subscription
    st.tuples(st.just("some"), st.integers(1, 14)),  # for a subset (a selector's choice): bit mask
    st.tuples(st.just("take"), st.integers(0, 3), st.integers(1, 5)),  # a reader takes k
    st.tuples(st.just("ack"), st.integers(0, 3)),  # acks the 2nd paged copy of a queue
    st.tuples(st.just("restart"), st.booleans()),  # with a checkpoint at close, or not
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, max_size=40))
def test_shared_tails_give_each_queue_exactly_its_copies(ops: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        store = MessageStore(path, segment_size=16384)
        store.open()
        for i, q in enumerate(QUEUES):
            store.add_subscription(Sub(q, "t", f"c{i}", f"s{i}"))
        model: dict[str, list[str]] = {q: [] for q in QUEUES}
        n = 0
        try:
            for op in ops:
                kind = op[0]
                if kind in ("all", "some"):
                    mask = 15 if kind == "all" else int(op[1])  # type: ignore[call-overload]
                    names = tuple(q for b, q in enumerate(QUEUES) if mask >> b & 1)
                    m = Message(f"ID:t-{n}", "/topic/t", (), b"b%d" % n, "", T0 + n / 1000, persistent=True)
                    assert (store.add_shared(m, names) if kind == "all" else store.add_fan(m, list(names)))
                    for q in names:
                        model[q].append(f"ID:t-{n}:{q}")
                    n += 1
                elif kind == "take":
                    q, k = QUEUES[int(op[1])], int(op[2])  # type: ignore[call-overload]
                    got = [m.id for m in store.take(q, k)]
                    assert got == model[q][:k]
                    store.ack(got, destination=q)
                    del model[q][:k]
                elif kind == "ack":
                    q = QUEUES[int(op[1])]  # type: ignore[call-overload]
                    if len(model[q]) > 1:
                        store.ack([model[q].pop(1)], destination=q)
                else:
                    if op[1]:
                        store.close()  # a checkpoint at close
                    else:
                        store.flush()
                        store.journal.close()  # the journal replayed (from the last checkpoint)
                    store = MessageStore(path, segment_size=16384)
                    store.open()
                assert {q: store.paged_count(q) for q in QUEUES} == {q: len(v) for q, v in model.items()}
            got = {d: [m.id for m in ms] for d, ms in store.messages_by_destination().items()}
            assert got == {q: v for q, v in model.items() if v}
            assert store.count == sum(len(v) for v in model.values())
        finally:
            store.close()


def test_a_shared_tail_is_emptied_once_every_subscription_has_read_it(tmp_path: Path) -> None:
    """Failed before (ed9f57b): the tail kept every entry since it was made, about 90
    bytes a topic message for as long as the subscriptions existed, read or not."""
    store = MessageStore(tmp_path, checkpoints=False)
    store.open()
    for i, q in enumerate(QUEUES):
        store.add_subscription(Sub(q, "t", f"c{i}", f"s{i}"))
    names = tuple(QUEUES)
    for round_ in range(3):
        for i in range(100):
            n = round_ * 100 + i
            store.add_shared(Message(f"ID:t-{n}", "/topic/t", (), b"b", "", T0 + n / 1000, persistent=True), names)
        assert max(len(t) for t in store._tails.values()) == 100  # noqa: SLF001
        for q in QUEUES:
            got = store.take(q, 1000)
            assert [m.id for m in got] == [f"ID:t-{round_ * 100 + i}:{q}" for i in range(100)]
            store.ack([m.id for m in got], destination=q)
        assert max(len(t) for t in store._tails.values()) == 0  # noqa: SLF001
    assert store.count == 0
    store.close()


def test_a_subscriber_coming_back_leaves_the_others_entries_shared(tmp_path: Path) -> None:
    """One subscription reads everything and leaves the group; the others' next copies
    go on in the same tail, and their lists copy nothing (failed before: a group that
    changed had every other list copy and hash its entries at once)."""
    store = MessageStore(tmp_path, checkpoints=False)
    store.open()
    for i, q in enumerate(QUEUES):
        store.add_subscription(Sub(q, "t", f"c{i}", f"s{i}"))

    def msg(n: int) -> Message:
        return Message(f"ID:t-{n}", "/topic/t", (), b"b", "", T0 + n / 1000, persistent=True)

    for n in range(50):
        store.add_shared(msg(n), tuple(QUEUES))
    got = store.take(QUEUES[0], 100)
    store.ack([m.id for m in got], destination=QUEUES[0])
    for n in range(50, 60):
        store.add_shared(msg(n), tuple(QUEUES[1:]))
    for q in QUEUES[1:]:
        pl = store.paged[q]
        assert pl.tail is not None and len(pl.ids) == 0 and len(pl) == 60, q
    store.add_subscription(Sub("durable:c9:s9", "t", "c9", "s9"))  # a new one joins
    store.add_shared(msg(60), (*QUEUES[1:], "durable:c9:s9"))
    assert all(len(store.paged[q].ids) == 0 for q in QUEUES[1:])
    assert [m.id for m in store.take(QUEUES[2], 100)] == [f"ID:t-{n}:{QUEUES[2]}" for n in range(61)]
    assert [m.id for m in store.take("durable:c9:s9", 100)] == ["ID:t-60:durable:c9:s9"]
    store.close()
