"""STOMP over WebSocket vs over TCP: the same client code path, the same broker, one run.

Run: .venv/bin/python benchmarks/bench_websocket.py [rounds]   (AMQ_BENCH_QUICK=1: smaller runs)

One ``amq broker run --ws`` process (fsync on, its defaults). The client is one function,
:func:`pipelined_rate`: CONNECT, then persistent 256-byte SENDs with a receipt each, 100
receipts kept outstanding, parsed by the project's sans-IO codec. It runs over a
:class:`TcpLink` (the bytes on the socket) and over a :class:`WsLink` (the same bytes in
WebSocket text messages, one per SEND, framed and masked by ``wsproto`` as a browser
would, the server's messages decoded by ``wsproto``), alternating, ``rounds`` times each;
the figure is the ratio of the medians (goal: WebSocket >= 0.7 x TCP). Both links'
SENDs are encoded before the clock starts, so the ratio is the broker's WebSocket
envelope (unmasking, framing) plus the client's decoding of the replies, not the Python
client's masking (a browser masks natively).
"""

from __future__ import annotations

import socket
import sys
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import compare, print_table, scale  # noqa: E402
from wsproto import ConnectionType, WSConnection  # noqa: E402
from wsproto.events import AcceptConnection, BytesMessage, Request, TextMessage  # noqa: E402

from amqtransport.stomp import Frame, FrameParser, NeedData, serialize  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402
from amqtransport.testing.ports import free_port  # noqa: E402

BODY = b"x" * 256


class TcpLink:
    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def encode(self, data: bytes) -> bytes:
        """What goes on the socket for ``data`` (here: itself)."""
        return data

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> bytes:
        return self.sock.recv(65536)

    def close(self) -> None:
        self.sock.close()


class WsLink(TcpLink):
    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host=f"{address[0]}:{address[1]}", target="/ws",
                                               subprotocols=["v12.stomp"])))
        self._pending: list[bytes] = []
        while True:
            self.ws.receive_data(self.sock.recv(65536))
            events = list(self.ws.events())
            if any(isinstance(e, AcceptConnection) for e in events):
                self._pending += [self._payload(e) for e in events if isinstance(e, TextMessage | BytesMessage)]
                return

    @staticmethod
    def _payload(e: TextMessage | BytesMessage) -> bytes:
        return e.data.encode() if isinstance(e, TextMessage) else bytes(e.data)

    def encode(self, data: bytes) -> bytes:
        """``data`` in one masked WebSocket text message, as a browser sends it."""
        return self.ws.send(TextMessage(data=data.decode()))

    def recv(self) -> bytes:
        while not self._pending:
            data = self.sock.recv(65536)
            if not data:
                return b""
            self.ws.receive_data(data)
            self._pending += [self._payload(e) for e in self.ws.events() if isinstance(e, TextMessage | BytesMessage)]
        out = b"".join(self._pending)
        self._pending.clear()
        return out


def pipelined_rate(link: TcpLink, n: int, window: int = 100) -> float:
    """The client code path: n receipted persistent SENDs, ``window`` outstanding; msg/s."""
    parser = FrameParser()

    def next_frame() -> Frame:
        while True:
            event = parser.next_event()
            if isinstance(event, Frame):
                return event
            if isinstance(event, NeedData):
                data = link.recv()
                if not data:
                    raise ConnectionError("the broker closed the connection")
                parser.feed(data)

    link.send(link.encode(serialize(Frame.make("CONNECT", {"accept-version": "1.2", "host": "bench",
                                                            "heart-beat": "0,0"}))))
    assert next_frame().command == "CONNECTED"
    dest = f"/queue/bench.ws.{uuid.uuid4().hex[:8]}"
    # encoded before the clock starts, for both links: the figure is the broker's, not the
    # Python client's masking (a browser masks natively)
    sends = [link.encode(serialize(Frame.make("SEND", {"destination": dest, "persistent": "true",
                                                       "receipt": str(i)}, BODY))) for i in range(n)]
    outstanding: deque[int] = deque()
    t0 = time.perf_counter()
    for i, data in enumerate(sends):
        if len(outstanding) >= window:
            f = next_frame()
            assert f.command == "RECEIPT", f
            outstanding.popleft()
        link.send(data)
        outstanding.append(i)
    while outstanding:
        assert next_frame().command == "RECEIPT"
        outstanding.popleft()
    rate = n / (time.perf_counter() - t0)
    link.close()
    return rate


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n = scale(20_000, 2_000)
    ws_port = free_port()
    with tempfile.TemporaryDirectory(prefix="amq-bench-ws-") as tmp, \
            BrokerProcess(Path(tmp) / "data", args=["--ws", f"127.0.0.1:{ws_port}"]) as broker:
        tcp = (broker.host, broker.port)
        ws = ("127.0.0.1", ws_port)
        pipelined_rate(TcpLink(tcp), n // 10)  # warm-up, both paths
        pipelined_rate(WsLink(ws), n // 10)
        c = compare(lambda: pipelined_rate(WsLink(ws), n), lambda: pipelined_rate(TcpLink(tcp), n), rounds=rounds)
    print_table([{"case": f"WebSocket vs TCP, {n} receipted persistent SENDs, window 100, {rounds} rounds",
                  "ws msg/s": round(c.ours), "tcp msg/s": round(c.peer), "ratio": round(c.ratio, 2),
                  "target": ">= 0.7"}], title="STOMP over WebSocket vs TCP (same client code, same broker)")


if __name__ == "__main__":
    main()
