"""Index checkpoints (broker/store/checkpoint.py): recovery from a checkpoint plus the
journal's tail builds the state a full replay builds; a torn, stale, foreign or
half-written checkpoint falls back to the full replay, never to another state."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from amqtransport.broker.store import Ack, Enq, MessageStore, Sub
from amqtransport.broker.store.checkpoint import FILE, CheckpointError, load

from .scale_helpers import T0, Pump, crash, msg, open_store, state


def recovered_both_ways(path: Path, tmp: Path, **kw: Any) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The state recovered from ``path`` with its checkpoint, and without it (a copy);
    plus what the first recovery logged about how it recovered."""
    without = tmp / "without-checkpoint"
    shutil.copytree(path, without)
    (without / FILE).unlink(missing_ok=True)
    a = open_store(path, **kw)
    how = a.checkpoints.last_recovery
    sa = state(a)
    crash(a)
    b = open_store(without, **kw)
    sb = state(b)
    crash(b)
    return sa, sb, how


def test_recovery_replays_only_the_tail_after_the_checkpoint(tmp_path: Path) -> None:
    s = open_store(tmp_path, segment_size=64 * 1024)
    for i in range(500):
        s.add(msg(i))
    s.flush()
    s.checkpoints.write_now()
    for i in range(500, 520):
        s.add(msg(i))
    s.ack([f"m{i}" for i in range(10)])
    crash(s)
    s2 = open_store(tmp_path)
    assert s2.checkpoints.last_recovery.startswith("recovered from the checkpoint")
    assert s2.checkpoints.last_recovery.endswith("+ 21 records")  # 20 Enq + 1 Ack, nothing before
    assert s2.count == 510
    assert len(s2.resident) == 0  # recovered messages are paged
    first = s2.take("/queue/a", 3)
    assert [m.id for m in first] == ["m10", "m11", "m12"]
    assert first[0].body.startswith(b"000010") and first[0].headers == (("n", "10"),)
    s2.ack(["m10", "m11"])
    crash(s2)
    s3 = open_store(tmp_path)
    assert [m.id for m in s3.messages_by_destination()["/queue/a"]][:2] == ["m12", "m13"]
    assert s3.count == 508
    s3.close()


