"""The journal and the message store, on real files (no broker, no sockets)."""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.store import (
    Ack,
    DedupeWindow,
    Enq,
    Journal,
    Keys,
    MessageStore,
    Move,
    RecordError,
    RecordTooLarge,
    StoreLockedError,
    Sub,
    Tx,
    Unsub,
    decode,
    encode,
    scan_segment,
)

T0 = time.time()


def msg(i: int, dest: str = "/queue/a", key: str = "", body: bytes | None = None) -> Message:
    return Message(
        id=f"m{i}",
        destination=dest,
        headers=(("h", f"v{i}"), ("ü", "ß:\n")),
        body=body if body is not None else f"body-{i}".encode(),
        key=key,
        timestamp=T0 + i,
        persistent=True,
    )


def same(a: Message, b: Message) -> bool:
    return (a.id, a.destination, a.headers, a.body, a.key, a.timestamp, a.expires) == (
        b.id,
        b.destination,
        b.headers,
        b.body,
        b.key,
        b.timestamp,
        b.expires,
    )


def open_store(path: Path, **kw: object) -> MessageStore:
    store = MessageStore(path, **kw)  # type: ignore[arg-type]
    store.open()
    return store


# ---------------------------------------------------------------------- records


def test_records_round_trip() -> None:
    m = msg(1, key="k1", body=b"\x00\xff" * 10)
    for rec in [
        Enq(m),
        Ack(("a", "b", "c")),
        Move("m1", "/queue/DLQ.a"),
        Tx((Enq(msg(2)), Ack(("m1",)), Move("m3", "/queue/x"))),
        Keys((("/queue/a", "k", 1.5), ("/topic/t", "k2", 2.5))),
        Tx((Enq(msg(4)), Keys((("/topic/t", "k3", 3.5),)))),
        Sub("durable:c:s", "/topic/t", "c", "s"),
        Unsub("durable:c:s"),
    ]:
        back = decode(encode(rec))
        if isinstance(rec, Enq):
            assert isinstance(back, Enq) and same(back.message, rec.message)
        elif isinstance(rec, Tx):
            assert isinstance(back, Tx) and len(back.records) == len(rec.records)
            assert back.records[1:] == rec.records[1:]
        else:
            assert back == rec


def test_keys_from_journals_before_destination_scoping_still_decode() -> None:
    # type 5: u32 count, then (u16 len, key, f64 accepted-at) each: no destination
    legacy = b"\x05\x01\x00\x00\x00\x02\x00k1" + struct.pack("<d", 7.5)
    assert decode(legacy) == Keys((("", "k1", 7.5),))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=200))
def test_decode_garbage_raises_record_error_only(data: bytes) -> None:
    try:
        decode(data)
    except RecordError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_scan_segment_never_raises(data: bytes) -> None:
    records, end, _problem = scan_segment(b"AMQJSEG1" + data)
    assert 8 <= end <= 8 + len(data)


# ---------------------------------------------------------------------- journal


