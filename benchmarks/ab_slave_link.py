"""A/B of a replicated slave's share of the receipt path, without the disk: one
``RECORDS`` frame (one 256-byte persistent Enq) at a time from a scripted master in
another process, the slave's ``ACK`` before the next, against a real
:class:`~amqtransport.broker.ha.slave.SlaveLink` on a store with fsync off (so what is
measured is the slave's Python path: the read, decode, append, apply, the journal's
commit without its ``fdatasync``, the ACK write, and the two loopback hops).

Run: .venv/bin/python benchmarks/ab_slave_link.py [N]   (AMQ_BENCH_ROUNDS=R, default 3;
AMQ_BENCH_BASELINE=DIR also runs the slave from the checkout DIR, alternating rounds)

Each round is one child process per build (``python benchmarks/ab_slave_link.py --child N``
with that build first on ``PYTHONPATH``); the table gives each round's p50 round trip in
microseconds and the median of the rounds.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _master(port: int, n: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from amqtransport.broker.dispatch.message import Message
    from amqtransport.broker.ha.wire import (
        ACK,
        RECORDS,
        SYNC_END,
        WireDecoder,
        pack,
        pack_seq,
        record_frames,
    )
    from amqtransport.broker.store import Enq
    from amqtransport.broker.store.records import encode

    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = WireDecoder()

    def wait_ack() -> None:
        while True:
            data = c.recv(65536)
            if not data:
                raise ConnectionError("the slave closed the link")
            if any(kind == ACK for kind, _p in decoder.feed(data)):
                return

    frames = [b"".join(record_frames(RECORDS, i, [encode(Enq(Message(
        id=f"m{i}", destination="/queue/a", headers=(), body=b"x" * 256, key="", timestamp=1.7e9 + i,
        persistent=True)))])) for i in range(1, n + 1)]
    c.sendall(pack(SYNC_END, pack_seq(0)))
    wait_ack()
    rtts = []
    for f in frames:
        t = time.perf_counter()
        c.sendall(f)
        wait_ack()
        rtts.append(time.perf_counter() - t)
    c.close()
    out.put(rtts)


def child(n: int) -> float:
    """One round in this process: the slave here, the scripted master in a forked child;
    the p50 round trip in microseconds."""
    from amqtransport.broker.ha.slave import SlaveLink
    from amqtransport.broker.store import MessageStore

    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory(prefix="ab-slave-") as d:
        store = MessageStore(Path(d) / "replica", fsync=False)
        store.open()

        async def main() -> str:
            accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
                asyncio.get_running_loop().create_future())
            server = await asyncio.start_server(lambda r, w: accepted.set_result((r, w)), "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            proc = ctx.Process(target=_master, args=(port, n, out))
            proc.start()
            reader, writer = await accepted
            link = SlaveLink(store, reader, writer, link_timeout=30.0, on_synced=lambda: None)
            try:
                return await link.run(asyncio.Event())
            finally:
                writer.close()
                server.close()
                proc.join(30)

        asyncio.run(main())
        rtts: list[float] = out.get(timeout=30)
        store.close()
    return statistics.median(rtts) * 1e6


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(f"{child(int(sys.argv[2])):.1f}")
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    rounds = int(os.environ.get("AMQ_BENCH_ROUNDS", "3"))
    here = str(Path(__file__).resolve().parent.parent)
    builds = {"ours": here}
    if os.environ.get("AMQ_BENCH_BASELINE"):
        builds["baseline"] = os.environ["AMQ_BENCH_BASELINE"]
    print(f"slave link round trip, fsync off, {n} records x {rounds} rounds (load {os.getloadavg()[0]:.1f})")
    got: dict[str, list[float]] = {b: [] for b in builds}
    for _ in range(rounds):
        for build, path in builds.items():
            env = {**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"}
            res = subprocess.run([sys.executable, __file__, "--child", str(n)], env=env, capture_output=True,
                                 text=True, check=True, cwd=tempfile.gettempdir())
            got[build].append(float(res.stdout.strip().splitlines()[-1]))
    for build, figures in got.items():
        print(f"{build:9s} p50 us per round: {', '.join(f'{x:.1f}' for x in figures)}; "
              f"median {statistics.median(figures):.1f}")
    print(f"(load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
