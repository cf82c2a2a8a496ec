"""HA pair figures: recovery after SIGKILL of the master, and the cost of replication.

Run: .venv/bin/python benchmarks/bench_ha.py   (AMQ_BENCH_QUICK=1: a few rounds each)

- recovery: one client connected through the pair's failover URI
  (``initialReconnectDelay=10&maxReconnectDelay=50``, the same for every pair) has just
  had a receipt; the clock starts, the master is SIGKILLed (``kill -9`` + wait), and the
  clock stops when the next receipted SEND returns. Then the killed node is restarted
  (it rejoins as slave; replicated: resynced) and the next round kills the new master.
  Our replicated pair and our shared-store pair (``--lock-interval 0.1``, the default):
  AMQ_BENCH_KILLS rounds each (default 20); ActiveMQ 5.17 shared-store pair (the
  harness: lockAcquireSleepInterval 500 ms, lockKeepAlivePeriod 2000 ms, as in the
  issue's figure): AMQ_BENCH_AMQ_KILLS rounds (default 5, each costs a JVM restart).
- throughput: receipted persistent 256-byte sends through one connection with a
  pipelined producer (window 100) and with synchronous sends (window 1), replicated
  pair against a single node (``amq broker run``, same fsync), alternating rounds.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import compare, print_table, scale, write_result  # noqa: E402

import amqtransport  # noqa: E402
from amqtransport.processes.activemq import SLAVE_WAITING, ActiveMQPair, missing_reason  # noqa: E402
from amqtransport.testing.broker_pair import BrokerPair  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402

CLIENT_OPTS = "initialReconnectDelay=10&maxReconnectDelay=50&trackMessages=true"
BODY = b"x" * 256


def _uri(base: str) -> str:
    return base + ("&" if "?" in base else "?") + CLIENT_OPTS


def _kill_rounds(uri: str, rounds: int, kill: Callable[[], None], reintroduce: Callable[[], None]) -> list[float]:
    times: list[float] = []
    with amqtransport.connect(uri) as c:
        c.send("/queue/bench.ha", BODY)
        for _ in range(rounds):
            t0 = time.perf_counter()
            kill()
            c.send("/queue/bench.ha", BODY)
            times.append(time.perf_counter() - t0)
            reintroduce()
            c.send("/queue/bench.ha", BODY)
    return times


def recovery_ours(mode: str, base: Path, rounds: int) -> list[float]:
    with BrokerPair(mode, Path(tempfile.mkdtemp(dir=base)), lock_interval=0.1) as bp:
        killed: list[object] = []

        def kill() -> None:
            killed.append(bp.kill_master())

        def reintroduce() -> None:
            node = killed.pop()
            bp.restart(node)  # type: ignore[arg-type]
            if mode == "replicated":
                bp.wait_in_sync(60)
            else:
                node.wait_line("role slave", 60)  # type: ignore[attr-defined]

        return _kill_rounds(_uri(bp.uri), rounds, kill, reintroduce)


def recovery_activemq(base: Path, rounds: int) -> list[float]:
    with ActiveMQPair(Path(tempfile.mkdtemp(dir=base)), 500) as pair:
        killed: list[object] = []

        def kill() -> None:
            killed.append(pair.kill_master())

        def reintroduce() -> None:
            node = killed.pop()
            node.start(wait=False)  # type: ignore[attr-defined]
            node.wait_for_log(SLAVE_WAITING, timeout=60)  # type: ignore[attr-defined]

        return _kill_rounds(_uri(pair.uri), rounds, kill, reintroduce)


def throughput(uri: str, n: int, window: int) -> float:
    with amqtransport.connect(_uri(uri)) as c:
        q = f"/queue/bench.tp.{time.monotonic_ns()}"
        t0 = time.perf_counter()
        if window == 1:
            for _ in range(n):
                c.send(q, BODY)
        else:
            with c.producer(window=window) as p:
                for _ in range(n):
                    p.send(q, BODY)
        return n / (time.perf_counter() - t0)


def _stats(name: str, times: list[float]) -> dict[str, object]:
    return {"case": name, "median s": statistics.median(times), "min s": min(times),
            "max s": max(times), "kills": len(times)}


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="bench-ha-"))
    rows: list[dict[str, object]] = []
    headline: dict[str, object] = {}
    kills = int(os.environ.get("AMQ_BENCH_KILLS") or scale(20, 3))
    amq_kills = int(os.environ.get("AMQ_BENCH_AMQ_KILLS") or scale(5, 1))
    n = scale(5000, 500)
    try:
        rep = recovery_ours("replicated", base, kills)
        rows.append(_stats("recovery, ours replicated pair", rep))
        headline["replicated recovery median s"] = round(statistics.median(rep), 3)
        sh = recovery_ours("shared-store", base, kills)
        rows.append(_stats("recovery, ours shared-store pair (lock poll 0.1 s)", sh))
        headline["shared-store recovery median s"] = round(statistics.median(sh), 3)
        reason = missing_reason()
        if reason:
            print(f"ActiveMQ skipped: {reason}")
        else:
            amq = recovery_activemq(base, amq_kills)
            rows.append(_stats("recovery, ActiveMQ 5.17 shared-store pair (poll 0.5 s, keepalive 2 s)", amq))
            headline["ActiveMQ recovery median s"] = round(statistics.median(amq), 3)
        print_table(rows, title="Recovery: SIGKILL of the master -> next receipted send returns")

        tp_rows: list[dict[str, object]] = []
        with BrokerPair("replicated", Path(tempfile.mkdtemp(dir=base))) as bp, \
                BrokerProcess(Path(tempfile.mkdtemp(dir=base))) as single:
            for window in (100, 1):
                count = n if window > 1 else max(200, n // 5)
                c = compare(lambda: throughput(bp.uri, count, window),  # noqa: B023
                            lambda: throughput(f"failover:({single.uri})", count, window),  # noqa: B023
                            rounds=scale(3, 1))
                tp_rows.append({"case": f"receipted sends, window {window}", "pair msg/s": c.ours,
                                "single msg/s": c.peer, "ratio": c.ratio, "n": count})
                headline[f"replicated/single throughput (window {window})"] = round(c.ratio, 2)
        print_table(tp_rows, title="Throughput: replicated pair vs single node (higher ratio is better)")
        rows += tp_rows
    finally:
        shutil.rmtree(base, ignore_errors=True)
    write_result("ha", rows, headline=headline,
                 notes="recovery = SIGKILL of the master to the next receipted send through failover "
                       f"(client {CLIENT_OPTS}); throughput = receipted persistent 256-byte sends")


if __name__ == "__main__":
    main()
