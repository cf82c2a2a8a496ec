"""Recovery never destroys what it could read (issue 23, item 3), for real: a bit
flipped in the middle of a stopped broker's journal, then a restart, ``amq broker
verify`` and ``amq broker repair``.

Before: recovery truncated the segment at the bad record, so every receipted message
written after it was lost and every ACK written after it undone (acked messages came
back); now it skips the damaged record alone, names it in the log, and the offline
commands report and salvage (the original kept in ``journal/quarantine/``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import requests
from broker_helpers import StompPy, drain
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.broker.store.records import Ack, encode
from amqtransport.broker.store.salvage import Damage, TornTail, ZeroTail, scan_with_damage
from amqtransport.broker.store.segments import FRAME, MAGIC
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.broker_process import BrokerProcess
from amqtransport.testing.ports import free_port

pytestmark = pytest.mark.timeout(180)

QUEUE = "/queue/damage"
N = 300
ACKED = 100  # the first ones, consumed and acked before the kill
FLIPPED = 150


def amq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "amqtransport", "broker", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def body(i: int) -> str:
    return f"body-{i:06d}-" * 100


def fill_and_kill(bp: BrokerProcess) -> None:
    c = StompPy(bp.port)
    c.wait_receipts([c.send(QUEUE, body(i), seq=str(i)) for i in range(N)], timeout=60)
    c.conn.subscribe(QUEUE, id="1", ack="client-individual", headers={"activemq.prefetchSize": str(ACKED)})
    for m in c.get_n(ACKED, timeout=30):
        assert int(m.headers["seq"]) < ACKED
        c.conn.ack(m.headers["ack"], receipt=f"a{m.headers['seq']}")
    c.wait_receipts([f"a{i}" for i in range(ACKED)])
    c.close()
    bp.kill()  # kill -9: no checkpoint at close, the whole journal is replayed


def flip_a_bit_in(data_dir: Path, i: int) -> Path:
    segs = sorted((data_dir / "journal").glob("seg-*.log"))
    for seg in segs:
        raw = bytearray(seg.read_bytes())
        at = raw.find(f"body-{i:06d}-".encode())
        if at >= 0:
            raw[at + 500] ^= 0x10
            seg.write_bytes(bytes(raw))
            return seg
    raise AssertionError(f"message {i} not found in {segs}")


def test_a_flipped_bit_mid_journal_loses_that_record_alone_and_verify_and_repair_salvage(tmp_path: Path) -> None:
    data, copy = tmp_path / "data", tmp_path / "copy"
    http = free_port()
    bp = BrokerProcess(data, args=["--http", f"127.0.0.1:{http}"], log_dir=tmp_path / "logs")
    try:
        bp.start()
        fill_and_kill(bp)
        seg = flip_a_bit_in(data, FLIPPED)
        before = seg.read_bytes()
        shutil.copytree(data, copy)
        expected = [i for i in range(ACKED, N) if i != FLIPPED]

        v = amq("verify", str(data))
        assert v.returncode == 1, v.stdout + v.stderr
        assert "DAMAGED (1 regions)" in v.stdout and seg.name in v.stdout
        assert "checksum mismatch" in v.stdout and f"to {QUEUE}" in v.stdout, v.stdout
        assert seg.read_bytes() == before  # verify changes nothing

        bp.start()  # recovery skips the damaged record, names it, and reads on
        log = bp.log_text()
        assert "bytes skipped" in log and f"to {QUEUE}" in log, log[-2000:]
        after = seg.read_bytes()  # it truncated nothing written: at most the preallocated zeros after the data
        assert after == before[: len(after)] and not before[len(after):].strip(b"\0")
        metrics = requests.get(f"http://127.0.0.1:{http}/metrics", timeout=10).text
        assert "\namq_journal_damaged_regions 1\n" in metrics
        got = drain(bp.port, QUEUE)
        # every other receipted message is there, in order, and no acked one came back
        assert got == expected, f"missing {sorted(set(expected) - set(got))[:10]}, extra {sorted(set(got) - set(expected))[:10]}"
        assert bp.terminate() == 0

        r = amq("repair", str(copy))  # the same damage, repaired offline before a start
        assert r.returncode == 0, r.stdout + r.stderr
        quarantined = list((copy / "journal" / "quarantine").glob(f"*/{seg.name}"))
        assert len(quarantined) == 1 and quarantined[0].read_bytes() == before
        v = amq("verify", str(copy))
        assert v.returncode == 0 and "no damage" in v.stdout, v.stdout
        repaired = BrokerProcess(copy, log_dir=tmp_path / "logs2")
        try:
            repaired.start()
            assert "bytes skipped" not in repaired.log_text()
            assert drain(repaired.port, QUEUE) == expected
        finally:
            repaired.kill()
    finally:
        bp.kill()


def test_verify_and_repair_name_what_is_wrong_with_their_argument(tmp_path: Path) -> None:
    v = amq("verify", str(tmp_path))
    assert v.returncode == 2 and "no journal in" in v.stderr
    (tmp_path / "journal").mkdir()
    v = amq("verify", str(tmp_path))
    assert v.returncode == 0 and "0 segments" in v.stdout and "no damage" in v.stdout


# ---------------------------------------------------------------------- the scan, in process
def _frames(payloads: list[bytes]) -> bytes:
    return MAGIC + b"".join(FRAME.pack(len(p), zlib.crc32(p)) + p for p in payloads)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000), st.booleans())
def test_scan_with_damage_never_raises_and_accounts_for_every_byte(data: bytes, last: bool) -> None:
    view = memoryview(MAGIC + data)
    at = len(MAGIC)
    for item in scan_with_damage(view, 1, len(MAGIC), 1 << 20, last=last):
        if isinstance(item, tuple):
            offset, payload, _rec = item
            assert offset == at
            at = offset + FRAME.size + len(payload)
        elif isinstance(item, Damage):
            assert item.offset == at < item.end <= len(view)
            at = item.end
        elif isinstance(item, ZeroTail):  # the clean end of a preallocated segment: only zeros after it
            assert item.offset == at and not bytes(view[at:]).strip(b"\0")
            at = len(view)
        else:
            assert isinstance(item, TornTail) and last and item.offset == at
            at = len(view)
    assert at == len(view)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=2, max_value=40), st.data())
def test_one_flipped_byte_loses_only_the_frames_of_one_damaged_region(n: int, data: st.DataObject) -> None:
    """Every frame outside one damaged region around the flipped byte is read back; the
    region starts where the touched frame does (a flipped length may make it reach
    further, never make it start elsewhere)."""
    records = [encode(Ack((f"ID:m-{i}",), "/queue/a")) for i in range(n)]
    starts, at = [], len(MAGIC)
    for p in records:
        starts.append(at)
        at += FRAME.size + len(p)
    raw = bytearray(_frames(records))
    where = data.draw(st.integers(min_value=len(MAGIC), max_value=len(raw) - 1))
    raw[where] ^= data.draw(st.integers(min_value=1, max_value=255))
    touched = max(i for i, s in enumerate(starts) if s <= where)
    items = list(scan_with_damage(memoryview(bytes(raw)), 1, len(MAGIC), 1 << 20, last=False))
    damage = [d for d in items if isinstance(d, Damage)]
    read = {item[0] for item in items if isinstance(item, tuple)}
    assert len(damage) == 1 and damage[0].offset == starts[touched]
    assert all(s in read for s in starts if s < damage[0].offset or s >= damage[0].end)
    assert not any(damage[0].offset <= s < damage[0].end for s in read)


def test_a_corrupt_record_on_a_running_master_does_not_block_the_slaves_resync(tmp_path: Path) -> None:
    """Before: every full sync failed reading it ('full sync failed reading the journal'),
    and the slave was never in sync again for as long as the record lived."""
    with BrokerPair("replicated", tmp_path / "pair", link_timeout=1.0) as pair:
        master = pair.wait_master()
        slave = pair.wait_in_sync()
        c = StompPy(master.port)
        c.wait_receipts([c.send(QUEUE, body(i), seq=str(i)) for i in range(100)], timeout=60)
        c.close()
        flip_a_bit_in(master.data_dir, 50)  # bits change under the running master
        slave.kill()
        slave.start()
        assert pair.wait_in_sync(timeout=30) is slave
        # the master still holds that message in memory: the replica gets it from there
        assert "cannot be read back" in master.log_text() and "sent to the replica from memory" in master.log_text()
        master.kill()
        assert pair.wait_master(timeout=30) is slave
        assert drain(slave.port, QUEUE) == list(range(100))