def test_a_clean_close_writes_a_checkpoint_that_covers_everything(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    for i in range(50):
        s.add(msg(i))
    s.close()
    s2 = open_store(tmp_path)
    assert s2.checkpoints.last_recovery.endswith("+ 0 records")
    assert s2.count == 50
    s2.close()


def _checkpointed_store(path: Path) -> tuple[MessageStore, bytes]:
    s = open_store(path, segment_size=16 * 1024)
    for i in range(300):
        s.add(msg(i, dest="/queue/a" if i % 3 else "/queue/b", key=f"k{i}"))
    s.ack([f"m{i}" for i in range(0, 300, 7)])
    s.flush()
    s.checkpoints.write_now()
    return s, (path / FILE).read_bytes()


@pytest.mark.parametrize("cut", [0, 7, 19, 100, -1])
def test_a_torn_checkpoint_falls_back_to_a_full_replay(tmp_path: Path, cut: int) -> None:
    s, data = _checkpointed_store(tmp_path / "store")
    for i in range(300, 320):
        s.add(msg(i))
    crash(s)
    (tmp_path / "store" / FILE).write_bytes(data[:cut] if cut >= 0 else data[:-1])
    with pytest.raises(CheckpointError):
        load(tmp_path / "store", [])
    a, b, how = recovered_both_ways(tmp_path / "store", tmp_path)
    assert how.startswith("replayed the whole journal")
    assert a == b and a["count"] == 300 - 43 + 20


def test_a_flipped_bit_in_the_checkpoint_is_refused(tmp_path: Path) -> None:
    s, data = _checkpointed_store(tmp_path / "store")
    crash(s)
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x10
    (tmp_path / "store" / FILE).write_bytes(bytes(bad))
    a, b, how = recovered_both_ways(tmp_path / "store", tmp_path)
    assert "checksum mismatch" in how
    assert a == b


def test_a_crash_while_writing_a_checkpoint_leaves_the_previous_one(tmp_path: Path) -> None:
    """The new checkpoint is written to checkpoint.tmp and renamed over the old one only
    when whole and fsynced: a crash in the middle leaves a partial .tmp, which recovery
    ignores (the previous checkpoint plus a longer tail)."""
    path = tmp_path / "store"
    s, _old = _checkpointed_store(path)
    for i in range(300, 400):
        s.add(msg(i))
    s.ack(["m1", "m2", "m301"])
    s.flush()
    from amqtransport.broker.store.checkpoint import capture, serialize

    newer = serialize(capture(s))
    crash(s)
    (path / (FILE + ".tmp")).write_bytes(newer[: len(newer) // 2])  # the crash, mid-write
    a, b, how = recovered_both_ways(path, tmp_path)
    assert how.startswith("recovered from the checkpoint") and not how.endswith("+ 0 records")
    assert a == b and a["count"] == 257 + 100 - 3


def test_a_stale_checkpoint_never_resurrects_acked_messages(tmp_path: Path) -> None:
    """The checkpoint counts m0..m99 live in the first segments; afterwards they are all
    acked in a later segment A, and compaction deletes their segments and A (without
    periodic checkpoints it deletes at once). The checkpoint's own segment stays (it
    holds a live message), but the tail no longer says m0..m99 were acked: recovery sees
    live messages in deleted segments and replays everything instead."""
    s = open_store(tmp_path, segment_size=4096, checkpoint_interval=0)
    for i in range(100):
        s.add(msg(i))
    s.add(msg(1000, size=3900))  # starts a segment and stays live: it is never deleted
    s.flush()
    s.checkpoints.write_now()
    ckpt_segment = s.journal.head
    assert s.resident["m1000"].segment == ckpt_segment > s.resident["m99"].segment
    for i in range(100, 130):  # roll to a new segment A
        s.add(msg(i))
    s.ack([f"m{i}" for i in range(100)])  # the Ack of m0..m99 is in A
    for i in range(200, 300):  # roll on, acking as we go
        s.add(msg(i))
        s.ack([f"m{i}"])
    s.ack([f"m{i}" for i in range(100, 130)])
    s.add(msg(500))
    s.flush()
    s.compact(force=True)
    s.flush()
    assert s.journal.segments[0] == ckpt_segment  # the older ones went ...
    assert ckpt_segment + 1 not in s.journal.segments  # ... and A with them
    crash(s)
    a, b, how = recovered_both_ways(tmp_path, tmp_path / "x")
    assert "the checkpoint is stale" in how
    assert a == b and a["count"] == 2
    assert [m[0] for m in a["messages"]["/queue/a"]] == ["m500", "m1000"] or [
        m[0] for m in a["messages"]["/queue/a"]] == ["m1000", "m500"]


def test_a_checkpoint_from_another_journal_is_refused(tmp_path: Path) -> None:
    s, data = _checkpointed_store(tmp_path / "one")
    crash(s)
    other = open_store(tmp_path / "two", segment_size=16 * 1024)
    for i in range(300):
        other.add(msg(1000 + i))
    crash(other)
    (tmp_path / "two" / FILE).write_bytes(data)
    a, b, how = recovered_both_ways(tmp_path / "two", tmp_path)
    assert "another journal" in how or "bytes" in how
    assert a == b and a["count"] == 300 and a["messages"]["/queue/a"][0][0] == "m1000"


def test_the_tail_a_crash_left_counts_toward_the_next_checkpoint(tmp_path: Path) -> None:
    """Checkpoints come every ``checkpoint_interval`` bytes of journal, not of one
    process's appends, and a process that recovered a tail of a segment or more
    checkpoints at its first append: terms that each end (a crash, a takeover) before
    appending an interval's worth leave the next one only their own tail to replay, never
    every term's since the last checkpoint (issue 24)."""
    pump = Pump()
    interval = 32 * 1024
    kw: dict[str, Any] = {"segment_size": 8192, "checkpoint_interval": interval, "notify": pump}
    s = open_store(tmp_path, **kw)
    s.add(msg(0))
    s.flush()
    s.checkpoints.write_now()
    sent, per_term = 1, []
    for _term in range(4):  # each term appends about 0.4 x the interval, then crashes
        start, n = s.journal.appended_bytes, 0
        while s.journal.appended_bytes - start < 0.4 * interval:
            s.add(msg(sent))
            sent, n = sent + 1, n + 1
        pump.run()
        s.checkpoints.stop()
        pump.run()
        per_term.append(n)
        crash(s)
        s = open_store(tmp_path, **kw)
    tail = int(s.checkpoints.last_recovery.rsplit("+ ", 1)[1].split()[0])
    assert tail <= per_term[-1], (s.checkpoints.last_recovery, per_term)  # the last term's, not all four
    assert s.count == sent
    s.close()


def test_periodic_checkpoints_with_compaction(tmp_path: Path) -> None:
    """Background checkpoints every 32 KiB of journal; compaction deletes a dead segment
    only once a checkpoint that no longer needs it is published, so after a crash the
    newest checkpoint is never stale and the tail stays short."""
    pump = Pump()
    s = open_store(tmp_path, segment_size=8192, checkpoint_interval=32 * 1024, notify=pump)
    sent = 0
    for _round in range(20):
        for _ in range(50):
            s.add(msg(sent))
            sent += 1
        s.ack([m for m in list(s.resident)[:40]])
        pump.run()
        if s.compact(force=True):
            assert s.checkpoints.pending_deletes  # not deleted before a checkpoint
        s.checkpoints.stop()
        pump.run()
    s.flush()
    pump.run()
    assert s.checkpoints.written >= 3
    assert s.deleted_segments > 0 and not s.checkpoints.pending_deletes
    crash(s)
    a, b, how = recovered_both_ways(tmp_path, tmp_path / "x", notify=pump)
    assert how.startswith("recovered from the checkpoint"), how
    assert a == b and a["count"] == 20 * 10


def test_paged_messages_across_transactions_moves_and_a_replica(tmp_path: Path) -> None:
    """Messages inside a transaction's record are read back from inside it; a moved
    paged message comes back as the move left it; a replica's records page the same."""
    stream: list[bytes] = []

    class Tap:
        def on_record(self, record: object, payload: bytes, segment: int) -> None:
            stream.append(payload)

    s = open_store(tmp_path / "m")
    s.add_listener(Tap())
    s.commit([Enq(msg(i, key=f"k{i}")) for i in range(5)])
    s.add_subscription(Sub("durable:c:s", "t", "c", "s"))
    s.move("m2", "/queue/DLQ.a")
    crash(s)
    replica = open_store(tmp_path / "r")
    for p in stream:
        replica.import_payloads([p])
    replica.flush()
    replica.checkpoints.write_now()
    replica.import_payloads([stream[-1]])  # an idempotent move again, after the checkpoint
    for path in (tmp_path / "m", None):
        st = open_store(path) if path is not None else replica
        by = st.messages_by_destination()
        assert [m.id for m in by["/queue/a"]] == ["m0", "m1", "m3", "m4"]
        (moved,) = by["/queue/DLQ.a"]
        assert moved.id == "m2" and moved.key == "" and ("original-destination", "/queue/a") in moved.headers
        assert moved.body.startswith(b"000002")
        assert st.subs["durable:c:s"].topic == "t"
        assert st.dedupe.contains("/queue/a", "k2")
        crash(st)


# ---------------------------------------------------------------------- the property
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 2), st.integers(1, 40), st.integers(0, 3000), st.booleans()),
        st.tuples(st.just("ack"), st.integers(0, 50), st.integers(1, 8)),
        st.tuples(st.just("ack-any"), st.integers(0, 50), st.integers(1, 8)),
        st.tuples(st.just("tx"), st.integers(0, 4), st.integers(0, 3)),
        st.tuples(st.just("move"), st.integers(0, 50)),
        st.tuples(st.just("sub"), st.integers(0, 2)),
        st.tuples(st.just("take"), st.integers(0, 2), st.integers(1, 30)),
        st.tuples(st.just("compact"), st.booleans()),
        st.tuples(st.just("checkpoint")),
        st.tuples(st.just("reopen"), st.booleans()),
    ),
    min_size=1,
    max_size=40,
)
DESTS = ["/queue/a", "/queue/b", "/queue/DLQ.a"]


