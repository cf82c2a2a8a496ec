"""Where the scheduler puts a replicated pair's two nodes, and what the receipt latency pays for it.

Run: .venv/bin/python benchmarks/bench_pair_placement.py [N]   (N window-1 sends per placement,
default 2000; AMQ_BENCH_QUICK=1: a smoke run)

One replicated pair (``amq broker pair``'s nodes, in sync), one raw-socket client sending one
persistent 256-byte SEND at a time (:func:`bench_client_latency.timed_receipts`), and between
chunks of 50 sends the nodes are re-pinned (``os.sched_setaffinity`` of every thread) to one
of the placements below, in a rotating order, so that every placement sees the same pair,
the same journal and the same moment's load:

* ``free``: both nodes may run anywhere (the default);
* ``master 0, slave 1``: a core each, as on two hosts;
* ``master 0-1, slave 1``: only the slave confined;
* ``master 0, slave 0-1``: only the master confined.

On this 2-core machine the master's write of each record to the slave wakes the slave on
the master's core (loopback TCP), while the other core idles; confining the master to one
core is what avoids it (BENCHMARKS.md, "A pair on one machine shares its two cores").
Needs at least two CPUs.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import pin, print_table, quick, scale, work_dir, write_result  # noqa: E402
from bench_broker import RawClient  # noqa: E402
from bench_client_latency import percentile, send_frames, timed_receipts  # noqa: E402

from amqtransport.testing.broker_pair import BrokerPair  # noqa: E402

#: sends between two re-pinnings
CHUNK = 50


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else scale(2000, 200)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("bench_pair_placement: needs two CPUs; this process may use", cpus)
        return
    a, b = cpus[0], cpus[1]
    both = {a, b}
    placements: dict[str, tuple[set[int], set[int]]] = {  # name -> (master's CPUs, slave's CPUs)
        "free": (both, both), f"master {a}, slave {b}": ({a}, {b}),
        f"master {a}-{b}, slave {b}": (both, {b}), f"master {a}, slave {a}-{b}": ({a}, both)}
    n = max(CHUNK, n // CHUNK * CHUNK)
    pair = BrokerPair("replicated", work_dir("bench-pair-placement-") / "pair")
    pair.start()
    try:
        master = pair.wait_master(60)
        pair.wait_in_sync(60)
        slave = pair.other(master)
        client = RawClient(master.port)
        frames = send_frames("/queue/placement", n * len(placements) + 200)
        timed_receipts(client, frames[:200])  # warm-up
        at = 200
        samples: dict[str, list[float]] = {name: [] for name in placements}
        names = list(placements)
        for k in range(n // CHUNK):
            for name in names[k % len(names):] + names[: k % len(names)]:
                pin(master.pid, placements[name][0])
                pin(slave.pid, placements[name][1])
                samples[name] += timed_receipts(client, frames[at : at + CHUNK])
                at += CHUNK
        client.close()
    finally:
        pair.stop()
    load = os.getloadavg()[0]
    rows = [{"placement": name, "p50 ms": round(statistics.median(v) * 1000, 3),
             "p99 ms": round(percentile(v, 0.99) * 1000, 3), "msg/s": round(len(v) / sum(v))}
            for name, v in samples.items()]
    print_table(rows, title=f"replicated pair, window-1 receipts, {n} per placement, re-pinned every {CHUNK} "
                            f"(load {load:.1f})")
    write_result("pair_placement", rows, headline={str(r["placement"]): r["p50 ms"] for r in rows},
                 notes=f"n={n}, load={load:.1f}, quick={quick()}")


if __name__ == "__main__":
    main()
