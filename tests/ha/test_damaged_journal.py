"""In a pair, a node whose journal is damaged does not serve it: it resyncs from its
peer, and the pair ends with every receipted message (issue 23).

A bit flipped in a stopped master's journal, both nodes down without a goodbye (both
hold a synced copy of the same epoch). Before: the old master had the better claim (it
was master last, and is the configured one), came up as master, skipped the damaged
record and served without that message; the slave resynced from it, so the pair lost
it for good. Now a replicated node reads its journal before it claims anything: the
damaged one claims less than its peer's undamaged copy of the same epoch, the peer
becomes master and the damaged node joins it as slave (its journal kept in
``quarantine/``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(240)

QUEUE = "/queue/damaged-pair"
N = 200
FLIPPED = 100


def body(i: int) -> str:
    return f"pair-{i:05d}|" * 60


def flip_a_bit_in(data_dir: Path, i: int) -> Path:
    for seg in sorted((data_dir / "journal").glob("seg-*.log")):
        raw = bytearray(seg.read_bytes())
        at = raw.find(f"pair-{i:05d}|".encode())
        if at >= 0:
            raw[at + 300] ^= 0x10
            seg.write_bytes(bytes(raw))
            return seg
    raise AssertionError(f"message {i} is not in {data_dir}/journal")


def connect(port: int) -> amqtransport.Connection:
    """A connection to the master's client port (closed for a moment while a master
    that lost its slave checks its peer: tried again until it answers)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return amqtransport.connect(f"tcp://127.0.0.1:{port}")
        except amqtransport.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def drain(port: int) -> list[int]:
    conn = connect(port)
    try:
        sub = conn.subscribe(QUEUE, ack="client-individual")
        got = []
        while (m := sub.receive(5.0)) is not None:
            got.append(int(m.headers["seq"]))
            m.ack()
    finally:
        conn.close()
    return got


def send(port: int, seqs: range) -> None:
    conn = connect(port)
    try:
        for i in seqs:
            conn.send(QUEUE, body(i), headers={"seq": str(i)})  # receipted
    finally:
        conn.close()


def test_a_node_with_a_damaged_journal_resyncs_from_its_peer_and_no_receipted_message_is_lost(
        tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path / "pair", link_timeout=1.0) as pair:
        master = pair.wait_master()
        slave = pair.wait_in_sync()
        conn = amqtransport.connect(f"tcp://127.0.0.1:{master.port}")
        try:
            for i in range(N):
                conn.send(QUEUE, body(i), headers={"seq": str(i)})  # receipted: on both disks
        finally:
            conn.close()
        slave.kill()  # no goodbye: its copy stays synced
        master.kill()
        flip_a_bit_in(master.data_dir, FLIPPED)

        master.start()  # alone it waits for its peer (a slave had synced from it)
        slave.start()
        assert pair.wait_master(60) is slave, pair.describe()
        assert pair.wait_in_sync(60) is master, pair.describe()
        assert "journal damaged" in master.log_text()
        assert list((master.data_dir / "quarantine").glob("*/journal/seg-*.log")), "the damaged journal was not kept"

        got = drain(slave.port)
        assert got == list(range(N)), f"missing {sorted(set(range(N)) - set(got))[:10]}"


def test_a_resynced_slave_records_its_segments_so_losing_its_newest_is_seen(tmp_path: Path) -> None:
    """A slave's journal (a full sync streamed into it, then the live stream) records
    every segment it creates (store/chain.py ``top``), as a standalone broker's does.
    Before: its newest segments deleted, `amq broker verify` found nothing wrong and the
    node would claim a copy it no longer had. Now verify names them, and the node resyncs
    from its peer; the pair ends with every receipted message."""
    import subprocess
    import sys

    cfg = tmp_path / "broker.toml"
    cfg.write_text("[broker]\nsegment_size = 65536\n")
    with BrokerPair("replicated", tmp_path / "pair", link_timeout=1.0, extra_args=["--config", str(cfg)]) as pair:
        master = pair.wait_master()
        slave = pair.wait_in_sync()
        slave.kill()
        send(master.port, range(N // 2))  # receipted by the master alone
        slave.start()  # a full sync streams the master's store into a fresh journal
        assert pair.wait_in_sync(60) is slave, pair.describe()
        send(master.port, range(N // 2, N))  # the live stream: the slave's journal rolls to new segments
        slave.kill()  # no goodbye: its copy stays synced
        master.kill()
        segs = sorted((slave.data_dir / "journal").glob("seg-*.log"))
        with_data = [s for s in segs if b"pair-" in s.read_bytes()]
        assert len(with_data) >= 2, [s.name for s in segs]
        victims = segs[segs.index(with_data[-1]):]
        for v in victims:
            v.unlink()
        v = subprocess.run([sys.executable, "-m", "amqtransport", "broker", "verify", str(slave.data_dir)],
                           capture_output=True, text=True, timeout=120, check=False)
        assert v.returncode == 1 and f"MISSING {len(victims)} segments" in v.stdout, v.stdout

        master.start()
        slave.start()
        assert pair.wait_master(60) is master, pair.describe()
        assert pair.wait_in_sync(60) is slave, pair.describe()
        assert "journal damaged" in slave.log_text() and "missing" in slave.log_text()

        got = drain(master.port)
        assert got == list(range(N)), f"missing {sorted(set(range(N)) - set(got))[:10]}"