def test_group_commit_batches_concurrent_appends(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    list(j.recover())
    j.start()
    done = threading.Event()
    results: list[BaseException | None] = []
    lock = threading.Lock()
    n = 2000

    def cb(err: BaseException | None) -> None:
        with lock:
            results.append(err)
            if len(results) == n:
                done.set()

    for i in range(n):
        j.append([encode(Ack((f"x{i}",)))], cb)
    assert done.wait(20)
    assert results == [None] * n
    # far fewer fsync rounds than records: the writer batched them
    assert j.batches < n
    j.close()
    j2 = Journal(tmp_path)
    recs = [r for _seg, r in j2.recover()]
    assert [r.ids[0] for r in recs if isinstance(r, Ack)] == [f"x{i}" for i in range(n)]
    j2.close()


def test_second_process_cannot_open_the_same_journal(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    with pytest.raises(StoreLockedError):
        MessageStore(tmp_path).open()
    s.close()


# ---------------------------------------------------------------------- store


def test_recovery_restores_live_messages_and_order(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    for i in range(10):
        s.add(msg(i, dest="/queue/a" if i % 2 else "/queue/b"))
    s.ack(["m2", "m3"])
    s.move("m5", "/queue/DLQ.a")
    s.commit([Enq(msg(20)), Ack(("m4",))])
    s.close()

    s2 = open_store(tmp_path)
    by = s2.messages_by_destination()
    assert [m.id for m in by["/queue/a"]] == ["m1", "m7", "m9", "m20"]
    assert [m.id for m in by["/queue/b"]] == ["m0", "m6", "m8"]
    dlq = by["/queue/DLQ.a"][0]
    assert dlq.id == "m5" and ("original-destination", "/queue/a") in dlq.headers
    assert same(by["/queue/b"][0], msg(0, dest="/queue/b"))
    s2.close()


def test_torn_tail_is_truncated_and_writing_continues(tmp_path: Path) -> None:
    # no checkpoint: one taken at close covers the last record as durable, and a cut below
    # it proves loss (test_journal_loss.py); a crash mid-write leaves no such checkpoint
    s = open_store(tmp_path, checkpoints=False)
    for i in range(5):
        s.add(msg(i))
    s.close()
    seg = sorted(tmp_path.glob("seg-*.log"))[-1]
    size = seg.stat().st_size
    os.truncate(seg, size - 7)  # cut the last record in the middle

    s2 = open_store(tmp_path, checkpoints=False)
    assert sorted(s2.live) == ["m0", "m1", "m2", "m3"]
    s2.add(msg(9))
    s2.close()
    s3 = open_store(tmp_path, checkpoints=False)
    assert sorted(s3.live) == ["m0", "m1", "m2", "m3", "m9"]
    s3.close()


def test_a_truncated_torn_tail_is_fsynced_before_the_first_new_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut must be durable before anything is written after it: else a power loss
    brings the torn bytes back at the end of a segment that is no longer the last, where
    the next recovery reads them as damage (salvage.py), not as a tail to cut."""
    s = open_store(tmp_path, checkpoints=False)
    for i in range(5):
        s.add(msg(i))
    s.close()
    seg = sorted(tmp_path.glob("seg-*.log"))[-1]
    os.truncate(seg, seg.stat().st_size - 7)  # cut the last record in the middle

    events: list[tuple[str, str, int]] = []  # (what, file name, its size then)
    real_fsync, real_fdatasync, real_write = os.fsync, os.fdatasync, os.write

    def name(fd: int) -> str:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))

    def fsync(fd: int) -> None:
        events.append(("sync", name(fd), os.fstat(fd).st_size))
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        events.append(("sync", name(fd), os.fstat(fd).st_size))
        real_fdatasync(fd)

    def write(fd: int, data: bytes | memoryview) -> int:
        if name(fd).startswith("seg-"):
            events.append(("write", name(fd), os.fstat(fd).st_size))
        return real_write(fd, data)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "write", write)
    s2 = open_store(tmp_path, checkpoints=False)
    s2.add(msg(9))
    s2.close()
    monkeypatch.undo()
    cut = seg.stat().st_size
    first_write = next(i for i, e in enumerate(events) if e[0] == "write")
    assert ("sync", seg.name, cut) in events[:first_write], events
    s3 = open_store(tmp_path, checkpoints=False)
    assert sorted(s3.live) == ["m0", "m1", "m2", "m3", "m9"]
    s3.close()


@pytest.mark.parametrize("checkpoint", [False, True])
def test_corrupt_checksum_stops_that_segment(
    tmp_path: Path, checkpoint: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A full replay stops reading a segment at a corrupt frame; with a checkpoint (which
    trusts the records before it) the corrupt message is found when it is read back:
    logged, and lost alone."""
    s = open_store(tmp_path, checkpoints=checkpoint)
    for i in range(3):
        s.add(msg(i, body=b"X" * 100))
    s.close()
    assert (tmp_path / "checkpoint").exists() == checkpoint
    seg = sorted(tmp_path.glob("seg-*.log"))[-1]
    data = bytearray(seg.read_bytes())
    data[-50] ^= 0xFF  # flip a byte inside the last record's body
    seg.write_bytes(bytes(data))
    s2 = open_store(tmp_path, checkpoints=checkpoint)
    assert [m.id for m in s2.messages_by_destination()["/queue/a"]] == ["m0", "m1"]
    assert s2.count == 2
    s2.close()
    if checkpoint:
        assert "a message of /queue/a at segment 1 offset 340 cannot be read back" in caplog.text
        caplog.clear()


def test_compaction_deletes_dead_segments_but_never_resurrects(tmp_path: Path) -> None:
    s = open_store(tmp_path, segment_size=4096)
    for i in range(200):
        s.add(msg(i, body=b"x" * 100))
    s.flush()
    many = len(s.journal.segments)
    assert many > 5
    # ack all but one old message (m0 stays live in the first segment)
    s.ack([f"m{i}" for i in range(1, 200)])
    s.flush()
    deleted = s.compact(force=True)
    s.flush()
    assert deleted, "segments without live messages must go"
    first = s.journal.segments[0]
    assert s.live["m0"].segment == first  # the segment holding m0 survives
    files = sorted(tmp_path.glob("seg-*.log"))
    assert len(files) < many
    s.close()
    s2 = open_store(tmp_path)
    assert list(s2.live) == ["m0"]  # nothing acked came back
    s2.ack(["m0"])
    s2.flush()
    s2.compact(force=True)
    s2.flush()
    s2.close()
    s3 = open_store(tmp_path)
    assert s3.live == {}
    s3.compact(force=True)
    s3.flush()
    assert len(list(tmp_path.glob("seg-*.log"))) <= 2
    s3.close()


def test_ack_in_later_segment_keeps_it_until_the_acked_segment_goes(tmp_path: Path) -> None:
    s = open_store(tmp_path, segment_size=2048)
    s.add(msg(0, body=b"a" * 1500))  # segment A: m0
    s.add(msg(1, body=b"b" * 1500))  # segment B: m1
    s.ack(["m0"])  # ack of A's m0 lands in B (or later)
    s.flush()
    # A is dead (m0 acked); the segment with the ack must not go before A
    s.compact(force=True)
    s.flush()
    s.close()
    s2 = open_store(tmp_path)
    assert list(s2.live) == ["m1"]
    s2.close()


def test_dedupe_survives_restart_and_compaction(tmp_path: Path) -> None:
    s = open_store(tmp_path, segment_size=2048)
    s.add(msg(0, key="key-0", body=b"z" * 1500))
    assert s.is_duplicate("/queue/a", "key-0")
    assert not s.is_duplicate("/queue/a", "key-1")
    s.ack(["m0"])
    for i in range(1, 5):
        s.add(msg(i, body=b"y" * 1500))
        s.ack([f"m{i}"])
    s.flush()
    s.compact(force=True)
    s.flush()
    first_seg = tmp_path / "seg-0000000001.log"
    assert not first_seg.exists()  # the segment with key-0's message is gone ...
    s.close()
    s2 = open_store(tmp_path)
    assert s2.is_duplicate("/queue/a", "key-0")  # ... but the key was carried forward
    s2.close()


def test_dedupe_window_bounds(tmp_path: Path) -> None:
    now = [5000.0]
    s = open_store(tmp_path, dedupe_max_keys=3, dedupe_max_age=10.0, clock=lambda: now[0])
    for i in range(5):
        m = msg(i, key=f"k{i}")
        m.timestamp = now[0]
        s.add(m)
    assert not s.is_duplicate("/queue/a", "k0") and not s.is_duplicate("/queue/a", "k1")
    assert s.is_duplicate("/queue/a", "k4")
    now[0] += 11
    assert not s.is_duplicate("/queue/a", "k4")
    s.close()


def test_duplicate_completion_waits_for_the_original(tmp_path: Path) -> None:
    order: list[str] = []
    s = open_store(tmp_path)
    s.add(msg(0, key="dup"), lambda err: order.append("original"))
    assert s.is_duplicate("/queue/a", "dup", lambda err: order.append("repeat"))
    s.flush()
    assert order == ["original", "repeat"]
    s.close()


def test_durable_subscription_records(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    s.add_subscription(Sub("durable:c:a", "/topic/t", "c", "a"))
    s.add_subscription(Sub("durable:c:b", "/topic/t", "c", "b"))
    s.remove_subscription("durable:c:a")
    s.close()
    s2 = open_store(tmp_path)
    assert list(s2.subs) == ["durable:c:b"]
    s2.close()


def test_snapshot_rebuilds_an_equal_store(tmp_path: Path) -> None:
    a = open_store(tmp_path / "a")
    a.add_subscription(Sub("durable:c:a", "/topic/t", "c", "a"))
    for i in range(6):
        a.add(msg(i, key=f"k{i}"))
    a.ack(["m1"])
    seen: list[str] = []

    class L:
        def on_record(self, record: object, payload: bytes, segment: int) -> None:
            seen.append(type(record).__name__)

    b = open_store(tmp_path / "b")
    b.import_records(a.snapshot())
    b.add_listener(L())
    b.ack(["m2"])
    assert seen == ["Ack"]
    b.close()
    b2 = open_store(tmp_path / "b")
    assert list(b2.live) == ["m0", "m3", "m4", "m5"]
    assert list(b2.subs) == ["durable:c:a"]
    assert b2.is_duplicate("/queue/a", "k1")
    b2.close()
    a.close()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.text(min_size=1, max_size=20), st.text(max_size=30)), max_size=8),
    st.binary(max_size=100),
    st.text(max_size=30),
)
def test_enq_round_trip_any_headers(headers: list[tuple[str, str]], body: bytes, key: str) -> None:
    m = Message("id", "/queue/q", tuple(headers), body, key, 12.5)
    back = decode(encode(Enq(m)))
    assert isinstance(back, Enq) and same(back.message, m)


def test_relocation_frees_segments_pinned_by_a_few_old_messages(tmp_path: Path) -> None:
    s = open_store(tmp_path, segment_size=4096)
    for i in range(300):
        s.add(msg(i, dest="/queue/dlq" if i == 3 else "/queue/a", body=b"x" * 100))
    s.add(msg(1000, dest="/queue/dlq", body=b"newer"))
    s.flush()
    # everything but m3 (a poison message nobody consumes) and m1000 is consumed
    s.ack([f"m{i}" for i in range(300) if i != 3])
    s.flush()
    s.compact(force=True)
    s.flush()
    first = s.journal.segments[0]
    assert s.live["m3"].segment == first  # without relocation the first segment stays ...
    kept = len(s.journal.segments)
    s.compact(relocate=100)
    s.flush()
    assert s.relocated == 1
    assert first not in s.journal.segments  # ... with it, it goes
    assert len(s.journal.segments) < kept
    s.close()
    s2 = open_store(tmp_path)
    assert [m.id for m in s2.messages_by_destination()["/queue/dlq"]] == ["m3", "m1000"]  # original order
    s2.close()


def test_carried_forward_keys_keep_their_place_in_the_window(tmp_path: Path) -> None:
    """Compaction re-writes the keys of a deleted segment into the head segment; the
    window must still forget the *oldest* key first (by when it was accepted, not by
    when its record was written), at run time and after a restart."""
    s = open_store(tmp_path, segment_size=2048, dedupe_max_keys=3)
    s.add(msg(0, key="k0", body=b"a" * 1500))  # segment 1: the oldest key
    s.ack(["m0"])
    for i in (1, 2):  # later keys, later segments
        s.add(msg(i, key=f"k{i}", body=b"b" * 1500))
    s.flush()
    assert s.compact(force=True) == [1]  # k0 is carried into the head segment
    s.flush()

    def window(store: MessageStore) -> list[str]:
        return [k for k in ("k0", "k1", "k2", "k3") if store.is_duplicate("/queue/a", k)]

    assert window(s) == ["k0", "k1", "k2"]
    s.add(msg(3, key="k3"))  # a fourth key: the oldest (k0) must go, not k1
    assert window(s) == ["k1", "k2", "k3"]
    s.close()
    s2 = open_store(tmp_path, dedupe_max_keys=3)
    assert window(s2) == ["k1", "k2", "k3"]
    s2.close()
    s3 = open_store(tmp_path, dedupe_max_keys=2)  # a smaller window after the restart
    assert window(s3) == ["k2", "k3"]
    s3.close()


def test_window_age_limit_holds_for_keys_written_out_of_order(tmp_path: Path) -> None:
    now = [T0 + 100]
    s = open_store(tmp_path, dedupe_max_age=50.0, clock=lambda: now[0])
    s.import_records([Keys((("/queue/a", "new", T0 + 90),)), Keys((("/queue/a", "old", T0 + 60),))])
    assert s.is_duplicate("/queue/a", "new") and s.is_duplicate("/queue/a", "old")
    now[0] = T0 + 115  # "old" is 55 s old (> 50), "new" 25 s
    assert not s.is_duplicate("/queue/a", "old")
    assert s.is_duplicate("/queue/a", "new")
    s.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40)), max_size=60), st.integers(1, 6), st.integers(0, 50))
