"""Client throughput only (the first rows of bench_client.py, without the recovery runs),
plus the asyncio failover driver on the same broker.

Run: .venv/bin/python benchmarks/bench_client_pipeline.py [rounds]   (AMQ_BENCH_QUICK=1: smaller runs)

1. ``failover:(tcp://x)`` vs ``tcp://x``: the sync pipelined producer (window 100,
   persistent 256-byte receipted sends) through both URIs, both orders, geometric mean
   of the two ratios (>= 0.95 wanted), and the client's CPU per message.
2. The sync pipelined producer vs stomp.py's receipt-per-send loop (>= 10x wanted).
3. ``FailoverTransport.request_many`` (a window's SENDs in one system call: 50 per
   write, two writes in flight) vs the producer and vs the stomp.py loop.
4. The asyncio failover driver (``AsyncFailoverTransport``, window 100 of receipted
   sends kept in flight by one task) vs the sync pipelined producer, both on
   ``failover:(tcp://x)``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import compare, print_table, quick, scale, work_dir  # noqa: E402
from bench_client import BODY, producer_rate, stomppy_receipt_loop_rate  # noqa: E402

from amqtransport.aio.failover import AsyncFailoverTransport  # noqa: E402
from amqtransport.stomp import Frame  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402
from amqtransport.transports.failover import FailoverTransport  # noqa: E402


def async_producer_rate(uri: str, n: int, window: int = 100) -> float:
    async def main() -> float:
        t = AsyncFailoverTransport.from_uri(uri)
        await t.start()
        dest = f"/queue/bench.{uuid.uuid4().hex[:8]}"
        outstanding: deque[Any] = deque()
        t0 = time.perf_counter()
        for _ in range(n):
            if len(outstanding) >= window:
                await t.wait(outstanding.popleft())
            outstanding.append(await t.request(Frame.make("SEND", {"destination": dest, "persistent": "true"},
                                                          BODY)))
        while outstanding:
            await t.wait(outstanding.popleft())
        rate = n / (time.perf_counter() - t0)
        await t.close()
        return rate

    return asyncio.run(main())


def batched_rate(uri: str, n: int, batch: int = 50, batches: int = 2) -> float:
    """``FailoverTransport.request_many``: ``batch`` SENDs per system call, at most
    ``batches`` batches in flight (the same 100 receipts outstanding as the producer)."""
    import amqtransport

    dest = f"/queue/bench.{uuid.uuid4().hex[:8]}"
    with amqtransport.connect(uri) as conn:
        transport = conn.transport
        assert isinstance(transport, FailoverTransport)
        frame = Frame.make("SEND", {"destination": dest, "persistent": "true"}, BODY)
        in_flight: deque[list[Any]] = deque()
        t0 = time.perf_counter()
        for _ in range(n // batch):
            if len(in_flight) >= batches:
                for rec in in_flight.popleft():
                    transport.wait(rec)
            in_flight.append(transport.request_many([frame] * batch))
        while in_flight:
            for rec in in_flight.popleft():
                transport.wait(rec)
        return n / (time.perf_counter() - t0)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else (3 if quick() else 5)
    n_pipe = scale(10000, 500)
    n_loop = scale(1000, 100)
    rows: list[dict[str, Any]] = []
    tmp = work_dir("bench-client-pipe-")
    with BrokerProcess(tmp / "data", log_dir=tmp / "logs") as broker:
        plain, fo = broker.uri, f"failover:({broker.uri})"
        producer_rate(plain, 200)
        cpu: dict[str, list[float]] = {"fo": [], "tcp": []}

        def timed(key: str, uri: str) -> float:
            c0 = time.process_time()
            rate = producer_rate(uri, n_pipe)
            cpu[key].append((time.process_time() - c0) / n_pipe * 1e6)
            return rate

        c1 = compare(lambda: timed("fo", fo), lambda: timed("tcp", plain), rounds=rounds)
        c2 = compare(lambda: timed("tcp", plain), lambda: timed("fo", fo), rounds=rounds)
        rows.append({"case": f"sync: failover:(tcp://x) vs tcp://x, producer window 100, {n_pipe} msgs, both orders",
                     "ours msg/s": statistics.median(c1.ours_all + c2.peer_all),
                     "peer msg/s": statistics.median(c1.peer_all + c2.ours_all),
                     "ratio": (c1.ratio / c2.ratio) ** 0.5, "better": "higher"})
        fo_cpu, tcp_cpu = statistics.median(cpu["fo"]), statistics.median(cpu["tcp"])
        rows.append({"case": "  same runs, client CPU per message, us: failover vs tcp",
                     "ours msg/s": fo_cpu, "peer msg/s": tcp_cpu, "ratio": tcp_cpu / fo_cpu, "better": "higher"})
        c = compare(lambda: producer_rate(fo, n_pipe), lambda: stomppy_receipt_loop_rate(broker.port, n_loop),
                    rounds=rounds)
        rows.append({"case": "sync pipelined receipts (window 100) vs stomp.py receipt-per-send loop",
                     "ours msg/s": c.ours, "peer msg/s": c.peer, "ratio": c.ratio, "better": "higher"})
        w = compare(lambda: batched_rate(fo, n_pipe), lambda: producer_rate(fo, n_pipe), rounds=rounds)
        rows.append({"case": "sync request_many (50 SENDs per write, 2 batches in flight) vs producer(window=100)",
                     "ours msg/s": w.ours, "peer msg/s": w.peer, "ratio": w.ratio, "better": "higher"})
        s = compare(lambda: batched_rate(fo, n_pipe), lambda: stomppy_receipt_loop_rate(broker.port, n_loop),
                    rounds=rounds)
        rows.append({"case": "sync request_many (as above) vs stomp.py receipt-per-send loop",
                     "ours msg/s": s.ours, "peer msg/s": s.peer, "ratio": s.ratio, "better": "higher"})
        a = compare(lambda: async_producer_rate(fo, n_pipe), lambda: producer_rate(fo, n_pipe), rounds=rounds)
        rows.append({"case": "asyncio failover driver (window 100) vs sync pipelined producer, failover:(x)",
                     "ours msg/s": a.ours, "peer msg/s": a.peer, "ratio": a.ratio, "better": "higher"})
    print_table(rows, title="client throughput (our broker process, fsync on, 256-byte persistent sends)")


if __name__ == "__main__":
    main()