def run_ops(
    path: Path, ops: list[Any], kw: dict[str, Any], tick: Callable[[], float], pump: Pump | None
) -> dict[str, Any]:
    """Apply ``ops`` to a store at ``path``; returns its state just before the final crash."""
    s = open_store(path, **kw)
    n = 0
    for op in ops:
        kind = op[0]
        if kind == "send":
            for _ in range(op[2]):
                m = msg(n, DESTS[op[1]], key=f"k{n}" if op[4] else "", size=op[3])
                m.timestamp = tick()
                s.add(m)
                n += 1
        elif kind == "ack" and s.resident:
            ids = list(s.resident)
            s.ack(ids[op[1] % len(ids) :][: op[2]])
        elif kind == "ack-any" and s.count:
            every = list(s.iter_messages())[op[1] % s.count :][: op[2]]
            for m in every:
                s.ack([m.id], destination=m.destination)
        elif kind == "tx":
            recs: list[Any] = []
            for _ in range(op[1]):
                m = msg(n, DESTS[n % 2], key=f"k{n}")
                m.timestamp = tick()
                recs.append(Enq(m))
                n += 1
            ids = list(s.resident)[: op[2]]
            if ids:
                recs.append(Ack(tuple(ids)))
            s.commit(recs)
        elif kind == "move" and s.count:
            every = list(s.iter_messages())
            m = every[op[1] % len(every)]
            s.move(m.id, "/queue/a" if m.destination == "/queue/DLQ.a" else "/queue/DLQ.a")
        elif kind == "sub":
            s.add_subscription(Sub(f"durable:c:s{op[1]}", f"t{op[1]}", "c", f"s{op[1]}"))
        elif kind == "take":
            s.take(DESTS[op[1]], op[2])
        elif kind == "compact":
            s.flush()
            s.compact(force=True, relocate=100 if op[1] else 0)
        elif kind == "checkpoint":
            s.flush()
            s.checkpoints.write_now()
        elif kind == "reopen":
            if op[1]:
                s.close()
            else:
                crash(s)
            if pump is not None:
                pump.run()
            s = open_store(path, **kw)
        if pump is not None:
            pump.run()
    s.flush()
    before = state(s)
    crash(s)
    return before


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, periodic=st.booleans())
def test_recovery_with_and_without_the_checkpoint_builds_the_same_state(
    tmp_path_factory: Any, ops: list[Any], periodic: bool
) -> None:
    """Any history of sends, acks (of resident and of paged messages), transactions,
    moves there and back, subscriptions, compaction with relocation, checkpoints and
    restarts (clean or crashed): recovering with the checkpoint and recovering without
    it (a full replay) give the same messages in the same order, subscriptions and keys:
    the ones the store held before it stopped. ``periodic``: background checkpoints every 8 KiB, compaction deleting only behind them."""
    root = tmp_path_factory.mktemp("ckpt")
    path = root / "store"
    clock = [T0]

    def tick() -> float:
        clock[0] += 0.001
        return clock[0]

    pump = Pump() if periodic else None
    kw: dict[str, Any] = {"segment_size": 4096, "clock": tick}
    if pump is not None:
        kw.update(checkpoint_interval=8192, notify=pump)
    before = run_ops(path, ops, kw, tick, pump)
    a, b, how = recovered_both_ways(path, root, **kw)
    event("checkpoint + tail" if how.startswith("recovered from the checkpoint") else how.split(";")[-1][:40])
    event(f"live messages: {'0' if not a['count'] else '1-9' if a['count'] < 10 else '10+'}")
    assert a == b
    assert a == before  # and it is the state the store had


