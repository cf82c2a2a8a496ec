"""A node whose disk is full does not die when it cannot write its HA state: it waits.

A replicated master on a small tmpfs: the disk fills, its journal fails, it hands over
to its in-sync slave and tries to rejoin as slave -- which starts by writing
``ha-state.json`` (ENOSPC). Before, that OSError killed the process (the pair stayed
without a slave until someone restarted it); now the node logs it, waits and retries,
and rejoins by itself once there is space again.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ha_helpers import wait_for

import amqtransport
from amqtransport.processes.disk import TmpfsUnavailable, fill, tmpfs
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(150)

MIB = 1 << 20


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    try:
        with tmpfs(tmp_path / "disk", 8 * MIB) as where:
            yield where
    except TmpfsUnavailable as exc:
        pytest.skip(f"full-disk test needs a tmpfs: {exc}")


def _send_raw(port: int, n: int) -> None:
    """Persistent SENDs with receipts on a raw socket; the answers do not matter here, and
    the broker may close the socket (it fences) before the last one is written."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, contextlib.suppress(OSError):
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:0,0\n\n\x00")
        body = b"x" * 4096
        for i in range(n):
            s.sendall(b"SEND\ndestination:/queue/disk\npersistent:true\nreceipt:r%d\ncontent-length:%d\n\n"
                      % (i, len(body)) + body + b"\x00")
        s.settimeout(3)
        while s.recv(65536):
            pass


def test_node_with_a_full_disk_waits_and_rejoins(tmp_path: Path, disk: Path) -> None:
    pair_dir = tmp_path / "pair"
    pair_dir.mkdir()
    (disk / "a").mkdir()
    (pair_dir / "a").symlink_to(disk / "a")
    with BrokerPair("replicated", pair_dir, link_timeout=1.0) as bp:
        filler = fill(disk)
        try:
            _send_raw(bp.a.port, 50)
            assert bp.wait_master(30, exclude=bp.a) is bp.b
            wait_for(lambda: "retrying in 1 s" in bp.a.log_text(), 20, "the node to hit ENOSPC on its state file")
            time.sleep(2.0)
            assert bp.a.alive, "the node died on a full disk:\n" + bp.a.log_text()[-3000:]
            assert "No space left on device" in bp.a.log_text()
        finally:
            filler.unlink()
        assert bp.wait_in_sync(60) is bp.a, bp.describe()
        assert bp.a.alive


def test_shared_store_standby_waits_for_space_instead_of_dying(tmp_path: Path, disk: Path) -> None:
    """Shared store on a full disk: the master fences (exit 3); the standby takes the lock
    and cannot write ``ha-state.json`` (ENOSPC). Before, that OSError killed it too and the
    pair stayed down until someone restarted both; now it lets go of the lock, waits and
    becomes master by itself once there is space, with every receipted message."""
    pair_dir = tmp_path / "pair"
    pair_dir.mkdir()
    (disk / "store").mkdir()
    (pair_dir / "store").symlink_to(disk / "store")
    with BrokerPair("shared-store", pair_dir) as bp:
        assert bp.wait_master(30) is bp.a
        conn = amqtransport.connect(f"tcp://127.0.0.1:{bp.a.port}")
        try:
            for i in range(20):
                conn.send("/queue/disk", f"before-{i}")  # receipted
        finally:
            conn.close()
        filler = fill(disk)
        try:
            _send_raw(bp.a.port, 50)
            wait_for(lambda: not bp.a.alive, 30, "the master to fence on its full disk")
            wait_for(lambda: "No space left on device" in bp.b.log_text(), 30,
                     "the standby to hit ENOSPC on its state file")
            time.sleep(2.0)
            assert bp.b.alive, "the standby died on a full disk:\n" + bp.b.log_text()[-3000:]
            assert "cannot record the new epoch" in bp.b.log_text()
        finally:
            filler.unlink()
        assert bp.wait_master(30) is bp.b, bp.describe()
        conn = amqtransport.connect(f"tcp://127.0.0.1:{bp.b.port}")
        try:
            sub = conn.subscribe("/queue/disk", ack="client-individual")
            got = set()
            while (m := sub.receive(5.0)) is not None:
                got.add(m.text)
                m.ack()
        finally:
            conn.close()
        assert {f"before-{i}" for i in range(20)} <= got