def test_window_keeps_the_newest_keys_whatever_the_arrival_order(
    adds: list[tuple[int, int]], max_keys: int, age: int
) -> None:
    """Model check: the window holds exactly the ``max_keys`` most recently accepted keys
    younger than ``max_age``, for any order of (re-)adds."""
    now = 100.0
    w = DedupeWindow(max_keys, float(age), clock=lambda: now)
    model: dict[str, float] = {}
    for key_no, ts in adds:
        key = f"k{key_no}"
        w.add("/queue/a", key, float(ts) + 60)
        model[key] = float(ts) + 60
        # the model: newest max_keys by time (ties: any), none older than the horizon
        ranked = sorted(model.items(), key=lambda kv: kv[1], reverse=True)
        model = {k: t for k, t in ranked if not age or t >= now - age}
        kept = {k for k in model if w.contains("/queue/a", k)}
        newest = [t for _k, t in ranked if not age or t >= now - age][:max_keys]
        assert len(kept) == len(newest)
        assert sorted((model[k] for k in kept), reverse=True) == newest
        model = {k: model[k] for k in kept}


def test_relocation_frees_a_chain_of_dead_segments_held_back_by_half_live_ones(tmp_path: Path) -> None:
    """The shared-store growth of the 200-round nemesis (docs/chaos.md): messages nobody
    consumes yet (half of their segments: more than the tenth relocation takes), and a
    consumer acking the rest with a lag, so each later segment's acks refer to the one
    before: no segment after the first is ever deleted, however much is dead behind it.
    Once the dead segments held back reach HOLD_BACK x the live bytes, the live messages
    are relocated and the chain goes."""
    s = open_store(tmp_path, segment_size=4096)
    for i in range(40):  # the first segments: half kept (a backlog nobody takes yet), half consumed
        s.add(msg(i, dest="/queue/keep" if i % 2 else "/queue/a", body=b"x" * 100))
    s.ack([f"m{i}" for i in range(0, 40, 2)])
    for i in range(40, 640):  # then traffic acked 5 messages behind: acks in the next segment
        s.add(msg(i, body=b"x" * 100))
        if i >= 45:
            s.ack([f"m{i - 5}"])
    s.flush()
    s.compact(force=True)
    s.flush()
    first = s.journal.segments[0]
    assert s.live["m1"].segment == first
    assert len(s.journal.segments) > 15  # held back: the old rule keeps them all
    s.compact(relocate=100)
    s.flush()
    s.compact(force=True)
    s.flush()
    assert s.relocated == 20  # the 20 kept messages, re-written into the head
    assert first not in s.journal.segments and len(s.journal.segments) <= 4, s.journal.segments
    s.close()
    s2 = open_store(tmp_path)
    assert [m.id for m in s2.messages_by_destination()["/queue/keep"]] == [f"m{i}" for i in range(1, 40, 2)]
    assert sorted(m.id for m in s2.messages_by_destination()["/queue/a"]) == sorted(f"m{i}" for i in range(635, 640))
    s2.close()


