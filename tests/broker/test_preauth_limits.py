"""Peers that never log in cannot make the broker hold much, nor take every slot.

Real broker processes. Issue 23, defect 2: 80 sockets each sending an unfinished
9.5 MiB CONNECT frame grew a broker from 38 to 798 MiB (none of it counted anywhere),
and unauthenticated connections could fill ``max_connections``. Now a frame before
CONNECTED is at most ``max_connect_frame_size`` (64 KiB) and at most
``max_unauthenticated`` connections may be waiting to log in.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import pytest

import amqtransport
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_unfinished_connect_frames_are_not_held(tmp_path: Path) -> None:
    """20 sockets each write 5 MiB of a CONNECT frame that never ends: the broker closes
    each after 64 KiB instead of buffering 100 MiB."""
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        before = _rss(bp.pid)
        socks = []
        chunk = b"x" * (256 * 1024)
        try:
            for _ in range(20):
                sock = socket.create_connection(("127.0.0.1", bp.port), timeout=5)
                socks.append(sock)
                with contextlib.suppress(OSError):  # the broker may close it on the way
                    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n")
                    for _ in range(20):
                        sock.sendall(chunk)
            time.sleep(1.0)
            grown = _rss(bp.pid) - before
        finally:
            for sock in socks:
                sock.close()
        assert grown < 40 * MiB, f"the broker holds {grown / MiB:.0f} MiB more for 20 unfinished CONNECT frames"
        with amqtransport.connect(bp.uri) as c:  # and it serves on
            c.send("/queue/preauth", "ok")


def test_connections_not_logged_in_cannot_take_every_slot(tmp_path: Path) -> None:
    """max_connections 40, max_unauthenticated 10: 50 sockets that connect and say
    nothing; a client that logs in is still served (the silent connection waiting
    longest makes room each time). Before: the first 40 took every slot and the client
    was refused."""
    config = tmp_path / "broker.toml"
    config.write_text("max_connections = 40\nmax_unauthenticated = 10\n")
    with BrokerProcess(tmp_path / "data", args=["--config", str(config)], log_dir=tmp_path) as bp:
        silent = [socket.create_connection(("127.0.0.1", bp.port), timeout=5) for _ in range(50)]
        try:
            time.sleep(0.5)  # the broker has accepted (and refused) them all
            with amqtransport.connect(bp.uri) as c:
                c.send("/queue/preauth", "served")
            answers = []
            for sock in silent:
                sock.settimeout(0.2)
                with contextlib.suppress(TimeoutError):
                    answers.append(sock.recv(4096))
            named = sum(1 for a in answers if b"max_unauthenticated=10" in a)
            assert len(answers) >= 40 and all(a.startswith(b"ERROR") for a in answers), answers[:3]
            assert named >= 10, f"only {named} ERRORs name max_unauthenticated"
        finally:
            for sock in silent:
                sock.close()


def test_a_frame_that_never_ends_is_dropped(tmp_path: Path) -> None:
    """A logged-in client (no heart-beats) starts a SEND and stops sending: dropped after
    frame_timeout_ms with an ERROR naming it. Before: held until the client went away."""
    config = tmp_path / "broker.toml"
    config.write_text("frame_timeout_ms = 1000\n")
    with BrokerProcess(tmp_path / "data", args=["--config", str(config)], log_dir=tmp_path) as bp:
        sock = socket.create_connection(("127.0.0.1", bp.port), timeout=10)
        with sock:
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:0,0\n\n\x00")
            assert sock.recv(4096).startswith(b"CONNECTED")
            sock.sendall(b"SEND\ndestination:/queue/slow\ncontent-length:100000\n\n" + b"x" * 1000)
            data = b""
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            assert data.startswith(b"ERROR") and b"frame_timeout_ms=1000" in data, data
