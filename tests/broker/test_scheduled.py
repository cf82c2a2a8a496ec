"""Scheduled delivery in our broker beyond the differential test: jobs are durable
(kill -9 and a takeover in a replicated pair deliver each on time, none twice, none
lost), ``scheduler_support = false`` delivers at once, and the pure parts (ActiveMQ's
cron dialect, the timetable rules) with given times."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from broker_helpers import MessageSink
from hypothesis import example, given
from hypothesis import strategies as st

import amqtransport
import amqtransport.aio
from amqtransport.audit import message_key
from amqtransport.broker import BrokerConfig, EmbeddedBroker
from amqtransport.broker.dispatch.cron import CronError, parse_cron
from amqtransport.broker.dispatch.errors import CoreError
from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.dispatch.scheduling import (
    after_fire,
    first_due,
    job_headers,
    job_state,
    read_schedule,
)
from amqtransport.stomp import Frame
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(120)


def uri(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def collect(port: int, dest: str, until: float) -> list[tuple[float, str, str]]:
    """(arrival time, body, message-id) of what ``dest`` delivers until ``until`` (monotonic)."""
    out: list[tuple[float, str, str]] = []
    with amqtransport.connect(uri(port)) as c:
        sub = c.subscribe(dest)
        while (left := until - time.monotonic()) > 0:
            m = sub.receive(timeout=left)
            if m is not None:
                out.append((time.monotonic(), m.text, m.message_id))
    return out


def test_a_delayed_message_survives_kill_9_and_comes_on_time_once(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        t0 = time.monotonic()
        with amqtransport.connect(uri(bp.port)) as c:
            c.send("/queue/later", "in 4 s", headers={"AMQ_SCHEDULED_DELAY": "4000"})  # receipted: durable
            c.send("/queue/rep", "tick", headers={"AMQ_SCHEDULED_PERIOD": "1500", "AMQ_SCHEDULED_REPEAT": "3"})
        bp.kill()
        bp.start()
        got = collect(bp.port, "/queue/later", t0 + 8)
        assert [b for _t, b, _i in got] == ["in 4 s"]  # once
        assert got[0][0] - t0 >= 3.5  # not before its time (the restart did not fire it early)
        ticks = collect(bp.port, "/queue/rep", time.monotonic() + 3.5)
        assert len(ticks) == 4 and len({i for _t, _b, i in ticks}) == 4  # REPEAT + 1 deliveries, none twice


def test_a_takeover_delivers_a_scheduled_message_once(tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path / "pair", link_timeout=1.0) as pair:
        master = pair.wait_master()
        pair.wait_in_sync()
        t0 = time.monotonic()
        with amqtransport.connect(uri(master.port)) as c:
            c.send("/queue/ha", "scheduled", headers={"AMQ_SCHEDULED_DELAY": "3000"})  # receipted: on both nodes
        pair.kill_master()
        new = pair.wait_master(exclude=master)
        got = collect(new.port, "/queue/ha", max(t0 + 6, time.monotonic() + 2))
        assert [b for _t, b, _i in got] == ["scheduled"]
        assert got[0][0] - t0 >= 2.5


def test_scheduler_support_false_delivers_at_once(tmp_path: Path) -> None:
    b = EmbeddedBroker(port=0, data_dir=tmp_path / "d", config=BrokerConfig(scheduler_support=False))
    b.start()
    try:
        with amqtransport.connect(uri(b.port)) as c:
            sub = c.subscribe("/queue/off")
            c.send("/queue/off", "now", headers={"AMQ_SCHEDULED_DELAY": "60000", "AMQ_SCHEDULED_CRON": "bad"})
            m = sub.receive(timeout=5)
            assert m is not None and m.text == "now"
            assert m.headers["AMQ_SCHEDULED_DELAY"] == "60000"  # headers left as they were
    finally:
        b.stop()


# ---------------------------------------------------------------- pure parts, given times

T = datetime(2026, 11, 26, 11, 54, 30).timestamp()  # a Thursday


@pytest.mark.parametrize(
    ("cron", "expect"),
    [
        ("* * * * *", datetime(2026, 11, 26, 11, 55)),
        ("*/15 * * * *", datetime(2026, 11, 26, 12, 0)),
        ("1-10/3 * * * *", datetime(2026, 11, 26, 12, 3)),  # ActiveMQ: multiples of 3 within 1-10
        ("0 9 * * 1", datetime(2026, 11, 30, 9, 0)),  # Monday (Sunday is 0)
        ("? 12 * * ?", datetime(2026, 11, 26, 12, 0)),
        ("30 2 29 2 *", datetime(2028, 2, 29, 2, 30)),
        ("0 0 1,15 * *", datetime(2026, 12, 1, 0, 0)),
    ],
)
def test_cron_next_time(cron: str, expect: datetime) -> None:
    assert parse_cron(cron).next_after(T) == expect.timestamp()


@pytest.mark.parametrize(
    ("cron", "says"),
    [
        ("* * * *", "has 4 fields"),
        ("x * * * *", "minute 'x' is not a number"),
        ("60 * * * *", "minute 60 is outside 0-59"),
        ("* * * * 7", "day of week 7 is outside 0-6"),
        ("5/10 * * * *", "matches no value"),
        ("*/0 * * * *", "step '0' must be at least 1"),
        ("0 0 30 2 *", "never comes"),
    ],
)
def test_bad_crons_name_what_is_wrong(cron: str, says: str) -> None:
    with pytest.raises(CronError, match=says):
        parse_cron(cron)


@given(st.text(alphabet="0123456789*?/-, x", max_size=30))
def test_cron_parser_fuzz_parses_or_refuses_with_a_cron_error(text: str) -> None:
    try:
        cron = parse_cron(text)
    except CronError as exc:
        assert str(exc)
        return
    assert cron.next_after(T) > T


@given(st.dictionaries(st.sampled_from(["AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT",
                                        "AMQ_SCHEDULED_CRON"]), st.text(max_size=12)))
@example({"AMQ_SCHEDULED_DELAY": "\u00b9"})  # a digit to str.isdigit(), not to int(): was a ValueError
@example({"AMQ_SCHEDULED_REPEAT": "+-5"})
def test_schedule_headers_fuzz_read_or_refuse_with_a_core_error(headers: dict[str, str]) -> None:
    try:
        read_schedule(tuple(headers.items()))
    except CoreError as exc:
        assert any(name in str(exc) for name in headers)


def job(headers: tuple[tuple[str, str], ...], now: float) -> Message:
    sched = read_schedule(headers)
    assert sched is not None
    return Message("j1", "scheduled:/queue/q", job_headers(headers, due=first_due(sched, now), left=sched.repeat,
                                                             job="j1"), b"")


def test_timetable_delay_then_period_repeat_plus_one_times() -> None:
    headers = (("AMQ_SCHEDULED_DELAY", "2000"), ("AMQ_SCHEDULED_PERIOD", "500"), ("AMQ_SCHEDULED_REPEAT", "2"))
    state = job_state(job(headers, 100.0))
    assert state.due == 102.0 and state.left == 2
    fired = 0
    now = state.due
    while True:
        firing = after_fire(state, headers, now)
        fired += firing.deliver
        if not firing.successors:
            break
        ((due, left, hdrs),) = firing.successors
        assert due == now + 0.5
        state = job_state(Message("j", "scheduled:/queue/q", job_headers(hdrs, due=due, left=left, job="j1"), b""))
        now = due
    assert fired == 3


def test_timetable_cron_with_repeat_starts_a_job_at_each_tick() -> None:
    headers = (("AMQ_SCHEDULED_CRON", "*/15 * * * *"), ("AMQ_SCHEDULED_PERIOD", "1000"), ("AMQ_SCHEDULED_REPEAT", "1"))
    state = job_state(job(headers, T))
    assert state.due == datetime(2026, 11, 26, 12, 0, 1).timestamp()  # the tick, plus PERIOD (no DELAY)
    firing = after_fire(state, headers, state.due)
    assert not firing.deliver
    (tick, started) = firing.successors
    assert tick[0] == datetime(2026, 11, 26, 12, 15).timestamp()
    assert started[1] == 1 and not any(k == "AMQ_SCHEDULED_CRON" for k, _v in started[2])


def test_the_client_keeps_each_delivery_of_a_repeated_message() -> None:
    """The repeats of a scheduled message carry the producer's idempotency key (on
    ActiveMQ too); the client's duplicate filter tells them apart by message-id, and
    still drops a redelivered copy of one of them."""
    def frame(mid: str, job: bool = True) -> Frame:
        headers = {"message-id": mid, "amq-idempotency-key": "k", **({"scheduledJobId": "j"} if job else {})}
        return Frame.make("MESSAGE", headers, b"")

    assert message_key(frame("a")) != message_key(frame("b"))
    assert message_key(frame("a")) == message_key(frame("a"))
    assert message_key(frame("a", job=False)) == message_key(frame("b", job=False)) == "k"


def test_send_delay_in_both_clients(tmp_path: Path) -> None:
    b = EmbeddedBroker(port=0, data_dir=tmp_path / "d", config=BrokerConfig())
    b.start()
    try:
        with amqtransport.connect(uri(b.port)) as c:
            sub = c.subscribe("/queue/both")
            c.send("/queue/both", "sync", delay=1500)
            with pytest.raises(ValueError, match="delay must be"):
                c.send("/queue/both", "never", delay=-1)

            async def aio_send() -> None:
                async with amqtransport.aio.connect(uri(b.port)) as a:
                    await a.send("/queue/both", "async", delay=1500)

            asyncio.run(aio_send())
            assert sub.receive(timeout=1.0) is None
            got = sorted(m.text for m in (sub.receive(timeout=10), sub.receive(timeout=10)) if m is not None)
            assert got == ["async", "sync"]
    finally:
        b.stop()


def test_a_job_fired_again_after_its_fire_was_lost_delivers_the_same_message_id() -> None:
    """Found by the nemesis (shared store, disk-full at the instant a job fired): the
    master dispatched the fired message, its fire record never reached the disk, the
    new master fired the job again -- a second message with a new id, which the
    client's filter (key@message-id for scheduled deliveries, so that repeats differ)
    let through to the application. A firing's message id is now its job's id and due
    time: the copy of a lost firing is recognisable, repeats still differ."""
    from amqtransport.broker.config import BrokerConfig as Config
    from amqtransport.broker.dispatch.core import BrokerCore
    from amqtransport.broker.dispatch.model import AUTO

    now = [1000.0]
    core = BrokerCore(Config(), None, clock=lambda: now[0], monotonic=lambda: now[0])
    sink = MessageSink()
    core.subscribe(sink, "s", "/queue/q", ack_mode=AUTO)  # type: ignore[arg-type]
    core.send("/queue/q", (("AMQ_SCHEDULED_DELAY", "1000"), ("AMQ_SCHEDULED_PERIOD", "1000"),
                           ("AMQ_SCHEDULED_REPEAT", "1")), b"x", persistent=False)
    (job_msg,) = [job for _due, _seq, job in core.scheduler._heap]
    now[0] = 1001.0
    core.fire_due()
    core._fire(job_msg, now[0])  # the recovered job fires again (as if its first firing was lost)
    now[0] = 1002.0
    core.fire_due()  # the repeat (of each firing: here the first one's successor was not lost)
    ids = [m.id for m in sink.got]
    assert len(ids) == 4 and ids[0] == ids[1] != ids[2] == ids[3], ids


def test_a_job_joins_the_scheduler_only_once_its_send_is_durable() -> None:
    """Found by the nemesis (replicated, a half-open replication link, then a frozen
    master): the master fired a job whose SEND it had not receipted (the slave had not
    acked it); the producer replayed the SEND to the next master, which made a second
    job of it -- two deliveries under two job ids, past the client's filter. A job is
    scheduled only from its record's durability callback now."""
    from amqtransport.broker.config import BrokerConfig as Config
    from amqtransport.broker.dispatch.core import BrokerCore
    from amqtransport.broker.dispatch.model import AUTO

    class SlowStore:
        """A store whose records become durable when the test says so."""

        def __init__(self) -> None:
            self.pending: list[object] = []

        def __getattr__(self, name: str) -> object:
            return lambda *a, **k: 0  # paged counts, keys, ...: nothing

        def is_duplicate(self, destination: str, key: str, callback: object = None) -> bool:
            return False

        def take(self, destination: str, n: int) -> list[Message]:
            return []

        def commit(self, records: object, callback: object = None) -> None:
            self.pending.append(callback)

    now = [1000.0]
    store = SlowStore()
    core = BrokerCore(Config(), store, clock=lambda: now[0], monotonic=lambda: now[0])  # type: ignore[arg-type]
    sink = MessageSink()
    core.subscribe(sink, "s", "/queue/q", ack_mode=AUTO)  # type: ignore[arg-type]
    receipts: list[object] = []
    core.send("/queue/q", (("AMQ_SCHEDULED_DELAY", "500"),), b"x", persistent=True, callback=receipts.append)
    now[0] = 1001.0
    core.fire_due()
    assert sink.got == [] and receipts == []  # due, but not durable: not fired
    for cb in store.pending:
        cb(None)  # type: ignore[operator]
    assert receipts == [None]
    core.fire_due()
    assert [m.body for m in sink.got] == [b"x"]  # durable, overdue: fired at once