def _held_back_chain(s: MessageStore, start: int, n: int) -> None:
    """``n`` messages from ``m<start>``: the first 40 half kept (a backlog nobody takes),
    the rest acked 5 behind, so each segment's acks refer to the one before."""
    for i in range(start, start + 40):
        s.add(msg(i, dest="/queue/keep" if i % 2 else "/queue/a", body=b"x" * 100))
    s.ack([f"m{i}" for i in range(start, start + 40, 2)])
    for i in range(start + 40, start + n):
        s.add(msg(i, body=b"x" * 100))
        if i >= start + 45:
            s.ack([f"m{i - 5}"])
    s.flush()


def test_after_a_big_free_relocation_looks_again_after_a_segment_of_growth(tmp_path: Path) -> None:
    """When relocation looks again is counted in bytes appended since the last look, not
    in the journal's size: after a relocation freed most of the journal, the size stayed
    below the mark set at the old peak, and a second held-back chain, half the first,
    was never looked at (the journal's bound was its previous peak, not HOLD_BACK x live)."""
    s = open_store(tmp_path, segment_size=4096)
    _held_back_chain(s, 0, 640)
    s.compact(relocate=100)
    s.flush()
    s.compact(force=True)
    s.flush()
    assert s.relocated == 20 and len(s.journal.segments) <= 4, s.journal.segments
    _held_back_chain(s, 1000, 320)  # half the first chain: below the old peak
    s.compact(force=True)
    s.flush()
    assert len(s.journal.segments) > 8  # held back again
    s.compact(relocate=100)
    s.flush()
    s.compact(force=True)
    s.flush()
    assert s.relocated >= 40, s.relocated  # the new backlog (and what the first relocation wrote)
    assert len(s.journal.segments) <= 4, s.journal.segments
    s.close()
    s2 = open_store(tmp_path)
    kept = [m.id for m in s2.messages_by_destination()["/queue/keep"]]
    assert sorted(kept) == sorted([f"m{i}" for i in range(1, 40, 2)] + [f"m{i}" for i in range(1001, 1040, 2)])
    s2.close()


