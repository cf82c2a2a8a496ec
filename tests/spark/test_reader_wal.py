"""The queue reader's write-ahead log and its redelivery rules, without Spark or a broker.

The subscription here is a scripted stand-in (the broker-backed round trip is in
test_spark_io.py); what is tested is our bookkeeping: what is logged, replayed, acked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from amqtransport.spark.options import parse_reader_options  # noqa: E402
from amqtransport.spark.reader import AmqStreamReader, WalRecord, WriteAheadLog  # noqa: E402


def rec(seq: int, key: str | None = None) -> WalRecord:
    return WalRecord(seq, key or f"k{seq}", "/queue/q", f"m{seq}", f"body{seq}".encode(), {"h": "v"}, False)


def test_wal_append_reload_between_and_ack(tmp_path: Path) -> None:
    wal = WriteAheadLog(str(tmp_path / "w"))
    assert wal.last_seq == 0 and wal.acked_through == 0
    wal.append([rec(1), rec(2), rec(3)])
    again = WriteAheadLog(str(tmp_path / "w"))
    assert [r.seq for r in again.between(0, 3)] == [1, 2, 3]
    assert again.between(1, 2)[0].body == b"body2" and again.between(1, 2)[0].headers == {"h": "v"}
    again.mark_acked(2)
    third = WriteAheadLog(str(tmp_path / "w"))
    assert third.acked_through == 2 and list(third.records) == [3] and "k1" in third.done
    with pytest.raises(RuntimeError, match=r"holds 1 of the 3 messages of offsets \(0, 3\]"):
        third.between(0, 3)


def test_wal_drops_a_torn_last_line_and_appends_cleanly_after_it(tmp_path: Path) -> None:
    wal = WriteAheadLog(str(tmp_path))
    wal.append([rec(1)])
    with open(wal.log_path, "a") as fh:
        fh.write('{"seq": 2, "key": "k2", "de')  # a crash in the middle of an append
    again = WriteAheadLog(str(tmp_path))
    assert list(again.records) == [1]
    again.append([rec(2), rec(3)])
    assert list(WriteAheadLog(str(tmp_path)).records) == [1, 2, 3]


@dataclass
class FakeMsg:
    key: str
    body: bytes = b"x"
    acked: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    destination: str = "/queue/q"
    redelivered: bool = False

    @property
    def idempotency_key(self) -> str:
        return self.key

    @property
    def message_id(self) -> str:
        return "id-" + self.key

    def ack(self) -> None:
        self.acked += 1


class FakeSub:
    def __init__(self) -> None:
        self.queue: list[FakeMsg] = []

    def receive(self, timeout: float | None = None) -> FakeMsg | None:
        return self.queue.pop(0) if self.queue else None


def reader(tmp_path: Path, sub: FakeSub, batch: int = 10) -> AmqStreamReader:
    r = AmqStreamReader(parse_reader_options(
        {"uri": "tcp://127.0.0.1:1", "destination": "q", "walpath": str(tmp_path), "maxbatchsize": str(batch),
         "numpartitions": "2", "receivetimeout": "0"}))
    r._conn, r._sub = object(), sub  # stand-in for the live subscription
    return r


def test_reader_logs_before_planning_acks_only_on_commit(tmp_path: Path) -> None:
    sub = FakeSub()
    msgs = [FakeMsg(f"k{i}") for i in range(5)]
    sub.queue.extend(msgs)
    r = reader(tmp_path, sub, batch=3)
    start = r.initialOffset()
    assert start == {"seq": 0}
    end = r.latestOffset(start, None)
    assert end == {"seq": 3}
    assert len(WriteAheadLog(str(tmp_path)).records) == 3  # durable before partitions()
    parts = r.partitions(start, end)
    rows = [row for p in parts for row in r.read(p)]
    assert [row[4] for row in rows] == ["k0", "k1", "k2"] and len(parts) == 2
    assert all(m.acked == 0 for m in msgs)
    r.commit(end)
    assert [m.acked for m in msgs] == [1, 1, 1, 0, 0]
    assert r.latestOffset(end, None) == {"seq": 5}


def test_redelivery_of_planned_and_of_committed_messages(tmp_path: Path) -> None:
    sub = FakeSub()
    sub.queue.extend([FakeMsg("a"), FakeMsg("b")])
    r = reader(tmp_path, sub)
    end1 = r.latestOffset({"seq": 0}, None)
    r.commit(end1)  # a, b committed and acked
    sub.queue.extend([FakeMsg("c")])
    end2 = r.latestOffset(end1, None)
    assert end2 == {"seq": 3}
    # the query "crashes" before batch 2 commits; a new driver process starts from the WAL
    sub2 = FakeSub()
    b_again, c_again, d = FakeMsg("b"), FakeMsg("c"), FakeMsg("d")
    sub2.queue.extend([b_again, c_again, d])
    r2 = reader(tmp_path, sub2)
    # Spark replays batch 2 from its offset log: served from the WAL
    assert [row[4] for p in r2.partitions(end1, end2) for row in r2.read(p)] == ["c"]
    r2.commit(end2)
    end3 = r2.latestOffset(end2, None)
    assert end3 == {"seq": 4}  # only d is new: b (committed) was acked+dropped, c got a handle
    assert b_again.acked == 1
    assert [row[4] for p in r2.partitions(end2, end3) for row in r2.read(p)] == ["d"]
    r2.commit(end3)
    assert d.acked == 1
    assert json.loads((tmp_path / "acked.json").read_text()) == {"acked_through": 4}


def test_redelivered_planned_message_is_acked_when_its_batch_commits(tmp_path: Path) -> None:
    sub = FakeSub()
    first = FakeMsg("x")
    sub.queue.append(first)
    r = reader(tmp_path, sub)
    end = r.latestOffset({"seq": 0}, None)
    again = FakeMsg("x")  # our connection failed over; the broker redelivers x
    sub.queue.append(again)
    assert r.latestOffset({"seq": 0}, None) == end  # not logged twice
    r.commit(end)
    assert again.acked == 1


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_text = st.text(st.characters(codec="utf-8"), max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2**40), _text, _text, st.binary(max_size=64), st.dictionaries(_text, _text, max_size=4),
       st.booleans())
def test_fuzz_wal_record_round_trip(seq: int, key: str, mid: str, body: bytes, headers: dict[str, str],
                                    redelivered: bool) -> None:
    r = WalRecord(seq, key, "/queue/q", mid, body, headers, redelivered)
    line = r.to_json()
    assert "\n" not in line
    assert WalRecord.from_json(line) == r


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_fuzz_wal_garbage_line_is_a_value_error(line: str) -> None:
    try:
        WalRecord.from_json(line)
    except ValueError:
        pass  # the loader stops at such a line (a torn tail); anything else would crash a restart


@pytest.mark.parametrize("tail", ["[]", "1", '{"seq": 2}', '{"seq": 2, "key": "k", "dest": "d", "mid": "m", '
                                  '"body": "!!", "headers": {}, "redelivered": false}', '{"seq": "x"'])
def test_wal_loader_stops_at_any_bad_tail(tmp_path: Path, tail: str) -> None:
    wal = WriteAheadLog(str(tmp_path))
    wal.append([rec(1)])
    with open(wal.log_path, "a") as fh:
        fh.write(tail + "\n")
    assert list(WriteAheadLog(str(tmp_path)).records) == [1]
