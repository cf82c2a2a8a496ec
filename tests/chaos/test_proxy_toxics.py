"""Each toxic's observable effect on real sockets, driven by the PyPI client.

Time bounds are one-sided and generous (a toxic must delay at least about what it
says); upper bounds only where the alternative is a multiple of the expected time.
"""

from __future__ import annotations

import random
import socket
import time

import pytest
from toxiproxy import Toxiproxy

from chaos.proxy.server import ToxiproxyServer
from chaos.proxy.testing import UpstreamServer, connect, recv_exactly, recv_until_closed
from chaos.proxy.toxics import SlicerToxic

pytestmark = pytest.mark.timeout(60)


def rtt(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def test_latency_downstream_and_upstream(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    with connect(proxy.listen) as sock:
        rtt(sock)
        proxy.add_toxic(type="latency", attributes={"latency": 200})
        assert rtt(sock) >= 0.19
        proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 150})
        assert rtt(sock) >= 0.34
        proxy.destroy_toxic("latency_downstream")
        proxy.destroy_toxic("latency_upstream")
        assert rtt(sock, b"again") >= 0.0  # still works after removal


def test_latency_applies_to_new_connections(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 150, "jitter": 50})
    with connect(proxy.listen) as sock:
        assert rtt(sock) >= 0.09  # latency - jitter, at least


def test_latency_does_not_pile_up(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 300})
    with connect(proxy.listen, timeout=10) as sock:
        start = time.monotonic()
        for i in range(10):
            sock.sendall(bytes([65 + i]))
            time.sleep(0.01)
        assert recv_exactly(sock, 10) == b"ABCDEFGHIJ"
        elapsed = time.monotonic() - start
    # Each chunk is delayed from its own read time: ~0.4 s in all. Piled-up delays
    # would take 10 x 0.3 s = 3 s.
    assert 0.29 <= elapsed < 2.0


def test_toxicity_zero_never_applies(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="limit_data", toxicity=0.0, attributes={"bytes": 1})
    with connect(proxy.listen) as sock:
        sock.sendall(b"all of it")
        assert recv_exactly(sock, 9) == b"all of it"


def test_bandwidth_limits_rate(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="bandwidth", attributes={"rate": 200})  # 200 KB/s downstream
    payload = random.randbytes(300_000)
    with connect(proxy.listen, timeout=20) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload)) == payload
        elapsed = time.monotonic() - start
    assert elapsed >= 1.2  # 300 KB at 200 KB/s is 1.5 s


def test_bandwidth_zero_stalls_but_keeps_data(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="bandwidth", name="stall", attributes={"rate": 0})
    payload = random.randbytes(20_000)
    with connect(proxy.listen, timeout=0.5) as sock:
        sock.sendall(payload)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        proxy.destroy_toxic("stall")
        sock.settimeout(5)
        assert recv_exactly(sock, len(payload)) == payload


def test_slow_close_delays_the_close(toxi: Toxiproxy, greet_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=greet_server.address, name="greet")
    proxy.add_toxic(type="slow_close", attributes={"delay": 500})
    with connect(proxy.listen) as sock:
        start = time.monotonic()
        assert recv_exactly(sock, 3) == b"bye"
        assert recv_until_closed(sock) == b""
        assert time.monotonic() - start >= 0.45
    # without the toxic the close follows at once
    proxy.destroy_toxic("slow_close_downstream")
    with connect(proxy.listen) as sock:
        assert recv_until_closed(sock) == b"bye"


def test_slow_close_holds_while_the_client_keeps_writing(
    toxi: Toxiproxy, greet_server: UpstreamServer
) -> None:
    """Writes towards the closed server fail, but the client's close still waits."""
    proxy = toxi.create(upstream=greet_server.address, name="greet")
    proxy.add_toxic(type="slow_close", attributes={"delay": 600})
    with connect(proxy.listen) as sock:
        start = time.monotonic()
        assert recv_exactly(sock, 3) == b"bye"
        for _ in range(10):
            time.sleep(0.03)
            sock.sendall(b"still talking")
        try:
            assert recv_until_closed(sock) == b""
        except ConnectionResetError:
            pass
        assert time.monotonic() - start >= 0.55