def test_recovery_log_says_how(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="amqtransport.broker.store")
    s = open_store(tmp_path)
    s.add(msg(1))
    s.close()
    open_store(tmp_path).close()
    assert "recovered from the checkpoint at segment 1 offset" in caplog.text
    (tmp_path / FILE).write_bytes(b"AMQCKPT1 nonsense")
    open_store(tmp_path).close()
    assert "checkpoint body is" in caplog.text or "torn" in caplog.text
    assert "replaying the whole journal" in caplog.text


def test_a_checkpoint_of_a_deep_queue_costs_a_copy_of_its_arrays_not_more(tmp_path: Path) -> None:
    """A periodic checkpoint is captured inside an append, while the message just added
    is still resident and newer than every paged one (and the queue's front is resident
    and older). The capture copies the paged arrays once and puts those at their ends,
    in place; it used to sort every paged entry as a Python tuple then (about 130 bytes
    a message at the peak: 311 MB on a replicated master filled with 1M), then to join
    the pieces into new arrays (another copy). The order it gives is the one recovery
    needs. The file is written piece by piece (it used to be joined in memory first:
    three more copies)."""
    import tracemalloc

    from amqtransport.broker.store.checkpoint import capture

    n = 100_000
    s = open_store(tmp_path, fsync=False)
    for i in range(n + 10):
        m = msg(i, size=10)
        s.add(m)
        if 10 <= i < n:
            assert s.page_out(m)
    tracemalloc.start()
    try:
        cap = capture(s)
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    pos, ids, ts, ordered = cap.lists["/queue/a"]
    assert ordered and list(ts) == [T0 + i for i in range(n + 10)]  # front, paged, newest
    assert len(pos) == len(ids) == n + 10
    assert peak < 40 * n, peak  # one copy of three 8-byte arrays (24 bytes a message)
    del cap
    s.flush()
    tracemalloc.start()
    try:
        size = s.checkpoints.write_now()  # streamed to the file: no copy of the whole body
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size > 24 * n and peak < 40 * n, (size, peak)
    crash(s)
    assert open_store(tmp_path).checkpoints.last_recovery.startswith("recovered from the checkpoint")
