"""The sans-IO failover core (transports/core.py), driven by events alone: no socket,
no thread, no clock. Links are plain objects; the actions are checked as data."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import pytest

from amqtransport.backoff import failover_schedule
from amqtransport.errors import (
    AuthenticationError,
    BrokerError,
    ConnectionClosed,
    ReconnectExhausted,
    TransactionInDoubt,
    TransactionRolledBack,
)
from amqtransport.options import FailoverOptions
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.transports.base import Receipt, with_receipt
from amqtransport.transports.core import (
    GIVE_UP_REFUSALS,
    Action,
    ArmIdleTimer,
    Close,
    FailoverCore,
    Install,
    Notify,
    Reconnect,
    Settle,
    Write,
)
from amqtransport.transports.core_actions import NoVerdict, Refused, Skip, StopReplay, WriteAlone
from amqtransport.transports.replay import TRACK_RECEIPT_EVERY
from amqtransport.uri import parse_uri


class FakeLink:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"FakeLink({self.name})"


Core = FailoverCore[FakeLink]


def make_core(**options: object) -> Core:
    ids = itertools.count(1)
    core: Core = FailoverCore(FailoverOptions.model_validate(options), lambda p: f"{p}-{next(ids)}")
    core.start()
    return core


def up(core: Core, link: FakeLink, *, alive: bool = True, expect_gen: int | None = None) -> tuple[
        Install[FakeLink], list[Action[FakeLink]]]:
    """Link up, replay written successfully: the install and the actions that follow."""
    install = core.link_up(link, expect_gen=expect_gen)
    assert install is not None
    actions = core.replay_written(install, ok=True, alive=alive)
    assert actions is not None
    return install, actions


def send(core: Core, rid: str, key: str = "", tx: str | None = None) -> tuple[Receipt, Write[FakeLink] | None]:
    headers = {"destination": "/queue/q", IDEMPOTENCY_HEADER: key or rid}
    if tx is not None:
        headers["transaction"] = tx
    rec = Receipt(rid, with_receipt(Frame.make("SEND", headers, b"x"), rid), tx=tx)
    return rec, core.request(rec)


def receipt_ids(frames: Sequence[Frame]) -> list[str | None]:
    return [f.get("receipt") for f in frames]


def test_a_request_is_written_on_the_current_link_and_completed_by_its_receipt() -> None:
    core = make_core()
    a = FakeLink("a")
    up(core, a)
    assert core.state == "connected" and core.generation == 1
    rec, write = send(core, "r-1")
    assert write == Write(a, [rec.frame], 1)
    assert core.on_receipt("r-1", 1) is rec
    assert core.pending == {}


def test_requests_made_while_down_are_replayed_in_send_order_on_the_next_link() -> None:
    core = make_core()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    r1, w1 = send(core, "r-1")
    assert w1 is not None
    (reconnect,) = core.link_lost(a, ConnectionClosed("gone"))
    assert isinstance(reconnect, Reconnect) and core.state == "reconnecting"
    r2, w2 = send(core, "r-2")
    assert w2 is None  # nothing to write on: the replay will
    install, _ = up(core, b)
    assert receipt_ids(install.plan.batch) == ["r-1", "r-2"]
    assert r1.generation == r2.generation == 2 == core.generation


def test_one_reconnect_at_a_time_and_only_for_the_current_link() -> None:
    core = make_core()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    first = core.link_lost(a, ConnectionClosed("gone"))
    assert len(first) == 1 and isinstance(first[0], Reconnect)
    assert core.link_lost(a, ConnectionClosed("again")) == []  # not current any more
    up(core, b)  # installed by the running reconnect
    assert core.link_lost(b, ConnectionClosed("lost before resumed")) == []  # the running one loops
    assert core.resumed() is False  # ... because it sees the state
    assert core.reconnects == 2


def test_a_link_dead_on_arrival_is_a_loss_right_after_its_install() -> None:
    core = make_core()
    a = FakeLink("a")
    _, actions = up(core, a, alive=False)
    assert [type(x) for x in actions] == [Reconnect]
    assert core.state == "reconnecting" and core.link is None
    assert core.reconnects == 1


def test_dead_on_arrival_with_max_reconnect_attempts_0_gives_up_and_fails_every_request() -> None:
    core = make_core(maxReconnectAttempts=0)
    rec, _ = send(core, "r-1")
    _, actions = up(core, FakeLink("a"), alive=False)
    assert len(actions) == 1 and isinstance(actions[0], Reconnect)
    error = core.give_up_now(actions[0].error)
    assert isinstance(error, ReconnectExhausted)
    failed = core.fail(error)
    assert failed == [Settle(rec, error=error), Notify("on_failed", error)]
    assert core.state == "failed"
    with pytest.raises(ReconnectExhausted):
        core.check_usable()


def test_a_failed_replay_write_keeps_the_previous_live_link() -> None:
    core = make_core()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    install = core.link_up(b, expect_gen=1)  # a priority switch
    assert install is not None
    assert core.replay_written(install, ok=False, alive=False, previous_alive=True) is None
    assert core.link is a


def test_a_priority_switch_retires_the_previous_link_and_a_stale_one_is_refused() -> None:
    core = make_core()
    a, b, c = FakeLink("a"), FakeLink("b"), FakeLink("c")
    up(core, a)
    assert core.link_up(c, expect_gen=7) is None  # the link changed meanwhile
    _, actions = up(core, b, expect_gen=1)
    assert actions == [Close(a)]
    assert core.link is b and core.generation == 2
    assert core.message_is_current(b) and not core.message_is_current(a)


def test_subscriptions_are_replayed_first_and_a_sub_unsub_while_down_cancels_out() -> None:
    core = make_core()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    sub = Frame.make("SUBSCRIBE", {"id": "s1", "destination": "/queue/q"})
    core.subscribe("s1", sub)
    core.link_lost(a, ConnectionClosed("gone"))
    r1, _ = send(core, "r-1")
    sub2 = Frame.make("SUBSCRIBE", {"id": "s2", "destination": "/queue/p"})
    core.subscribe("s2", sub2)
    s2 = Receipt("r-2", with_receipt(sub2, "r-2"))
    core.request(s2)
    assert core.unsubscribe("s2")
    u2 = Receipt("r-3", with_receipt(Frame.make("UNSUBSCRIBE", {"id": "s2"}), "r-3"))
    core.request(u2)
    install, actions = up(core, b)
    assert [f.command for f in install.plan.batch] == ["SUBSCRIBE", "SEND"]
    assert install.plan.batch[0].get("id") == "s1"
    completed = {x.request.receipt_id for x in actions if isinstance(x, Settle) and x.result is not None}
    assert completed == {"r-2", "r-3"}  # answered locally: nothing of s2 reaches the broker
    assert r1 in install.plan.batch_requests


def test_a_transaction_acknowledged_on_a_dead_link_is_rolled_back() -> None:
    core = make_core()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    core.begin("tx1")
    begin = Receipt("r-1", with_receipt(Frame.make("BEGIN", {"transaction": "tx1"}), "r-1"), tx="tx1")
    core.request(begin)
    core.on_receipt("r-1", 1)
    tx_send, _ = send(core, "r-2", key="k-1", tx="tx1")
    core.link_lost(a, ConnectionClosed("gone"))
    install, actions = up(core, b)
    assert install.plan.batch == []
    (settle,) = [x for x in actions if isinstance(x, Settle)]
    assert settle.request is tx_send and isinstance(settle.error, TransactionRolledBack)
    assert list(settle.error.keys) == ["k-1"]
    with pytest.raises(TransactionRolledBack):
        send(core, "r-3", tx="tx1")
    with pytest.raises(TransactionRolledBack):
        core.commit("tx1")


def test_a_commit_in_flight_on_a_dead_link_is_in_doubt() -> None:
    core = make_core()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    core.begin("tx1")
    send(core, "r-1", key="k-1", tx="tx1")
    commit = Receipt("r-2", with_receipt(Frame.make("COMMIT", {"transaction": "tx1"}), "r-2"), tx="tx1")
    assert core.request(commit) is not None  # written on link 1, never receipted
    core.link_lost(a, ConnectionClosed("gone"))
    _, actions = up(core, b)
    errors = {x.request.receipt_id: x.error for x in actions if isinstance(x, Settle)}
    assert set(errors) == {"r-1", "r-2"}
    assert all(isinstance(e, TransactionInDoubt) for e in errors.values())


def test_abort_of_a_transaction_lost_with_its_link_writes_nothing() -> None:
    core = make_core()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    core.begin("tx1")
    core.request(Receipt("r-1", Frame.make("BEGIN", {"transaction": "tx1", "receipt": "r-1"}), tx="tx1"))
    core.on_receipt("r-1", 1)
    core.link_lost(a, ConnectionClosed("gone"))
    up(core, b)
    assert core.abort("tx1") is None
    core.begin("tx2")
    write = core.abort("tx2")
    assert write is not None and write.frames[0].command == "ABORT" and write.link is b


def fire_and_forget(core: Core, n: int) -> list[tuple[Frame, str | None]]:
    out = []
    for i in range(n):
        frame, key = core.track(Frame.make("SEND", {"destination": "/queue/q", IDEMPOTENCY_HEADER: f"k-{i}"}, b"x"))
        target = core.current()
        if target is not None and key is not None:
            core.tracked_written(key, target[1], core.oneway_position(frame))
        out.append((frame, key))
    return out


def test_track_messages_asks_for_a_receipt_every_n_sends_and_a_receipt_trims_the_cache() -> None:
    core = make_core(trackMessages="true")
    a = FakeLink("a")
    up(core, a)
    sent = fire_and_forget(core, TRACK_RECEIPT_EVERY + 5)
    asking = [frame.get("receipt") for frame, _ in sent if "receipt" in frame]
    assert len(asking) == 1 and sent[TRACK_RECEIPT_EVERY - 1][0].get("receipt") == asking[0]
    assert len(core.cache) == TRACK_RECEIPT_EVERY + 5
    core.on_receipt(asking[0], 1)  # proves every write before it; drops its own entry too
    assert len(core.cache) == 5


def test_the_cache_is_replayed_on_a_new_link_and_an_idle_barrier_trims_it() -> None:
    core = make_core(trackMessages="true")
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    fire_and_forget(core, 3)
    core.link_lost(a, ConnectionClosed("gone"))
    install, actions = up(core, b)
    assert [f.get(IDEMPOTENCY_HEADER) for f in install.plan.batch] == ["k-0", "k-1", "k-2"]
    assert ArmIdleTimer() in actions
    barrier = core.barrier()
    assert barrier is not None
    write, rid = barrier
    assert [f.command for f in write.frames] == ["BEGIN", "ABORT"] and write.generation == 2
    core.on_receipt(rid, 2)
    assert len(core.cache) == 0
    assert core.barrier() is None  # nothing left to prove


def test_an_unmatched_error_makes_the_next_replay_stepwise_and_blames_the_refused_request() -> None:
    core = make_core()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    rec, _ = send(core, "r-1")
    refusal = Frame.make("ERROR", {"message": "too big"})
    assert core.on_error(refusal, link_error_frame=None, has_link=True) is False
    core.link_lost(a, ConnectionClosed("ended by the ERROR"))
    install, _ = up(core, b)
    assert core.state == "replaying" and install.plan.stepwise == [rec]
    step = core.stepwise_next(b, rec, install.generation)
    assert step == WriteAlone(Write(b, [rec.frame], 2))
    assert core.stepwise_blame(b, rec, refusal) == NoVerdict()  # still replaying: nothing to judge
    assert core.stepwise_next(FakeLink("other"), rec, install.generation) == StopReplay()
    core.link_lost(b, ConnectionClosed("ended by the ERROR again"))
    assert core.state == "reconnecting"
    blamed = core.stepwise_blame(b, rec, refusal)
    assert isinstance(blamed, Refused) and isinstance(blamed.error, BrokerError) and "too big" in str(blamed.error)
    assert core.pending == {} and core.refusal is None
    assert core.stepwise_next(b, rec, install.generation) == StopReplay()


def test_a_request_settled_during_the_stepwise_replay_is_skipped_and_a_silent_loss_is_not_blamed() -> None:
    core = make_core()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    r1, _ = send(core, "r-1")
    r2, _ = send(core, "r-2")
    core.on_error(Frame.make("ERROR", {"message": "too big"}), link_error_frame=None, has_link=True)
    core.link_lost(a, ConnectionClosed("ended by the ERROR"))
    install, _ = up(core, b)
    assert install.plan.stepwise == [r1, r2]
    assert core.withdraw("r-1")  # its caller stopped waiting
    assert core.stepwise_next(b, r1, install.generation) == Skip()
    assert isinstance(core.stepwise_next(b, r2, install.generation), WriteAlone)
    core.link_lost(b, ConnectionClosed("lost without an ERROR"))
    assert core.stepwise_blame(b, r2, None) == StopReplay()  # no refusal to blame it for


def test_the_same_refusal_again_and_again_with_only_subscriptions_left_gives_up() -> None:
    core = make_core()
    core.subscribe("s1", Frame.make("SUBSCRIBE", {"id": "s1", "destination": "/queue/q"}))
    refusal = Frame.make("ERROR", {"message": "no such destination"})
    for i in range(GIVE_UP_REFUSALS):
        assert core.give_up_now(ConnectionClosed("ended")) is None
        link = FakeLink(str(i))
        up(core, link)
        core.on_error(refusal, link_error_frame=None, has_link=True)
        core.link_lost(link, ConnectionClosed("ended"))
    error = core.give_up_now(ConnectionClosed("ended"))
    assert isinstance(error, BrokerError) and "1 subscription(s)" in str(error)


def test_an_error_answering_a_tracked_send_drops_it_from_the_cache_only() -> None:
    core = make_core(trackMessages="true")
    up(core, FakeLink("a"))
    sent = fire_and_forget(core, TRACK_RECEIPT_EVERY)
    rid = sent[-1][0].get("receipt")
    before = len(core.cache)
    error = Frame.make("ERROR", {"receipt-id": rid or "", "message": "refused"})
    assert core.on_error(error, link_error_frame=None, has_link=True) is True
    assert len(core.cache) == before - 1 and core.refusal is None


def test_close_closes_the_links_and_fails_every_request() -> None:
    core = make_core()
    a = FakeLink("a")
    up(core, a)
    rec, _ = send(core, "r-1")
    backup = FakeLink("backup")
    assert core.add_backup(backup)
    actions = core.close()
    assert actions[:2] == [Close(a), Close(backup, disconnect=False)]
    (settle,) = actions[2:]
    assert isinstance(settle, Settle) and settle.request is rec and isinstance(settle.error, ConnectionClosed)
    assert core.close() == []
    assert not core.add_backup(FakeLink("late"))
    closing = core.link_up(FakeLink("late"))
    assert closing is not None and closing.actions == [Close(closing.link)]
    with pytest.raises(ConnectionClosed):
        core.check_usable()


def test_the_connect_steps_follow_the_schedule_and_exhaust_with_the_right_option_named(
        caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(startupMaxReconnectAttempts=2, randomize="false", warnAfterReconnectAttempts=2)
    uri = parse_uri("failover:(tcp://a:1,tcp://b:2)")
    leaves = list(uri.components)  # type: ignore[union-attr]
    core.begin_connect(leaves, failover_schedule(leaves, core.options, startup=True), startup=True)
    seen = []
    with caplog.at_level(logging.DEBUG, logger="amqtransport.transports.failover"):
        with pytest.raises(ReconnectExhausted) as info:
            while True:
                step = core.next_connect()
                seen.append((step.endpoint.port, step.delay > 0))
                endpoint = core.connect_to(step)
                core.connect_failed(f"tcp://{endpoint.host}:{endpoint.port}", ConnectionClosed(f"refused {len(seen)}"))
    assert seen == [(1, False), (2, False), (1, True), (2, False)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["failover: 2 failed connect attempts so far (last: tcp://b:2: refused 2)",
                        "failover: 4 failed connect attempts so far (last: tcp://b:2: refused 4)"]
    error = info.value
    assert error.attempts == 4 and "startupMaxReconnectAttempts" in str(error)
    assert isinstance(error.last_error, ConnectionClosed) and str(error.last_error) == "refused 4"
    assert core.failed_attempts == 4
    core.connect_succeeded("tcp://a:1")
    assert core.failed_attempts == 0


def test_the_connect_policy_stops_at_a_refused_login_and_on_close() -> None:
    """A refused login is not retried (re-raised as it is); a transport closed during a
    step's wait stops the connect with ConnectionClosed, before or after the wait."""
    core = make_core()
    leaves = list(parse_uri("failover:(tcp://a:1)").components)  # type: ignore[union-attr]
    core.begin_connect(leaves, failover_schedule(leaves, core.options, startup=True), startup=True,
                       last_error=ConnectionClosed("link lost"))
    step = core.next_connect()
    refused = AuthenticationError("Access refused")
    with pytest.raises(AuthenticationError) as info:
        core.connect_failed("tcp://a:1", refused)
    assert info.value is refused and core.failed_attempts == 0
    core.connect_failed("tcp://a:1", ConnectionClosed("refused"))
    step = core.next_connect()
    core.close()
    with pytest.raises(ConnectionClosed, match="while reconnecting"):
        core.connect_to(step)
    with pytest.raises(ConnectionClosed, match="while reconnecting"):
        core.next_connect()


