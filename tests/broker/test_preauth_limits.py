"""Peers that never log in cannot make the broker hold much, nor take every slot.

Real broker processes. Issue 23, defect 2: 80 sockets each sending an unfinished
9.5 MiB CONNECT frame grew a broker from 38 to 798 MiB (none of it counted anywhere),
and unauthenticated connections could fill ``max_connections``. Now a frame before
CONNECTED is at most ``max_connect_frame_size`` (64 KiB) and at most
``max_unauthenticated`` connections may be waiting to log in.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

import amqtransport
from amqtransport.testing.broker_process import BrokerProcess
from amqtransport.testing.ports import free_port

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


def _metric(http: int, name: str) -> int:
    text = requests.get(f"http://127.0.0.1:{http}/metrics", timeout=10).text
    m = re.search(rf"^{name} (\d+)$", text, re.M)
    assert m is not None, f"no {name} in /metrics"
    return int(m.group(1))


def _wait_metric(http: int, name: str, ok: Callable[[int], bool], what: str) -> int:
    deadline = time.monotonic() + 30
    while True:
        value = _metric(http, name)
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"{name} = {value}: {what}"
        time.sleep(0.05)


def test_bytes_buffered_before_login_count_in_memory_and_have_a_budget(tmp_path: Path) -> None:
    """Sockets each send 40 KB of a CONNECT frame that does not end: the broker counts the
    bytes in its memory usage (``amq_memory_preauth_bytes``, part of
    ``amq_memory_usage_bytes``) and closes the connection whose bytes would take the total
    past ``max_unauthenticated_bytes`` with an ERROR naming it; a client still logs in,
    and the bytes are given back when the sockets go. Before: nothing counted them and
    only the per-connection limits bounded them."""
    cfg = tmp_path / "broker.toml"
    cfg.write_text("[broker]\nmax_unauthenticated_bytes = 262144\nconnect_timeout_ms = 120000\n")
    http = free_port()
    part = b"CONNECT\naccept-version:1.2\nhost:x\nx-pad:" + b"p" * 40_000  # no end of line: a partial frame
    with BrokerProcess(tmp_path / "data", args=["--config", str(cfg), "--http", f"127.0.0.1:{http}"],
                       log_dir=tmp_path) as bp:
        socks: list[socket.socket] = []
        try:
            for k in range(1, 7):  # 6 x 40 KB = 240 KB: within the 256 KiB budget
                sock = socket.create_connection(("127.0.0.1", bp.port), timeout=10)
                socks.append(sock)
                sock.sendall(part)
                _wait_metric(http, "amq_memory_preauth_bytes", lambda v, k=k: v >= k * len(part),
                             f"{k} partial CONNECT frames not counted")
            assert _metric(http, "amq_memory_usage_bytes") >= 6 * len(part)
            over = socket.create_connection(("127.0.0.1", bp.port), timeout=10)
            socks.append(over)
            with contextlib.suppress(OSError):
                over.sendall(part)
            answer = b""
            with contextlib.suppress(OSError):
                while chunk := over.recv(4096):
                    answer += chunk
            assert answer.startswith(b"ERROR") and b"max_unauthenticated_bytes=262144" in answer, answer[:300]
            held = _wait_metric(http, "amq_memory_preauth_bytes", lambda v: v <= 262144,
                                "the refused connection's bytes were not given back")
            assert held >= 6 * len(part)  # the others are still held, and counted
            assert "refused before login" in bp.log_text()
            with amqtransport.connect(bp.uri) as c:  # a client that logs in at once gets in
                c.send("/queue/preauth-budget", "ok")
        finally:
            for sock in socks:
                sock.close()
        _wait_metric(http, "amq_memory_preauth_bytes", lambda v: v == 0, "not given back when the sockets closed")
