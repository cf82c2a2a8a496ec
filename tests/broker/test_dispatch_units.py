"""Direct unit tests of the broker's dispatch core (amqtransport/broker/dispatch/): a
:class:`Queue` against a scripted owner, :class:`Acks` through a :class:`BrokerCore`
with no store (non-persistent messages), both on a virtual clock, no socket, no loop;
and a connection's producer flow control (:class:`FlowGate`) against a scripted host.

The end-to-end behaviour is tested over real sockets in tests/broker/; these pin the
rules where they live: round-robin over ready consumers, prefetch credit, expiry at
dispatch, requeue to the front, cumulative and individual ACK, NACK's redelivery and
the dead-letter queue after ``1 + max_redeliveries`` deliveries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from amqtransport.broker.config import BrokerConfig
from amqtransport.broker.connection.flow import FlowGate
from amqtransport.broker.dispatch.core import BrokerCore
from amqtransport.broker.dispatch.memory import MemoryGauge
from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.dispatch.model import AUTO, CLIENT, INDIVIDUAL, Subscription
from amqtransport.broker.dispatch.queues import Queue
from amqtransport.broker.store.journal import Callback
from amqtransport.stomp import Frame


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Sink:
    """A connection as the core sees it: records (subscription id, message id, count)."""

    def __init__(self) -> None:
        self.writable = True
        self.got: list[tuple[str, str, int]] = []

    def deliver(self, sub: Subscription, message: Message, delivery_count: int) -> None:
        self.got.append((sub.id, message.id, delivery_count))


class Owner:
    """The :class:`QueueOwner` a queue sees, scripted: no paging, a virtual clock."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.memory = MemoryGauge(1 << 30, clock=clock)
        self.expired: list[str] = []
        self.acked: list[list[str]] = []
        self.prioritized = True  # the broker's prioritized_messages (priority.py)

    def drop_expired(self, msg: Message) -> None:
        self.expired.append(msg.id)
        self.memory.release(msg)

    def store_ack(self, ids: Sequence[str], callback: Callback | None = None) -> None:
        self.acked.append(list(ids))

    def page_out(self, queue: Queue, msg: Message) -> bool:
        return False

    def page_in(self, queue: Queue) -> list[Message]:
        return []

    def paged(self, queue: Queue) -> int:
        return 0

    def paged_top(self, queue: Queue) -> int:
        return -1

    def scan_top(self, queue: Queue) -> int:
        return -1

    def rescan(self, queue: Queue) -> None:
        pass

    def scanner(self) -> None:
        return None


def msg(i: int, *, expires: float = 0.0, persistent: bool = False) -> Message:
    return Message(f"m{i}", "/queue/q", (), b"x", expires=expires, persistent=persistent)


def test_queue_dispatches_round_robin_within_each_consumers_credit() -> None:
    owner = Owner(Clock())
    q = Queue(owner, "/queue/q")
    sink = Sink()
    a = Subscription(sink, "a", "/queue/q", INDIVIDUAL, prefetch=2)
    b = Subscription(sink, "b", "/queue/q", INDIVIDUAL, prefetch=1)
    q.add_consumer(a)
    q.add_consumer(b)
    for i in range(5):
        q.enqueue(msg(i))
    assert sink.got == [("a", "m0", 1), ("b", "m1", 1), ("a", "m2", 1)]
    assert q.depth == 2 and list(a.unacked) == ["m0", "m2"] and list(b.unacked) == ["m1"]
    # credit comes back with a settled message: b takes the next one
    del b.unacked["m1"]
    q.make_ready(b)
    assert sink.got[-1] == ("b", "m3", 1) and q.depth == 1


def test_queue_drops_an_expired_message_at_dispatch_and_delivers_the_next() -> None:
    clock = Clock(1000.0)
    owner = Owner(clock)
    q = Queue(owner, "/queue/q")
    q.enqueue(msg(0, expires=1005.0))
    q.enqueue(msg(1, expires=2000.0))
    clock.now = 1010.0  # m0 expired while it waited
    sink = Sink()
    q.add_consumer(Subscription(sink, "a", "/queue/q", INDIVIDUAL, prefetch=1))
    assert owner.expired == ["m0"]
    assert sink.got == [("a", "m1", 1)]


def test_queue_requeue_puts_messages_back_at_the_front_in_order() -> None:
    owner = Owner(Clock())
    q = Queue(owner, "/queue/q")
    for i in range(4):
        q.enqueue(msg(i))
    taken = [q.messages.popleft(), q.messages.popleft()]
    q.requeue(taken)
    assert [m.id for m in q.messages] == ["m0", "m1", "m2", "m3"]


def test_queue_auto_ack_acks_persistent_deliveries_in_one_store_call_and_frees_memory() -> None:
    owner = Owner(Clock())
    q = Queue(owner, "/queue/q")
    for i in range(3):
        q.enqueue(msg(i, persistent=i != 1))
    assert owner.memory.usage > 0
    sink = Sink()
    q.add_consumer(Subscription(sink, "a", "/queue/q", AUTO, prefetch=1))
    assert [m for _, m, _ in sink.got] == ["m0", "m1", "m2"]
    assert owner.acked == [["m0", "m2"]]  # one record for the round, persistent ones only
    assert owner.memory.usage == 0 and q.dequeued == 3