@pytest.mark.parametrize("where", ["master", "replica"])
def test_compaction_never_resurrects_an_acked_message_that_was_relocated(tmp_path: Path, where: str) -> None:
    """A relocated Enq supersedes the copy in the old segment T; the segment holding the
    new copy (and its ack) must not be deleted while T still exists -- on the store that
    relocated, and on a replica applying its record stream."""
    s = open_store(tmp_path / "master", segment_size=4096)
    stream: list[bytes] = []

    class Tap:
        def on_record(self, record: object, payload: bytes, segment: int) -> None:
            stream.append(payload)

    s.add_listener(Tap())
    s.add(msg(0, body=b"b" * 1950))  # segment 1: b0 stays live (a backlog) ...
    s.add(msg(1, body=b"b" * 1950))  # ... b1 is acked from T
    s.add(msg(2, body=b"m"))  # segment 2 = T: m, the message that gets relocated
    t = s.live["m2"].segment
    assert t == 2
    s.ack(["m1"])  # T refers to segment 1 (still live: b0), so T cannot go
    for i in range(10, 22):  # T: many consumed messages, only m left live
        s.add(msg(i, body=b"x" * 100))
        s.ack([f"m{i}"])
    for i in (30, 31):  # later segments, so T is neither the head nor the one before
        s.add(msg(i, body=b"y" * 3000))
        s.ack([f"m{i}"])
    s.flush()
    assert s.live["m2"].segment == t
    s.compact(relocate=100)  # m's Enq is re-written into the head segment R
    s.flush()
    assert s.relocated == 1
    r = s.live["m2"].segment
    assert r > t and t in s.journal.segments
    s.ack(["m2"])  # acked in R
    s.add(msg(40, body=b"z" * 3000))  # roll: R is no longer the head
    s.flush()
    s.compact(force=True)
    s.flush()
    assert t in s.journal.segments  # T survives (its ack refers to b0's live segment) ...
    s.close()
    path = tmp_path / "master"
    if where == "replica":
        path = tmp_path / "replica"
        replica = open_store(path, segment_size=4096)
        for payload in stream:  # the same records, one batch each, as a slave gets them
            replica.import_payloads([payload])
            replica.flush()
        replica.compact(force=True)  # a slave compacts (without relocating) as it goes
        replica.flush()
        replica.close()
    s2 = open_store(path)
    assert "m2" not in s2.live  # ... and m, acked, must not come back from T's old Enq
    assert sorted(s2.live) == ["m0", "m40"]
    s2.close()


