"""Receipt latency, one message at a time: the disk, our broker alone and in both pair
modes, and ActiveMQ 5.17, in one run.

Run: .venv/bin/python benchmarks/bench_latency.py [N]   (AMQ_BENCH_QUICK=1: smaller runs;
AMQ_BENCH_ROUNDS=R, default 2)

What a plain ``conn.send(...)`` loop waits for: one persistent 256-byte SEND with a
receipt, then the RECEIPT, then the next (window 1, TCP_NODELAY, a raw socket with our
sans-IO codec, frames built before the clock starts). For each target the table gives
the p50 and p99 of the round trips and the messages per second; the targets are

* the disk: ``fdatasync`` of a 256-byte append to a file in the same directory as the
  brokers' data, measured here (what a RECEIPT that means "on disk" cannot beat);
* ``single``: ``amq broker run`` (fsync on, its defaults);
* ``replicated``: ``amq broker pair``'s two nodes (a RECEIPT means on both disks);
* ``shared-store``: a shared-store pair's master (one disk, the lock beside it);
* ``ActiveMQ``: Debian's 5.17 with its defaults (KahaDB, journal syncs on).

Rounds alternate between the targets. The closing lines compare with issue 27's goals:
single p50 <= 2 x the disk's p50 + 0.05 ms; replicated p50 <= 1.5 x single; shared
store p50 <= 1.1 x single; single msg/s >= 2 x ActiveMQ's.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, quick, scale  # noqa: E402
from bench_broker import BODY, RawClient, start_activemq  # noqa: E402

from amqtransport.stomp import Frame, serialize  # noqa: E402
from amqtransport.testing.broker_pair import BrokerPair  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def disk_fdatasync(directory: Path, n: int) -> list[float]:
    """Seconds of each ``fdatasync`` after a 256-byte append, in ``directory``."""
    path = directory / "fdatasync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        out = []
        for _ in range(n):
            os.write(fd, BODY)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        os.close(fd)
        path.unlink()


def window_one(port: int, dest: str, n: int) -> list[float]:
    """Seconds from each SEND written to its RECEIPT read, one at a time."""
    frames = [serialize(Frame.make("SEND", {"destination": dest, "persistent": "true", "receipt": str(i)}, BODY))
              for i in range(n)]
    c = RawClient(port)
    try:
        out = []
        for data in frames:
            t0 = time.perf_counter()
            c.sock.sendall(data)
            f = c.next_frame()
            out.append(time.perf_counter() - t0)
            if f.command != "RECEIPT":
                raise RuntimeError(f"unexpected {f.command}: {f.get('message')}")
        return out
    finally:
        c.close()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else scale(1000, 200)
    rounds = 1 if quick() else int(os.environ.get("AMQ_BENCH_ROUNDS", "2"))
    work = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    stops: list[Callable[[], object]] = []
    targets: dict[str, int] = {}
    samples: dict[str, list[float]] = {}
    try:
        single = BrokerProcess(work / "single", log_dir=work / "single-log")
        single.start()
        stops.append(single.terminate)
        targets["single"] = single.port
        for mode in ("replicated", "shared-store"):
            pair = BrokerPair(mode, work / mode)
            pair.start()
            stops.append(pair.stop)
            master = pair.wait_master(60)
            if mode == "replicated":
                pair.wait_in_sync(60)
            targets[mode] = master.port
        amq = start_activemq(work / "activemq")
        if amq is not None:
            stops.append(amq[1])
            targets["ActiveMQ"] = amq[0]
        for name in ("disk", *targets):
            samples[name] = []
        for r in range(rounds):
            samples["disk"] += disk_fdatasync(work, n)
            for name, port in targets.items():
                window_one(port, f"/queue/latency.warm.{r}", max(20, n // 20))
                samples[name] += window_one(port, f"/queue/latency.{r}", n)
    finally:
        for stop in reversed(stops):
            stop()
    rows = []
    for name, values in samples.items():
        rows.append({"target": name, "p50 ms": round(statistics.median(values) * 1000, 3),
                     "p99 ms": round(percentile(values, 0.99) * 1000, 3),
                     "msg/s": round(len(values) / sum(values)) if name != "disk" else None})
    print_table(rows, title=f"window-1 receipts, {n} x {rounds} rounds, 256-byte persistent SENDs (load "
                            f"{os.getloadavg()[0]:.1f})")
    p50 = {name: statistics.median(v) * 1000 for name, v in samples.items()}
    rate = {name: len(v) / sum(v) for name, v in samples.items()}
    # (goal, measured, bound, lower is better)
    goals = [("single p50 ms <= 2 x disk p50 + 0.05", p50["single"], 2 * p50["disk"] + 0.05, True),
             ("replicated p50 ms <= 1.5 x single p50", p50["replicated"], 1.5 * p50["single"], True),
             ("shared-store p50 ms <= 1.1 x single p50", p50["shared-store"], 1.1 * p50["single"], True)]
    if "ActiveMQ" in rate:
        goals.append(("single msg/s >= 2 x ActiveMQ msg/s", rate["single"], 2 * rate["ActiveMQ"], False))
    print_table([{"goal": g, "measured": round(a, 3), "bound": round(b, 3),
                  "met": "yes" if (a <= b if lower else a >= b) else "no"} for g, a, b, lower in goals],
                title="issue 27 goals")

if __name__ == "__main__":
    main()
