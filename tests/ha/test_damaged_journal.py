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

        conn = amqtransport.connect(f"tcp://127.0.0.1:{slave.port}")
        try:
            sub = conn.subscribe(QUEUE, ack="client-individual")
            got = []
            while (m := sub.receive(5.0)) is not None:
                got.append(int(m.headers["seq"]))
                m.ack()
        finally:
            conn.close()
        assert got == list(range(N)), f"missing {sorted(set(range(N)) - set(got))[:10]}"
