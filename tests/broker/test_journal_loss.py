"""A journal segment that is gone is noticed, and the broker refuses to start on it (issue 23).

Segment ids only grow and compaction deletes dead ones in any order, so the journal
keeps a durable record of what compaction deleted (``journal/deleted-segments``,
store/chain.py): a gap it does not name is a loss. So is what a checkpoint proves: a
segment it knew that is gone. Before: a segment deleted mid-journal went unnoticed
without a checkpoint, and with one the broker warned ("the checkpoint is stale" or "its
segment N is gone"), replayed what was left and served without the lost messages. Now
it refuses to start, naming the files and ``amq broker verify`` / ``repair``; ``repair``
quarantines the checkpoint, notes the loss in ``LOST.txt`` and records it, and the
broker then starts knowingly with every message it still has. A legitimately compacted
journal (gaps compaction made) starts as before."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from broker_helpers import StompPy, drain
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.broker.store.chain import CHAIN_FILE, Chain, read_chain, write_chain
from amqtransport.testing.broker_process import BrokerProcess
from amqtransport.testing.ports import free_port

pytestmark = pytest.mark.timeout(240)

KEEP, GONE = "/queue/keep", "/queue/gone"
CONFIG = "[broker]\nsegment_size = 65536\ncompact_interval_ms = 100\n"


def amq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "amqtransport", "broker", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def body(queue: str, i: int) -> str:
    return f"{queue}-{i:05d}|" * 150  # ~2 KB: about 30 messages a segment


def segments(data: Path) -> list[Path]:
    return sorted((data / "journal").glob("seg-*.log"))


def holding(seg: Path, queue: str, n: int) -> set[int]:
    raw = seg.read_bytes()
    return {i for i in range(n) if f"{queue}-{i:05d}|".encode() in raw}


def run_broker(data: Path, cfg: Path) -> tuple[int, str]:
    """``amq broker run`` on a journal it must refuse: its exit code and stderr (fails at
    once if it serves instead)."""
    proc = subprocess.Popen([sys.executable, "-m", "amqtransport", "broker", "run", "--data-dir", str(data),
                             "--port", str(free_port()), "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()  # the listening line, or EOF when it exits
        if line.startswith("listening"):
            pytest.fail(f"the broker started on a journal that lost records: {line}")
        return proc.wait(timeout=120), proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_a_segment_deleted_mid_journal_refuses_the_start_until_repair_records_the_loss(tmp_path: Path) -> None:
    data, cfg = tmp_path / "data", tmp_path / "broker.toml"
    cfg.write_text(CONFIG)
    bp = BrokerProcess(data, args=["--config", str(cfg)], log_dir=tmp_path / "logs")
    try:
        bp.start()
        c = StompPy(bp.port)
        c.wait_receipts([c.send(KEEP, body(KEEP, i), seq=str(i)) for i in range(40)], timeout=60)
        c.wait_receipts([c.send(GONE, body(GONE, i), seq=str(i)) for i in range(100)], timeout=60)
        c.wait_receipts([c.send(KEEP, body(KEEP, i), seq=str(i)) for i in range(40, 200)], timeout=60)
        c.close()
        assert sorted(drain(bp.port, GONE)) == list(range(100))
        # compaction deletes the segments that held only /queue/gone: a legitimate gap
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ids = [int(p.name[4:-4]) for p in segments(data)]
            if len(ids) < max(ids) - min(ids) + 1:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"compaction deleted no segment in the middle: {[p.name for p in segments(data)]}")
        bp.kill()  # no checkpoint at close
        bp.start()  # a compacted journal starts as before
        assert "missing" not in bp.log_text()
        bp.kill()

        # now a segment holding receipted messages vanishes: neither the last nor the first
        segs = segments(data)
        victim = next(s for s in segs[1:-1] if holding(s, KEEP, 200))
        lost = holding(victim, KEEP, 200)
        victim.unlink()

        code, err = run_broker(data, cfg)
        assert code == 1, err
        assert victim.name in err and "amq broker verify" in err and "amq broker repair" in err, err

        v = amq("verify", str(data))
        assert v.returncode == 1 and "MISSING 1 segments" in v.stdout and victim.name in v.stdout, v.stdout

        rep = amq("repair", str(data))
        assert rep.returncode == 0, rep.stdout + rep.stderr
        notes = list((data / "journal" / "quarantine").glob("*/LOST.txt"))
        assert len(notes) == 1 and victim.name in notes[0].read_text()
        assert amq("verify", str(data)).returncode == 0

        bp.start()  # knowingly, without the lost segment's messages: every other one is there
        assert sorted(drain(bp.port, KEEP)) == [i for i in range(200) if i not in lost]
    finally:
        bp.kill()


def test_a_checkpoint_that_proves_loss_refuses_the_start(tmp_path: Path) -> None:
    """The newest segment with records cut short leaves every segment there; the
    checkpoint taken at the clean stop knew how long it was. Before: the checkpoint was
    refused as another journal's, the broker replayed what was left and served without
    the messages cut off."""
    data, cfg = tmp_path / "data", tmp_path / "broker.toml"
    cfg.write_text(CONFIG)
    bp = BrokerProcess(data, args=["--config", str(cfg)], log_dir=tmp_path / "logs")
    try:
        bp.start()
        c = StompPy(bp.port)
        c.wait_receipts([c.send(KEEP, body(KEEP, i), seq=str(i)) for i in range(100)], timeout=60)
        c.close()
        assert bp.terminate() == 0  # a checkpoint at close
        assert (data / "journal" / "checkpoint").exists()
        victim = [s for s in segments(data) if holding(s, KEEP, 100)][-1]
        held = holding(victim, KEEP, 100)
        with open(victim, "r+b") as fh:
            fh.truncate(victim.stat().st_size // 2)
        lost = held - holding(victim, KEEP, 100)
        assert lost

        code, err = run_broker(data, cfg)
        assert code == 1, err
        assert "checkpoint proves records lost" in err and "amq broker repair" in err, err

        v = amq("verify", str(data))
        assert v.returncode == 1 and "PROVES LOSS" in v.stdout, v.stdout
        assert amq("repair", str(data)).returncode == 0
        assert list((data / "journal" / "quarantine").glob("*/checkpoint"))
        bp.start()
        got = set(drain(bp.port, KEEP))
        assert set(range(100)) - held <= got and not got & lost, sorted(set(range(100)) - got)
    finally:
        bp.kill()


def test_the_newest_segments_deleted_after_a_crash_refuse_the_start_until_repair_records_the_loss(
        tmp_path: Path) -> None:
    """Losing the newest segments leaves no gap, and after a SIGKILL there is no
    checkpoint to prove it. Before: the broker started on what was left and served
    without their messages, silently. Now the writer records every segment it creates
    (``top`` in journal/deleted-segments) before it writes into it, so they are missing."""
    data, cfg = tmp_path / "data", tmp_path / "broker.toml"
    cfg.write_text(CONFIG + "checkpoint_interval = 0\n")
    bp = BrokerProcess(data, args=["--config", str(cfg)], log_dir=tmp_path / "logs")
    try:
        bp.start()
        c = StompPy(bp.port)
        c.wait_receipts([c.send(KEEP, body(KEEP, i), seq=str(i)) for i in range(150)], timeout=60)
        c.close()
        bp.kill()
        assert not (data / "journal" / "checkpoint").exists()
        with_data = [s for s in segments(data) if holding(s, KEEP, 150)]
        assert len(with_data) >= 3, [s.name for s in segments(data)]
        victims = segments(data)[segments(data).index(with_data[-2]):]  # the two newest holding records, and after
        lost = set().union(*(holding(v, KEEP, 150) for v in victims))
        for v in victims:
            v.unlink()

        code, err = run_broker(data, cfg)
        assert code == 1, err
        assert all(v.name in err for v in victims) and "amq broker repair" in err, err
        v = amq("verify", str(data))
        assert v.returncode == 1 and f"MISSING {len(victims)} segments" in v.stdout, v.stdout

        rep = amq("repair", str(data))
        assert rep.returncode == 0, rep.stdout + rep.stderr
        assert "the loss is recorded" in rep.stdout, rep.stdout
        notes = list((data / "journal" / "quarantine").glob("*/LOST.txt"))
        assert len(notes) == 1 and all(v.name in notes[0].read_text() for v in victims)
        bp.start()
        assert sorted(drain(bp.port, KEEP)) == [i for i in range(150) if i not in lost]
        assert all(not v.exists() for v in victims), "a lost segment's id was used again"
    finally:
        bp.kill()


# ---------------------------------------------------------------------- the record, in process
def test_a_journal_whose_record_predates_top_starts_and_records_its_next_segments(tmp_path: Path) -> None:
    """A data directory written before the record kept the highest id: its newest
    segment gone proves nothing (no false refusal); from the next start on, every
    segment created is recorded, so losing the newest then refuses."""
    import json
    import zlib

    from amqtransport.broker.store import Ack, Journal, encode
    from amqtransport.broker.store.chain import SegmentsLost

    def journal() -> Journal:
        j = Journal(tmp_path / "j", segment_size=4096)
        list(j.recover())
        j.start()
        return j

    j = journal()
    for i in range(200):
        j.append([encode(Ack((f"x{i:04d}" * 20,)))])
    assert j.flush(30)
    j.close()
    ids = sorted(int(p.name[4:-4]) for p in (tmp_path / "j").glob("seg-*.log"))
    assert len(ids) >= 3
    chain = read_chain(tmp_path / "j")
    assert chain is not None and chain.top == ids[-1]
    body = json.dumps({"floor": chain.floor, "deleted": sorted(chain.ids), "journal": chain.journal})
    (tmp_path / "j" / CHAIN_FILE).write_text(json.dumps({"chain": body, "crc": zlib.crc32(body.encode())}))
    (tmp_path / "j" / f"seg-{ids[-1]:010d}.log").unlink()  # a record without top: nothing proved

    j = journal()  # starts, and records the head it creates
    head = j.head
    j.close()
    chain = read_chain(tmp_path / "j")
    assert chain is not None and chain.top == head
    (tmp_path / "j" / f"seg-{head:010d}.log").unlink()
    j = Journal(tmp_path / "j")
    try:
        with pytest.raises(SegmentsLost, match=f"seg-{head:010d}.log"):
            j.check_chain()
    finally:
        j.close()



@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_read_chain_never_raises_and_trusts_only_an_intact_record(raw: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / CHAIN_FILE).write_bytes(raw)
        got = read_chain(Path(d))
        assert got is None or isinstance(got, Chain)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=60), max_size=40), st.integers(min_value=1, max_value=60),
       st.integers(min_value=1, max_value=60))
def test_deletes_compaction_recorded_are_never_a_gap_and_any_other_is(deleted: list[int], head: int, extra: int) -> None:
    ids = list(range(1, head + 1))
    chain = Chain().plus(d for d in deleted if d < head)
    existing = [s for s in ids if s not in chain]
    assert chain.missing(existing) == []
    assert Chain.of(existing).missing(existing) == []
    if extra in existing and extra != max(existing):
        assert chain.missing([s for s in existing if s != extra]) == [extra]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["floor", "deleted", "journal", "top", "x"]),
                       st.one_of(st.integers(min_value=-5, max_value=80), st.text(max_size=5),
                                 st.lists(st.integers(min_value=-5, max_value=80), max_size=5), st.none())))
def test_read_chain_checks_every_field_of_a_record_whose_checksum_holds(fields: dict[str, object]) -> None:
    import json
    import tempfile
    import zlib

    body = json.dumps(fields)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / CHAIN_FILE).write_text(json.dumps({"chain": body, "crc": zlib.crc32(body.encode())}))
        got = read_chain(Path(d))
        if got is not None:  # only a record that makes sense is trusted
            assert got.floor >= 1 and got.top >= 0 and all(s >= got.floor for s in got.ids)
            assert got.missing([]) == [s for s in range(got.floor, got.top + 1) if s not in got.ids]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=60), max_size=40), st.integers(min_value=1, max_value=60),
       st.integers(min_value=0, max_value=5))
def test_the_newest_segments_gone_are_missing_and_the_record_round_trips(deleted: list[int], head: int,
                                                                         newest: int) -> None:
    import tempfile

    chain = Chain()
    for seg in range(1, head + 1):
        chain = chain.created(seg)
    chain = chain.plus(d for d in deleted if d < head)
    with tempfile.TemporaryDirectory() as d:
        write_chain(Path(d), chain, fsync=False)
        assert read_chain(Path(d)) == chain
    existing = [s for s in range(1, head + 1) if s not in chain]
    gone = existing[len(existing) - newest:] if newest else []
    assert chain.missing(existing) == []
    assert chain.missing([s for s in existing if s not in gone]) == gone
    old = Chain(chain.floor, chain.ids, chain.journal)  # a record from before ``top`` was kept
    assert old.missing([s for s in existing if s not in gone]) == []  # nothing known: no false refusal
