"""A/B of a replicated slave's share of the receipt path: one ``RECORDS`` frame (one
256-byte persistent Enq) at a time from a scripted master in another process, the
slave's ``ACK`` before the next, against a real
:class:`~amqtransport.broker.ha.slave.SlaveLink` on a store with fsync off (so what is
measured is the slave's Python path: the read, decode, append, apply, the journal's
commit without its ``fdatasync``, the ACK write, and the two loopback hops). With
``AMQ_BENCH_WINDOW=W`` (W > 1) the master streams batches of W records instead, at most
two batches ahead of the slave's ACKs, to a store with fsync on: the slave's pipelined
throughput (records/s).

``AMQ_BENCH_GAP_US=G`` (window 1): the master waits G microseconds (spinning, not
timed) before each record, so the slave goes idle and is woken for each one as in a
pair, where the rest of the receipt path (the RECEIPT, the client's next SEND) lies
between one ACK and the next record; without it the next record follows the ACK at
once. ``AMQ_BENCH_SPLIT=1``: the slave pinned to the first CPU and the master to the
second (default: wherever the scheduler puts them; ``taskset -c 0`` puts both on one).

Run: .venv/bin/python benchmarks/ab_slave_link.py [N]   (AMQ_BENCH_ROUNDS=R, default 3;
AMQ_BENCH_BASELINE=DIR also runs the slave from the checkout DIR, alternating rounds)

Each round is one child process per build (``python benchmarks/ab_slave_link.py --child N``
with that build first on ``PYTHONPATH``); the table gives each round's figure (window 1:
the p50 round trip in microseconds; else records per second) and the median of the rounds.
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


def _master(port: int, n: int, window: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from amqtransport.broker.dispatch.message import Message
    from amqtransport.broker.ha.wire import (
        ACK,
        RECORDS,
        SYNC_END,
        WireDecoder,
        pack,
        pack_seq,
        record_frames,
        unpack_seq,
    )
    from amqtransport.broker.store import Enq
    from amqtransport.broker.store.records import encode

    if os.environ.get("AMQ_BENCH_SPLIT"):  # the master on the second CPU, the slave on the first
        os.sched_setaffinity(0, {1})
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = WireDecoder()

    acked = -1

    def wait_ack(seq: int) -> None:
        nonlocal acked
        while acked < seq:
            data = c.recv(65536)
            if not data:
                raise ConnectionError("the slave closed the link")
            for kind, payload in decoder.feed(data):
                if kind == ACK:
                    acked = max(acked, unpack_seq(payload))

    frames = [b"".join(record_frames(RECORDS, i, [encode(Enq(Message(
        id=f"m{i}", destination="/queue/a", headers=(), body=b"x" * 256, key="", timestamp=1.7e9 + i,
        persistent=True)))])) for i in range(1, n + 1)]
    c.sendall(pack(SYNC_END, pack_seq(0)))
    wait_ack(0)
    if window == 1:
        rtts = []
        gap = float(os.environ.get("AMQ_BENCH_GAP_US", "0")) / 1e6
        for seq, f in enumerate(frames, 1):
            if gap:  # the rest of a pair's receipt path: the slave goes idle before each record
                until = time.perf_counter() + gap
                while time.perf_counter() < until:
                    pass
            t = time.perf_counter()
            c.sendall(f)
            wait_ack(seq)
            rtts.append(time.perf_counter() - t)
        out.put(statistics.median(rtts) * 1e6)
    else:
        t = time.perf_counter()
        for i in range(0, n, window):
            c.sendall(b"".join(frames[i : i + window]))
            wait_ack(i - window)  # at most two batches ahead of the slave
        wait_ack(n)
        out.put(n / (time.perf_counter() - t))
    c.close()


def child(n: int, window: int) -> float:
    """One round in this process: the slave here, the scripted master in a forked child;
    window 1: the p50 round trip in microseconds; else records per second."""
    from amqtransport.broker.ha.slave import SlaveLink
    from amqtransport.broker.store import Callback, MessageStore, run_completions

    if os.environ.get("AMQ_BENCH_SPLIT"):
        os.sched_setaffinity(0, {0})
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    loops: list[asyncio.AbstractEventLoop] = []

    def notify(items: list[tuple[Callback, BaseException | None]]) -> None:  # as the node's replica store
        loops[0].call_soon_threadsafe(run_completions, items, time.perf_counter())

    with tempfile.TemporaryDirectory(prefix="ab-slave-") as d:
        store = MessageStore(Path(d) / "replica", fsync=window > 1, notify=notify)
        store.open()

        async def main() -> str:
            loops.append(asyncio.get_running_loop())
            accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
                asyncio.get_running_loop().create_future())
            server = await asyncio.start_server(lambda r, w: accepted.set_result((r, w)), "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            proc = ctx.Process(target=_master, args=(port, n, window, out))
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
        figure: float = out.get(timeout=30)
        store.close()
    return figure


def main() -> None:
    window = int(os.environ.get("AMQ_BENCH_WINDOW", "1"))
    if sys.argv[1:2] == ["--child"]:
        print(f"{child(int(sys.argv[2]), window):.1f}")
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    rounds = int(os.environ.get("AMQ_BENCH_ROUNDS", "3"))
    here = str(Path(__file__).resolve().parent.parent)
    builds = {"ours": here}
    if os.environ.get("AMQ_BENCH_BASELINE"):
        builds["baseline"] = os.environ["AMQ_BENCH_BASELINE"]
    what = ("round trip, fsync off, p50 us" if window == 1 else f"records/s, window {window}, fsync on")
    print(f"slave link {what}: {n} records x {rounds} rounds (load {os.getloadavg()[0]:.1f})")
    got: dict[str, list[float]] = {b: [] for b in builds}
    for _ in range(rounds):
        for build, path in builds.items():
            env = {**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"}
            res = subprocess.run([sys.executable, __file__, "--child", str(n)], env=env, capture_output=True,
                                 text=True, check=True, cwd=tempfile.gettempdir())
            got[build].append(float(res.stdout.strip().splitlines()[-1]))
    for build, figures in got.items():
        print(f"{build:9s} per round: {', '.join(f'{x:.1f}' for x in figures)}; "
              f"median {statistics.median(figures):.1f}")
    print(f"(load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
