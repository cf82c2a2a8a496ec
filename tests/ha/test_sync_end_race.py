"""A replication link lost after the slave's full sync ended but before the master heard so.

The slave counts its copy complete (``synced``: it may take over) once the master's
``SYNC_END`` is durable on its disk, and then acks it; the master counts the slave in
sync when that ack arrives. A link that died in between left the two disagreeing: the
master dropped it as a slave lost during its full sync -- one that cannot take over --
and receipted alone without asking it to stand by, while the slave, its copy marked
complete, took over later without those receipts. Seen in a 200-round nemesis run
without a witness (issue 24, round 80 of ``--seed 20261126``): the master was isolated
right after its slave re-linked, receipted alone once the partition healed, was frozen,
and the slave took over with its copy of the moment of the partition: seven receipted
messages lost, six durable acknowledgements undone.

The forwarder freezes the replication link right after ``SYNC_END`` and keeps the
slave's end alive with PINGs, so the slave notices nothing until the test cuts it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ha_helpers import forwarded_pair, raw_connect, read_frames, wait_for

import amqtransport

pytestmark = pytest.mark.timeout(150)

QUEUE = "/queue/sync-end"


def receipted_send(port: int, body: str, within: float) -> bool:
    """SEND ``body`` to the node's client port on a fresh raw connection: did its RECEIPT
    come within ``within`` seconds? (A node holding receipts closes its client port.)"""
    try:
        sock = raw_connect(port)
    except (OSError, AssertionError):
        return False
    with sock:
        try:
            sock.sendall(f"SEND\ndestination:{QUEUE}\npersistent:true\nreceipt:r1\n\n{body}\x00".encode())
        except OSError:
            return False
        frames, _closed = read_frames(sock, time.monotonic() + within)
    return any(f.startswith(b"RECEIPT") for f in frames)


def test_a_link_lost_right_after_sync_end_is_a_lost_synced_slave(tmp_path: Path) -> None:
    with forwarded_pair(tmp_path, link_timeout=1.0) as (bp, fwd):
        bp.start()
        with amqtransport.connect(bp.a.uri) as c:
            for i in range(10):
                c.send(QUEUE, f"before-{i}")
        # b leaves with a goodbye (a receipts alone meanwhile) and joins again: a full sync
        # through the forwarder, frozen right after SYNC_END
        bp.b.terminate()
        dropped = bp.a.log_text().count("dropping slave b")
        fwd.trap_sync_end()
        bp.b.start()
        assert fwd.trapped.wait(30), "the full sync never reached SYNC_END"
        wait_for(lambda: bp.a.log_text().count("dropping slave b") > dropped, 30,
                 "the master dropping the silent link")
        # b's copy counts as complete on its side; its link is up as far as it knows
        assert bp.b.status().get("amq-ha-synced") == "true", bp.b.status()
        # what the master receipts now must be on b, which may take over: it must not
        # receipt alone (b never agreed to stand by; b answers that it is in sync)
        receipted = receipted_send(bp.a.port, "after", within=3.0)
        bp.a.kill()
        fwd.cut()  # b's link ends now: the master is gone, b takes over
        assert bp.wait_master(60, exclude=bp.a) is bp.b
        got: set[str] = set()
        with amqtransport.connect(bp.b.uri) as c:
            sub = c.subscribe(QUEUE, ack="client-individual")
            while (m := sub.receive(timeout=3)) is not None:
                got.add(m.text)
                m.ack()
        assert {f"before-{i}" for i in range(10)} <= got, got
        if receipted:
            assert "after" in got, (
                "the master receipted 'after' alone after a link to a slave that had synced "
                f"was lost, and the slave took over without it (got {sorted(got)})\n"
                + bp.a.log_text()[-3000:]
            )
