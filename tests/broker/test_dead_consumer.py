"""A consumer that stops reading while the broker has paused reading it (its socket is
full): heart-beats decide whether it is alive by whether it still drains what the
broker writes. A dead one is dropped within its heart-beat grace and its prefetched
messages go to another consumer; a slow but live one is kept. Real sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest
from broker_helpers import Raw, StompPy

from amqtransport.broker import EmbeddedBroker
from amqtransport.stomp import Frame

pytestmark = pytest.mark.timeout(120)

N = 150
BODY = b"x" * (100 * 1024)  # 15 MiB in all: far more than the socket buffers hold


def produce(port: int) -> None:
    p = StompPy(port)
    p.wait_receipts([p.send("/queue/work", BODY.decode(), persistent=False, seq=str(i)) for i in range(N)], 60)
    p.close()


def stuck_consumer(port: int) -> Raw:
    """Subscribes with a big prefetch and heart-beats every 300 ms, then never reads or
    writes again; its socket stays open (a hung process, a frozen VM)."""
    c = Raw(port)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    c.connect({"heart-beat": "300,0"})
    c.send(Frame.make("SUBSCRIBE", {"id": "s", "destination": "/queue/work", "ack": "client-individual",
                                    "activemq.prefetchSize": str(N), "receipt": "sub"}))
    assert c.read().get("receipt-id") == "sub"
    return c


def connections(b: EmbeddedBroker) -> int:
    n = b.stats()["connections"]
    assert isinstance(n, int)
    return n


def test_a_dead_consumer_is_dropped_and_its_prefetched_messages_redelivered(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    b = make_broker(fsync=False)
    dead = stuck_consumer(b.port)
    produce(b.port)  # the broker writes to the stuck consumer until its socket is full
    t0 = time.monotonic()
    while connections(b) > 0 and time.monotonic() - t0 < 20:
        time.sleep(0.1)
    assert connections(b) == 0, "the dead consumer is still connected"
    assert time.monotonic() - t0 < 10  # 300 ms x grace 2, plus the time to notice
    live = StompPy(b.port)
    live.conn.subscribe("/queue/work", id="1", ack="auto")
    got = sorted(int(m.headers["seq"]) for m in live.get_n(N, timeout=60))
    assert got == list(range(N))  # nothing stuck with the dead consumer
    live.close()
    dead.close()


def test_a_slow_consumer_that_still_reads_is_kept(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(fsync=False)
    slow = stuck_consumer(b.port)
    stop = threading.Event()
    read = [0]

    def trickle() -> None:  # reads a little at a time, far slower than the producer writes
        slow.sock.settimeout(1.0)
        while not stop.is_set():
            try:
                data = slow.sock.recv(16 * 1024)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            read[0] += len(data)
            time.sleep(0.05)

    def heartbeat() -> None:  # a live client keeps its heart-beat promise
        while not stop.wait(0.2):
            try:
                slow.sock.sendall(b"\n")
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    threading.Thread(target=heartbeat, daemon=True).start()
    threading.Thread(target=produce, args=(b.port,), daemon=True).start()
    time.sleep(4.0)  # many heart-beat periods while its socket is full
    stop.set()
    assert read[0] > 1024 * 1024
    assert connections(b) >= 1, "a consumer that was still reading was dropped"
    slow.close()