def test_timeout_zero_is_half_open_until_removed(
    toxi: Toxiproxy, toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    with connect(proxy.listen, timeout=0.6) as sock:
        assert rtt(sock) >= 0
        proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
        sock.sendall(b"into the void")
        with pytest.raises(TimeoutError):  # no answer, and no close either
            sock.recv(100)
        sock.sendall(b"still open")
        with pytest.raises(TimeoutError):
            sock.recv(100)
        assert toxiproxy_server.call(lambda c: len(c.get("echo").connections)) == 1
        proxy.destroy_toxic("timeout_upstream")  # bytes were lost: the connection closes
        sock.settimeout(5)
        try:
            assert sock.recv(100) == b""
        except ConnectionResetError:
            pass


def test_timeout_closes_after_silence(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="timeout", attributes={"timeout": 300})
    with connect(proxy.listen, timeout=5) as sock:
        start = time.monotonic()
        sock.sendall(b"dropped")
        assert recv_until_closed(sock) == b""  # the echo was dropped, then the close came
        assert time.monotonic() - start >= 0.25


def test_reset_peer_sends_rst(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 100})
    with connect(proxy.listen, timeout=5) as sock:
        start = time.monotonic()
        sock.sendall(b"hello")
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
        assert time.monotonic() - start >= 0.09


def test_slicer_slices_and_delays_without_losing_bytes(
    toxi: Toxiproxy, echo_server: UpstreamServer
) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(
        type="slicer", attributes={"average_size": 10, "size_variation": 4, "delay": 5000}
    )
    payload = random.randbytes(1000)
    with connect(proxy.listen, timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        reads = []
        while sum(map(len, reads)) < len(payload):
            reads.append(sock.recv(65536))
            assert reads[-1]
        elapsed = time.monotonic() - start
    assert b"".join(reads) == payload
    assert len(reads) > 1
    assert elapsed >= 0.25  # about 100 slices, 5 ms apart


def test_slicer_boundaries_cover_the_chunk() -> None:
    rng = random.Random(7)
    toxic = SlicerToxic(average_size=100, size_variation=20, delay=0)
    for length in (0, 1, 99, 100, 121, 5000, 65536):
        cuts = toxic.boundaries(length, rng)
        assert cuts == sorted(cuts) and (cuts[-1] if cuts else 0) == length
        sizes = [b - a for a, b in zip([0, *cuts], cuts, strict=False)]
        assert all(size > 0 for size in sizes) or length == 0
        assert all(size <= 120 for size in sizes)


def test_limit_data_closes_after_n_bytes(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 100})
    with connect(proxy.listen, timeout=5) as sock:
        sock.sendall(bytes(range(60)))
        assert recv_exactly(sock, 60) == bytes(range(60))
        sock.sendall(bytes(range(60, 120)))
        assert recv_until_closed(sock) == bytes(range(60, 100))


def test_limit_data_upstream(toxi: Toxiproxy) -> None:
    received: list[bytes] = []

    def record(sock: socket.socket) -> None:
        received.append(recv_until_closed(sock))

    server = UpstreamServer(record)
    try:
        proxy = toxi.create(upstream=server.address, name="rec")
        proxy.add_toxic(type="limit_data", stream="upstream", attributes={"bytes": 5})
        with connect(proxy.listen, timeout=5) as sock:
            sock.sendall(b"0123456789")
            assert recv_until_closed(sock) == b""  # no half-close: the client is closed too
        deadline = time.monotonic() + 5
        while not received and time.monotonic() < deadline:
            time.sleep(0.02)
        assert received == [b"01234"]  # the server got exactly the limit, then EOF
    finally:
        server.close()


def test_noop_passes_through(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="noop")
    with connect(proxy.listen) as sock:
        assert rtt(sock, b"unchanged") >= 0
