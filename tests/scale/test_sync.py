"""Reading a store out for a replica (broker/store/sync.py): a snapshot taken at one
journal position and produced in bounded batches, then the journal's tail, rebuild the
store's state on a replica even while the store changes (and compacts) in between."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqtransport.broker.store import Ack, Enq, MessageStore, Sub
from amqtransport.broker.store.sync import SnapshotReader, TailReader

from .scale_helpers import T0, crash, msg, open_store, state


def mutate(s: MessageStore, op: tuple[Any, ...], n: int) -> int:
    """One change to the source store; returns the next message number."""
    kind = op[0]
    if kind == "send":
        for _ in range(op[1]):
            s.add(msg(n, "/queue/a" if n % 3 else "/queue/b", key=f"k{n}", size=op[2]))
            n += 1
    elif kind == "ack" and s.count:
        victims = list(s.iter_messages())[op[1] % s.count :][:3]
        for m in victims:
            s.ack([m.id], destination=m.destination)
    elif kind == "tx":
        recs: list[Any] = [Enq(msg(n + i, key=f"k{n + i}")) for i in range(op[1])]
        n += op[1]
        if s.resident:
            recs.append(Ack((next(iter(s.resident)),)))
        s.commit(recs)
    elif kind == "move" and s.count:
        m = list(s.iter_messages())[op[1] % s.count]
        s.move(m.id, "/queue/a" if m.destination == "/queue/DLQ.a" else "/queue/DLQ.a")
    elif kind == "sub":
        s.add_subscription(Sub(f"durable:c:s{op[1]}", "t", "c", f"s{op[1]}"))
    elif kind == "take":
        s.take("/queue/a", op[1])
    elif kind == "compact":
        s.flush()
        s.compact(force=True, relocate=100)
    return n


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(1, 30), st.integers(0, 2000)),
        st.tuples(st.just("ack"), st.integers(0, 100)),
        st.tuples(st.just("tx"), st.integers(0, 4)),
        st.tuples(st.just("move"), st.integers(0, 100)),
        st.tuples(st.just("sub"), st.integers(0, 2)),
        st.tuples(st.just("take"), st.integers(1, 20)),
        st.tuples(st.just("compact")),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=OPS, during=OPS, restart=st.booleans())
def test_snapshot_then_tail_rebuilds_the_state_while_the_store_changes(
    tmp_path_factory: Any, before: list[Any], during: list[Any], restart: bool
) -> None:
    root = tmp_path_factory.mktemp("sync")
    s = open_store(root / "master", segment_size=4096)
    n = 0
    for op in before:
        n = mutate(s, op, n)
    if restart:  # everything paged, from a checkpoint
        s.close()
        s = open_store(root / "master", segment_size=4096)
    snap = SnapshotReader(s)
    tail = TailReader(s, snap.position)
    first_segment = s.journal.segments[0]
    replica = open_store(root / "replica", segment_size=4096)
    ops = list(during)
    while True:  # the snapshot, 2 KiB at a time, the master changing between batches
        batch = snap.next(2048)
        if not batch:
            break
        assert sum(len(p) for p in batch[:-1]) < 2048  # the last one reaches the mark
        replica.import_payloads(batch)
        if ops:
            n = mutate(s, ops.pop(0), n)
    snap.close()
    for op in ops:
        n = mutate(s, op, n)
        replica.import_payloads(tail.next(1024))
    s.flush()
    while True:
        batch = tail.next(1024)
        if not batch:
            break
        replica.import_payloads(batch)
    assert tail.caught_up
    assert s.journal.segments[0] == first_segment  # compaction deleted nothing meanwhile
    tail.close()
    s.compact(force=True)  # ... and may now
    crash(replica)
    crash(s)
    a = open_store(root / "master")
    b = open_store(root / "replica")
    assert state(a, segments=False) == state(b, segments=False)
    crash(a)
    crash(b)


def test_a_deleted_segment_waits_for_the_readers(tmp_path: Path) -> None:
    s = open_store(tmp_path, segment_size=4096)
    for i in range(60):
        s.add(msg(i))
    s.ack([f"m{i}" for i in range(55)])
    s.flush()
    snap = SnapshotReader(s)
    before = list(s.journal.segments)
    assert s.compact(force=True)  # dead segments are found ...
    s.flush()
    assert s.journal.segments == before  # ... but kept while the snapshot reads
    payloads = snap.next(1 << 20)
    assert len(payloads) == 5 and snap.messages == 5
    assert snap.next(1 << 20) == []
    snap.close()
    s.flush()
    assert len(s.journal.segments) < len(before)
    s.close()


def test_a_moved_paged_message_is_sent_as_the_move_left_it(tmp_path: Path) -> None:
    s = open_store(tmp_path / "m")
    s.add(msg(0, key="k0"))
    s.close()
    s = open_store(tmp_path / "m")
    assert not s.resident
    s.move("m0", "/queue/DLQ.a")
    snap = SnapshotReader(s)
    replica = open_store(tmp_path / "r")
    replica.import_payloads(snap.next(1 << 20))
    snap.close()
    (m,) = replica.messages_by_destination()["/queue/DLQ.a"]
    assert m.key == "" and ("original-destination", "/queue/a") in m.headers and m.timestamp == T0
    crash(replica)
    s.close()