def test_a_record_over_the_recovery_limit_is_never_written(tmp_path: Path) -> None:
    """Recovery cuts a frame longer than its limit off as corruption (with everything
    after it in the segment), so such a record must never be written, nor receipted."""
    s = open_store(tmp_path, max_record=4096)
    done: list[BaseException | None] = []
    s.add(msg(0, body=b"a" * 100), done.append)
    with pytest.raises(RecordTooLarge, match="over the journal's limit of 4096 bytes"):
        s.add(msg(1, body=b"b" * 5000), done.append)
    with pytest.raises(RecordTooLarge):
        s.commit([Enq(msg(i, body=b"t" * 1000)) for i in range(10, 15)], done.append)
    s.add(msg(2, body=b"c" * 100), done.append)
    s.flush()
    assert done == [None, None]  # the refused ones never complete: no receipt
    assert sorted(s.live) == ["m0", "m2"]
    s.close()
    s2 = open_store(tmp_path, max_record=4096)
    assert sorted(s2.live) == ["m0", "m2"]
    s2.close()


def test_a_window_of_keys_bigger_than_a_segment_is_not_rewritten_on_every_pass(tmp_path: Path) -> None:
    """Compaction carries the idempotency keys of a dead segment into the head. When they
    fill more than a segment, the carry itself rolled the head over into a segment of
    nothing but keys, dead at the next pass: every pass re-wrote the whole window, with
    no traffic at all (found by the nemesis: a 64 MiB data tmpfs filled in 17 s while
    checkpoints lagged behind the dead segments; 44 000 keys, 1 MiB segments)."""
    s = open_store(tmp_path, segment_size=16 * 1024, dedupe_max_keys=100_000)
    for i in range(3000):
        s.add(msg(i, key=f"producer-{i}"))
        s.ack([f"m{i}"])
    s.flush()
    s.compact(force=True)  # the traffic's segments go, their keys are carried once
    s.flush()
    s.compact(force=True)
    s.flush()
    written = s.journal.bytes_written
    for _ in range(6):  # nothing new: nothing to re-write
        s.compact(force=True)
        s.flush()
    assert s.journal.bytes_written == written
    assert all(s.is_duplicate("/queue/a", f"producer-{i}") for i in (0, 1500, 2999))
    s.close()
    s2 = open_store(tmp_path, dedupe_max_keys=100_000)  # and the keys survive a restart
    assert all(s2.is_duplicate("/queue/a", f"producer-{i}") for i in (0, 1500, 2999))
    s2.close()