def test_a_dead_backup_is_skipped_and_a_lost_backup_is_forgotten() -> None:
    core = make_core()
    dead, live, other = FakeLink("dead"), FakeLink("live"), FakeLink("other")
    for link in (dead, live, other):
        core.add_backup(link)
    assert core.link_lost(other, ConnectionClosed("gone")) == []
    assert core.take_backup(lambda link: link is not dead) is live
    assert core.backups == []


def test_a_waiting_caller_gives_up_at_its_deadline_or_after_a_disconnected_stretch() -> None:
    from amqtransport.transports.waiting import ReceiptWait

    assert ReceiptWait(-1, None, 0.0).slice is None  # nothing to check: wait for the outcome
    mine = ReceiptWait(-1, 2.0, 10.0)
    assert mine.verdict(11.9, connected=False) is None
    assert mine.verdict(12.0, connected=True) == "deadline"
    uri = ReceiptWait(500, None, 0.0)
    assert uri.verdict(1.0, connected=False) is None  # the stretch starts now
    assert uri.verdict(1.3, connected=True) is None  # ... and ends: reconnected
    assert uri.verdict(1.4, connected=False) is None
    assert uri.verdict(1.8, connected=False) is None
    assert uri.verdict(1.9, connected=False) == "disconnected"


@pytest.mark.parametrize("headers", [
    {"message": "could not persist message: [Errno 28] No space left on device; outcome unknown",
     "amq-in-doubt": "true"},
    {"message": "broker stopped accepting messages: journal failed", "amq-broker-stopped": "true"},
    # a partitioned client's links, dropped by the broker's heart-beat check with the same text twice
    {"message": "heart-beat timeout: nothing received for 2.4 s", "amq-connection-ended": "true"},
])
def test_a_failing_broker_is_no_refusal_and_the_tracked_sends_are_kept(headers: dict[str, str]) -> None:
    """An ERROR that says the broker failed (a write in doubt, a fenced broker) or ends the
    connection for a reason of its own (a heart-beat timeout) is not the broker refusing our frames: the same one on link after link (a shared store whose disk
    is full fails the slave that takes over the same way) must not drop the trackMessages
    cache, which is replayed (with its keys: the broker drops a copy it already has)."""
    core = make_core(trackMessages="true")
    links = [FakeLink(f"l{i}") for i in range(4)]
    up(core, links[0])
    fire_and_forget(core, 3)
    for prev, nxt in zip(links, links[1:], strict=False):
        core.on_error(Frame.make("ERROR", headers), link_error_frame=None, has_link=True)
        core.link_lost(prev, ConnectionClosed("closed after the ERROR"))
        install, _ = up(core, nxt)
        assert [f.get(IDEMPOTENCY_HEADER) for f in install.plan.batch] == ["k-0", "k-1", "k-2"]
    assert len(core.cache) == 3, "the tracked sends were dropped"
    assert core.refusal is None
