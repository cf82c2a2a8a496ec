"""The asyncio client (``amqtransport.aio``) through its public API, against the sync
client in the same run on the same broker process (fsync on, 256-byte persistent
sends, every one receipted).

Run: .venv/bin/python benchmarks/bench_client_async.py [rounds]   (AMQ_BENCH_QUICK=1: smaller runs)

1. ``aio`` ``conn.producer(window=100)`` vs the sync ``conn.producer(window=100)``,
   both on ``failover:(tcp://x)``, one connection each (≥ 1.0 wanted).
2. 1,000 tasks on one ``aio`` connection, each ``await conn.send(...)`` in a loop
   (every send receipted before the task's next) vs the same aio producer.
3. ``aio`` ``failover:(tcp://x)`` vs ``tcp://x`` (producer window 100; ≥ 0.95 wanted).
   The asyncio client runs a bare leaf through the same failover driver with
   reconnects off, so this measures the failover options' cost, not a second code path.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import compare, print_table, quick, scale, work_dir  # noqa: E402
from bench_client import BODY, producer_rate  # noqa: E402

import amqtransport.aio as aio  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402


def aio_producer_rate(uri: str, n: int, window: int = 100) -> float:
    async def main() -> float:
        dest = f"/queue/bench.{uuid.uuid4().hex[:8]}"
        async with aio.connect(uri) as conn:
            t0 = time.perf_counter()
            async with conn.producer(window=window) as p:
                for _ in range(n):
                    await p.send(dest, BODY)
            return n / (time.perf_counter() - t0)

    return asyncio.run(main())


def aio_tasks_rate(uri: str, n: int, tasks: int = 1000) -> float:
    """``tasks`` tasks share one connection; each sends ``n // tasks`` messages, one
    receipted ``send`` after the other."""

    async def main() -> float:
        dest = f"/queue/bench.{uuid.uuid4().hex[:8]}"
        per = max(1, n // tasks)
        async with aio.connect(uri) as conn:
            async def one() -> None:
                for _ in range(per):
                    await conn.send(dest, BODY)

            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(tasks)))
            return per * tasks / (time.perf_counter() - t0)

    return asyncio.run(main())


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else (3 if quick() else 5)
    n = scale(10000, 1000)
    rows: list[dict[str, Any]] = []
    tmp = work_dir("bench-client-async-")
    with BrokerProcess(tmp / "data", log_dir=tmp / "logs") as broker:
        plain, fo = broker.uri, f"failover:({broker.uri})"
        producer_rate(plain, 200)
        aio_producer_rate(plain, 200)
        a = compare(lambda: aio_producer_rate(fo, n), lambda: producer_rate(fo, n), rounds=rounds)
        rows.append({"case": f"aio producer(window=100) vs sync producer(window=100), failover:(x), {n} msgs",
                     "ours msg/s": a.ours, "peer msg/s": a.peer, "ratio": a.ratio, "better": "higher"})
        t = compare(lambda: aio_tasks_rate(fo, n), lambda: aio_producer_rate(fo, n), rounds=rounds)
        rows.append({"case": f"1,000 tasks on one aio connection ({n // 1000} receipted sends each) vs aio producer",
                     "ours msg/s": t.ours, "peer msg/s": t.peer, "ratio": t.ratio, "better": "higher"})
        c1 = compare(lambda: aio_producer_rate(fo, n), lambda: aio_producer_rate(plain, n), rounds=rounds)
        c2 = compare(lambda: aio_producer_rate(plain, n), lambda: aio_producer_rate(fo, n), rounds=rounds)
        rows.append({"case": "aio: failover:(tcp://x) vs tcp://x, producer window 100, both orders",
                     "ours msg/s": statistics.median(c1.ours_all + c2.peer_all),
                     "peer msg/s": statistics.median(c1.peer_all + c2.ours_all),
                     "ratio": (c1.ratio / c2.ratio) ** 0.5, "better": "higher"})
    print_table(rows, title="asyncio client (our broker process, fsync on, 256-byte persistent sends)")


if __name__ == "__main__":
    main()