def test_queue_orders_by_priority_and_requeues_before_the_same_priority() -> None:
    owner = Owner(Clock())
    q = Queue(owner, "/queue/q")
    for i, p in enumerate([4, 9, 0, 9, 4]):
        q.enqueue(Message(f"m{i}", "/queue/q", (("priority", str(p)),), b"x"))
    assert [m.id for m in q.messages] == ["m1", "m3", "m0", "m4", "m2"]
    taken = [q.messages.popleft(), q.messages.popleft(), q.messages.popleft()]  # m1, m3, m0
    q.enqueue(Message("late", "/queue/q", (("priority", "9"),), b"x"))
    q.requeue(taken)  # back before the others of their priority, after none of a higher one
    assert [m.id for m in q.messages] == ["m1", "m3", "late", "m0", "m4", "m2"]
    owner.prioritized = False
    fifo = Queue(owner, "/queue/f")
    for i, p in enumerate([0, 9]):
        fifo.enqueue(Message(f"f{i}", "/queue/f", (("priority", str(p)),), b"x"))
    assert [m.id for m in fifo.messages] == ["f0", "f1"]


@pytest.fixture
def core() -> BrokerCore:
    clock = Clock()
    return BrokerCore(BrokerConfig(max_redeliveries=1), None, clock=clock, monotonic=clock)


def test_acks_client_mode_is_cumulative_and_individual_is_not(core: BrokerCore) -> None:
    sink = Sink()
    cumulative = core.subscribe(sink, "c", "/queue/cum", ack_mode=CLIENT, prefetch=10)
    single = core.subscribe(sink, "i", "/queue/ind", ack_mode=INDIVIDUAL, prefetch=10)
    for _ in range(3):
        core.send("/queue/cum", (), b"x", persistent=False)
        core.send("/queue/ind", (), b"x", persistent=False)
    cum_ids = [m for s, m, _ in sink.got if s == "c"]
    ind_ids = [m for s, m, _ in sink.got if s == "i"]
    assert core.acks.ack(cumulative, cum_ids[1])
    assert list(cumulative.unacked) == [cum_ids[2]]  # the ACK covered m0 and m1
    assert core.acks.ack(single, ind_ids[1])
    assert list(single.unacked) == [ind_ids[0], ind_ids[2]]  # only that one
    assert not core.acks.ack(single, ind_ids[1])  # no longer awaiting an ack
    assert core.queues["/queue/cum"].dequeued == 2


def test_acks_nack_redelivers_then_dead_letters_after_max_redeliveries(core: BrokerCore) -> None:
    sink = Sink()
    sub = core.subscribe(sink, "s", "/queue/q", ack_mode=INDIVIDUAL, prefetch=1)
    core.send("/queue/q", (), b"x", persistent=False)
    [(_, mid, count)] = sink.got
    assert count == 1
    assert core.acks.nack(sub, mid)  # back to the front: delivered again at once
    assert sink.got[-1] == ("s", mid, 2)
    assert core.acks.nack(sub, mid)  # 2 deliveries > max_redeliveries=1: to the DLQ
    assert len(sink.got) == 2 and not sub.unacked
    dlq = core.queues["/queue/DLQ.q"]
    [dead] = list(dlq.messages)
    assert dead.id == mid and ("original-destination", "/queue/q") in dead.headers
    assert core.dead_lettered == 1


# -- producer flow control as a part of its connection (connection/flow.py) --------------


class FlowConn:
    """The :class:`FlowHost` a gate sees (and its :class:`FlowStream`): records what went
    through and what it did."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.config = BrokerConfig(memory_limit=4096, max_pending_frames=3)
        self.loop = loop
        self.peer = "test"
        self.connected = True
        self.closing = False
        self.write_paused = False
        self.handled: list[str] = []
        self.reading_paused = False

    @property
    def stream(self) -> FlowConn:
        return self

    def handle(self, frame: Frame) -> None:
        self.handled.append(frame.get("n") or frame.command)

    def held_by_transactions(self) -> int:
        return 0

    def error(self, message: str, *, receipt: str | None = None, detail: str = "", close: bool = True,
              in_doubt: bool = False) -> None:
        raise AssertionError(message)

    def error_no_raise(self, message: str, receipt: str | None = None) -> None:
        raise AssertionError(message)

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False


def test_flow_gate_parks_sends_lets_acks_through_and_replays_in_order_on_release() -> None:
    loop = asyncio.new_event_loop()
    try:
        clock = Clock()
        core = BrokerCore(BrokerConfig(memory_limit=4096), None, clock=clock, monotonic=clock)
        conn = FlowConn(loop)
        gate = FlowGate(conn, core)
        big = Message("big", "/queue/q", (), b"x" * 8000)
        core.memory.charge(big)  # over the limit: SENDs wait
        assert core.memory.blocked("/queue/q")

        def send(n: int) -> Frame:
            return Frame.make("SEND", {"destination": "/queue/q", "n": f"s{n}"}, b"m")

        gate.admit(send(0))
        gate.admit(Frame.make("ACK", {"id": "1", "n": "ack"}))
        gate.admit(send(1))
        assert conn.handled == ["ack"] and len(gate.held) == 2 and not conn.reading_paused
        for n in range(2, 4):
            gate.admit(send(n))
        assert len(gate.held) == 4 and conn.reading_paused  # over max_pending_frames: TCP back-pressure
        core.memory.release(big)  # down to the low-water mark: the gate is woken, replays on the loop
        loop.run_until_complete(asyncio.sleep(0))
        assert conn.handled == ["ack", "s0", "s1", "s2", "s3"]
        assert not gate.held and gate.held_bytes == 0 and not conn.reading_paused
    finally:
        loop.close()
