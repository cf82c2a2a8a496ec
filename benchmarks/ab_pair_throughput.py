"""A/B of a replicated pair's pipelined throughput: this checkout's pair against the pair of
another checkout (before/after a change), in the same run.

Run: AMQ_BENCH_BASELINE=DIR .venv/bin/python benchmarks/ab_pair_throughput.py [N]
(N receipted sends per round, default 5000; AMQ_BENCH_ROUNDS=R, default 8)

Two replicated pairs (``amq broker pair``'s nodes, in sync), one running this checkout's
code and one DIR's (``PYTHONPATH`` of their processes). Each round sends N persistent
256-byte messages through the failover URI of one pair with a pipelined producer (window
100, a receipt for each: :func:`bench_ha.throughput`), then the same to the other; the
order alternates round by round, so a burst of other load falls on both alike. Prints
each round's msg/s and the medians.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, quick, scale, work_dir, write_result  # noqa: E402
from bench_ha import throughput  # noqa: E402

from amqtransport.testing.broker_pair import BrokerPair  # noqa: E402


def main() -> None:
    baseline = os.environ.get("AMQ_BENCH_BASELINE")
    if not baseline:
        print("ab_pair_throughput: set AMQ_BENCH_BASELINE to the checkout to compare with")
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else scale(5000, 500)
    rounds = 2 if quick() else int(os.environ.get("AMQ_BENCH_ROUNDS", "8"))
    here = str(Path(__file__).resolve().parent.parent)
    builds = {"this checkout": here, "baseline": str(Path(baseline).resolve())}
    work = work_dir("ab-pair-throughput-")
    os.chdir(work)  # `python -m` puts the working directory first on a child's path: a neutral one
    stops: list[Callable[[], object]] = []
    pairs: dict[str, BrokerPair] = {}
    try:
        for name, path in builds.items():
            os.environ["PYTHONPATH"] = path  # the pair's processes run this build's code
            pair = BrokerPair("replicated", work / name.replace(" ", "-"))
            pair.start()
            stops.append(pair.stop)
            pair.wait_master(60)
            pair.wait_in_sync(60)
            pairs[name] = pair
        rates: dict[str, list[float]] = {name: [] for name in builds}
        for r in range(rounds):
            for name in list(builds) if r % 2 == 0 else list(builds)[::-1]:
                rates[name].append(throughput(pairs[name].uri, n, 100))
    finally:
        for stop in reversed(stops):
            stop()
    load = os.getloadavg()[0]
    rows = [{"pair": name, "median msg/s": round(statistics.median(v)), "rounds msg/s": " ".join(f"{x:.0f}" for x in v)}
            for name, v in rates.items()]
    print_table(rows, title=f"replicated pair, pipelined receipted sends (window 100), {n} per round, "
                            f"{rounds} rounds alternating (load {load:.1f})")
    ratio = statistics.median(rates["this checkout"]) / statistics.median(rates["baseline"])
    print(f"this checkout / baseline: {ratio:.3f}")
    write_result("ab_pair_throughput", rows, headline={"this checkout / baseline": round(ratio, 3)},
                 notes=f"n={n}, rounds={rounds}, load={load:.1f}, baseline={baseline}")


if __name__ == "__main__":
    main()
