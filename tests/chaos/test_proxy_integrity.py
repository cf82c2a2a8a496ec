"""Adding, updating and removing toxics on a live connection loses and reorders no byte.

A 5 MB numbered stream goes client -> proxy -> echo server -> proxy -> client while a
second thread keeps adding, updating and removing latency, slicer and bandwidth
toxics on both streams through the PyPI client. The client must read back exactly
the bytes it sent, in order.
"""

from __future__ import annotations

import socket
import threading
import time
from array import array

import pytest
from toxiproxy import Toxiproxy

from chaos.proxy.server import ToxiproxyServer
from chaos.proxy.testing import UpstreamServer, connect

pytestmark = pytest.mark.timeout(90)

TOTAL = 5_000_000


def numbered_stream(total: int) -> bytes:
    """Consecutive big-endian 32-bit counters: any loss, duplicate or swap shows."""
    numbers = array("I", range(total // 4))
    if numbers.itemsize != 4:  # pragma: no cover - every platform we run on
        pytest.skip("array('I') is not 32-bit here")
    numbers.byteswap()
    return numbers.tobytes()


def first_difference(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def test_numbered_stream_survives_toxic_churn(
    toxi: Toxiproxy, toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="integrity")
    payload = numbered_stream(TOTAL)
    sock = connect(proxy.listen, timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    done = threading.Event()
    errors: list[BaseException] = []
    changes = 0

    def send() -> None:
        try:
            view = memoryview(payload)
            for start in range(0, len(payload), 16384):
                sock.sendall(view[start : start + 16384])
                time.sleep(0.005)  # spread the stream over ~2 s of toxic churn
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def churn() -> None:
        nonlocal changes
        rounds = [
            ("latency", "downstream", {"latency": 20, "jitter": 10}),
            ("slicer", "upstream", {"average_size": 2000, "size_variation": 500, "delay": 50}),
            ("bandwidth", "downstream", {"rate": 8000}),
            ("latency", "upstream", {"latency": 5}),
            ("slicer", "downstream", {"average_size": 700, "size_variation": 300, "delay": 0}),
            ("bandwidth", "upstream", {"rate": 20000}),
        ]
        try:
            i = 0
            while not done.is_set():
                kind, stream, attributes = rounds[i % len(rounds)]
                name = f"{kind}_{stream}_{i}"
                proxy.add_toxic(type=kind, stream=stream, name=name, attributes=attributes)
                changes += 1
                time.sleep(0.03)
                if i % 3 == 0:  # update a live toxic, then remove it
                    toxiproxy_server.call(
                        lambda c, n=name: c.get("integrity").update_toxic(n, toxicity=0.5)
                    )
                    changes += 1
                time.sleep(0.03)
                proxy.destroy_toxic(name)
                changes += 1
                i += 1
        except BaseException as exc:
            errors.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    churner = threading.Thread(target=churn, daemon=True)
    sender.start()
    churner.start()
    received = bytearray()
    try:
        while len(received) < TOTAL:
            data = sock.recv(1 << 20)
            if not data:
                break
            received += data
    finally:
        done.set()
        churner.join(timeout=10)
        sender.join(timeout=10)
        sock.close()

    assert not errors, errors
    assert changes >= 20, "the toxics were not changed often enough to test anything"
    assert len(received) == TOTAL, f"got {len(received)} of {TOTAL} bytes"
    if bytes(received) != payload:
        at = first_difference(bytes(received), payload)
        pytest.fail(f"stream corrupted at byte {at} (counter {at // 4})")