def test_carried_keys_sit_in_a_segment_of_their_own_that_keeps_no_later_segment(tmp_path: Path) -> None:
    """The second keeper of the shared store's growth (docs/chaos.md): compaction carried the
    keys still in the window of the segments it deleted into the head, among the traffic
    that came next; that segment was then mostly keys, kept until they left the window
    (600 s in the nemesis), and the acks of its messages in the next segment refer back to
    it, and so on: no segment after it went, 24 kept at round 43 of an 80-round run. Carried keys now
    get a segment of their own (no message in it, so no ack refers to it), kept while
    they are most of it; the traffic's dead segments go."""
    s = open_store(tmp_path, segment_size=16 * 1024, dedupe_max_keys=100_000)
    i = 0

    def traffic(n: int) -> None:  # keyed sends, each acked 5 messages later (acks in the next segment)
        nonlocal i
        for _ in range(n):
            s.add(msg(i, key=f"producer-{i}"))
            if i >= 5:
                s.ack([f"m{i - 5}"])
            i += 1
        s.flush()

    for _ in range(24):
        traffic(250)
        s.compact(force=True)
        s.flush()
    # what is left: the segments of carried keys, and the newest few of the traffic
    with_messages = [seg for seg in s.journal.segments if s._enqs.get(seg)]
    assert len(with_messages) <= 3, (with_messages, s.journal.segments)
    sizes = s.journal.segment_sizes()
    keys_bytes = sum(len("/queue/a") + len(f"producer-{k}") + 12 for k in range(i))  # a Keys record's
    assert sum(sizes.values()) < keys_bytes + 3 * 16 * 1024, (sizes, keys_bytes)
    assert all(s.is_duplicate("/queue/a", f"producer-{k}") for k in (0, 1500, i - 1))
    live = sorted(s.live)
    s.close()
    s2 = open_store(tmp_path, dedupe_max_keys=100_000)  # and the keys and the live messages survive a restart
    assert all(s2.is_duplicate("/queue/a", f"producer-{k}") for k in (0, 1500, i - 1))
    assert sorted(s2.live) == live
    s2.close()
