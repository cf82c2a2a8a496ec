"""Deep queues on real processes: a backlog larger than the in-memory window survives
kill -9 and restarts and drains whole (nothing lost, nothing twice), and a replicated
slave syncs a store far larger than its memory budget."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from amqtransport.stomp import Frame, FrameParser, serialize
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.broker_process import BrokerProcess

from .scale_helpers import Raw


def fill(port: int, dest: str, n: int, size: int = 256) -> None:
    """``n`` persistent messages (header ``seq``), pipelined, a receipt per 500."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    parser = FrameParser("1.2")
    sock.sendall(serialize(Frame.make("CONNECT", [("accept-version", "1.2"), ("host", "x")])))
    body = b"b" * size
    done = sent = 0
    expected: list[str] = []
    while done < n:
        while sent < n and sent - done < 4000:
            upto = min(n, sent + 500)
            frames = [serialize(Frame.make("SEND", [("destination", dest), ("persistent", "true"), ("seq", str(i))],
                                           body)) for i in range(sent, upto - 1)]
            frames.append(serialize(Frame.make("SEND", [("destination", dest), ("persistent", "true"),
                                                         ("seq", str(upto - 1)), ("receipt", str(upto))], body)))
            sock.sendall(b"".join(frames))
            expected.append(str(upto))
            sent = upto
        parser.feed(sock.recv(65536))
        for e in parser.events():
            if isinstance(e, Frame):
                assert e.command in ("CONNECTED", "RECEIPT"), e.headers
                if e.command == "RECEIPT":
                    assert e.get("receipt-id") == expected.pop(0)
                    done = int(e.get("receipt-id") or 0)
    sock.close()


def drain(port: int, dest: str, n: int) -> list[int]:
    """Consume and ack ``n`` messages; returns their ``seq`` (the acks are processed, and
    durable, when it returns)."""
    c = Raw(port)
    c.send("SUBSCRIBE", {"destination": dest, "id": "s", "ack": "client-individual", "activemq.prefetchSize": "500"})
    got: list[int] = []
    while len(got) < n:
        f = c.read(timeout=60)
        assert f.command == "MESSAGE", f.headers
        got.append(int(f.get("seq")))
        c.send("ACK", {"id": f.get("ack")})
    c.close()  # DISCONNECT with a receipt: every ACK before it is processed and durable
    return got


def deep_queue(tmp_path: Path, n: int) -> None:
    with BrokerProcess(tmp_path / "d", log_dir=tmp_path) as bp:  # the default config
        fill(bp.port, "/queue/deep", n)
        bp.kill()
        bp.start()  # from the newest checkpoint and the journal after it
        first = drain(bp.port, "/queue/deep", n // 2)
        bp.restart()  # clean: a checkpoint at the stop
        second = drain(bp.port, "/queue/deep", n - n // 2)
        c = Raw(bp.port)
        c.send("SUBSCRIBE", {"destination": "/queue/deep", "id": "s"})
        with pytest.raises(TimeoutError):
            c.read(timeout=1.0)
        c.close()
    got = first + second
    assert len(got) == n and sorted(got) == list(range(n))  # nothing lost, nothing twice
    assert got == list(range(n))  # and in order


def test_a_deep_queue_survives_kill_9_and_restarts_and_drains_whole(tmp_path: Path) -> None:
    deep_queue(tmp_path, 20_000)


@pytest.mark.soak
def test_a_queue_of_200000_survives_kill_9_and_restarts_and_drains_whole(tmp_path: Path) -> None:
    deep_queue(tmp_path, 200_000)


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc to read a process's peak RSS")
def test_a_slave_syncs_a_store_larger_than_its_memory_budget(tmp_path: Path) -> None:
    """200 MB of messages on the master before the slave starts; the slave's memory
    limit is 1 MiB. The full sync streams, the slave pages what it imports: its peak RSS
    (about 60 MB here, most of it the interpreter) stays below half the store's size
    (holding the messages, as before the sync was streamed, took more than the store).
    Then the master dies and the slave, now master, has every message."""
    n, size = 80_000, 2500
    cfg = tmp_path / "broker.toml"
    cfg.write_text("memory_limit = 1048576\n")
    pair = BrokerPair("replicated", tmp_path / "pair", extra_args=["--config", str(cfg)])
    try:
        pair.a.start(60)
        master = pair.wait_master(60)
        fill(master.port, "/queue/big", n, size)
        pair.b.start(60)
        slave = pair.wait_in_sync(timeout=300)
        assert peak_rss(slave.pid) < n * size * 0.5, peak_rss(slave.pid)
        assert peak_rss(master.pid) < n * size * 0.5, peak_rss(master.pid)
        master.kill()
        new = pair.wait_master(60)
        assert new is slave
        got = drain(new.port, "/queue/big", n)
        assert got == list(range(n))
    finally:
        pair.stop()
