"""A node whose disk is full does not die when it cannot write its HA state: it waits.

A replicated master on a small tmpfs: the disk fills, its journal fails, it hands over
to its in-sync slave and tries to rejoin as slave -- which starts by writing
``ha-state.json`` (ENOSPC). Before, that OSError killed the process (the pair stayed
without a slave until someone restarted it); now the node logs it, waits and retries,
and rejoins by itself once there is space again.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ha_helpers import wait_for

from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.disk import TmpfsUnavailable, fill, tmpfs

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
    """Persistent SENDs with receipts on a raw socket; the answers do not matter here."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:0,0\n\n\x00")
        body = b"x" * 4096
        for i in range(n):
            s.sendall(b"SEND\ndestination:/queue/disk\npersistent:true\nreceipt:r%d\ncontent-length:%d\n\n"
                      % (i, len(body)) + body + b"\x00")
        s.settimeout(3)
        try:
            while s.recv(65536):
                pass
        except OSError:
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