def test_a_job_refused_for_now_by_the_receipt_gate_still_fires_once_its_record_counts() -> None:
    """Found by the nemesis (replicated, the replication link partitioned: the master
    dropped its slave before it acked a scheduled SEND, refused the receipt, cut the
    producer and went on as master): the job was on the master's disk but never joined
    the timetable, and the producer's replay was a duplicate of it (receipted) -- the
    message was never delivered (lost p-sched:240). A completion refused for now
    (NotReceipted) waits again; the job fires once the wait succeeds."""
    from amqtransport.broker.config import BrokerConfig as Config
    from amqtransport.broker.dispatch.core import BrokerCore
    from amqtransport.broker.dispatch.model import AUTO
    from amqtransport.broker.store import JournalError, NotReceipted

    class Gate:
        """The journal's completion path as a replicated master has it: held until told."""

        def __init__(self) -> None:
            self.pending: list[Any] = []

        def on_durable(self, callback: Any) -> None:
            self.pending.append(callback)

        def run(self, err: BaseException | None) -> None:
            pending, self.pending = self.pending, []
            for cb in pending:
                cb(err)

    class GatedStore:
        def __init__(self) -> None:
            self.journal = Gate()

        def __getattr__(self, name: str) -> object:
            return lambda *a, **k: 0  # paged counts, keys, ...: nothing

        def is_duplicate(self, destination: str, key: str, callback: object = None) -> bool:
            return False

        def take(self, destination: str, n: int) -> list[Message]:
            return []

        def commit(self, records: object, callback: Any = None) -> None:
            if callback is not None:
                self.journal.on_durable(callback)

    now = [1000.0]
    store = GatedStore()
    core = BrokerCore(Config(), store, clock=lambda: now[0], monotonic=lambda: now[0])  # type: ignore[arg-type]
    sink = MessageSink()
    core.subscribe(sink, "s", "/queue/q", ack_mode=AUTO)  # type: ignore[arg-type]
    receipts: list[object] = []
    core.send("/queue/q", (("AMQ_SCHEDULED_DELAY", "500"),), b"x", persistent=True, callback=receipts.append)
    store.journal.run(NotReceipted("not receipted: slave b lost before it acknowledged them"))
    assert len(receipts) == 1 and isinstance(receipts[0], NotReceipted)  # no RECEIPT for this SEND
    now[0] = 1001.0
    core.fire_due()
    assert sink.got == []  # the record does not count yet
    store.journal.run(None)  # a slave acked it, or the peer did not take over
    core.fire_due()
    assert [m.body for m in sink.got] == [b"x"]
    # a job whose record failed for good is not scheduled (nor waited for again)
    core.send("/queue/q", (("AMQ_SCHEDULED_DELAY", "500"),), b"y", persistent=True)
    store.journal.run(JournalError("journal write failed: disk full"))
    assert store.journal.pending == []
    now[0] = 1002.0
    core.fire_due()
    assert [m.body for m in sink.got] == [b"x"]
