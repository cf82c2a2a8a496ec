"""A priority queue of mixed priorities: our broker against ActiveMQ Classic 5.17
(``prioritizedMessages`` on), same client, same run.

Run: .venv/bin/python benchmarks/bench_priority.py [N]
(N = 100,000 by default; AMQ_BENCH_QUICK=1 for a smoke run; AMQ_BENCH_ROUNDS=R, default 3;
AMQ_BENCH_BASELINE=DIR adds our broker run from another checkout, e.g. before a change,
as ``baseline``)

Per round and broker, on a fresh queue:

* ``send`` -- N persistent 256-byte SENDs, priorities 0-9 drawn from a seeded random
  generator (the same for both), fire-and-forget, then one last SEND with a receipt:
  the clock stops when the broker has processed (ours: persisted) every message.
* ``consume`` -- one auto-ack subscription, prefetch 1000, drains the N waiting messages.

For each phase: messages/s, and the broker's CPU per message (user + system time of
its process from ``/proc/PID/stat`` over the phase, JVM threads included, divided by
N). ``rises`` counts the deliveries whose priority is higher than the one before: 0 is
a perfect priority order; FIFO over random priorities gives about 45 % of N. Rounds
alternate (ours, ActiveMQ, ours, ...); the table gives medians.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, print_table, quick, ratio, scale, work_dir, write_result  # noqa: E402
from bench_broker import RawClient, activemq_node  # noqa: E402

from amqtransport.processes.broker import BrokerProcess  # noqa: E402
from amqtransport.stomp import Frame, serialize  # noqa: E402

BODY = b"x" * 256
PRIORITY_POLICY = """    <destinationPolicy><policyMap><policyEntries>
      <policyEntry queue=">" prioritizedMessages="true"/>
    </policyEntries></policyMap></destinationPolicy>"""
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def send(port: int, dest: str, priorities: list[int]) -> float:
    frames = [serialize(Frame.make("SEND", [("destination", dest), ("persistent", "true"), ("priority", str(p))],
                                   BODY)) for p in priorities[:-1]]
    last = serialize(Frame.make("SEND", [("destination", dest), ("persistent", "true"),
                                         ("priority", str(priorities[-1])), ("receipt", "last")], BODY))
    c = RawClient(port)
    try:
        t0 = time.perf_counter()
        for i in range(0, len(frames), 256):
            c.sock.sendall(b"".join(frames[i : i + 256]))
        c.sock.sendall(last)
        f = c.next_frame()
        if f.command != "RECEIPT":
            raise RuntimeError(f"unexpected {f.command}: {f.get('message')}")
        return len(priorities) / (time.perf_counter() - t0)
    finally:
        c.close()


def consume(port: int, dest: str, n: int) -> tuple[float, int]:
    """Messages/s of draining ``n`` messages, and how many came with a higher priority
    than the one before."""
    c = RawClient(port)
    try:
        sub = {"destination": dest, "id": "1", "ack": "auto", "activemq.prefetchSize": "1000"}
        t0 = time.perf_counter()
        c.sock.sendall(serialize(Frame.make("SUBSCRIBE", sub)))
        got, rises, prev = 0, 0, 9
        while got < n:
            for f in c.next_frames():
                if f.command != "MESSAGE":
                    raise RuntimeError(f"unexpected {f.command}: {f.get('message')}")
                p = int(f.get("priority") or 4)
                rises += p > prev
                prev = p
                got += 1
        return n / (time.perf_counter() - t0), rises
    finally:
        c.close()


def baseline_env(checkout: str) -> dict[str, str]:
    """The environment of a broker process running another checkout's code: first on the
    path, and no working directory before it (``python -m`` puts the current directory
    first, which, run from this repository's root, would be this checkout again)."""
    return {**os.environ, "PYTHONPATH": str(Path(checkout).resolve()), "PYTHONSAFEPATH": "1"}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else scale(100_000, 5000)
    rounds = int(os.environ.get("AMQ_BENCH_ROUNDS", "3")) if not quick() else 1
    rng = random.Random(20261126)
    priorities = [rng.randrange(10) for _ in range(n)]
    work = work_dir("bench-priority-")
    ours = BrokerProcess(work / "ours", log_dir=work)
    ours.start()
    contenders: list[tuple[str, int, int]] = [("ours", ours.port, ours.pid)]
    stops: list[Any] = [ours.terminate]
    try:
        baseline_dir = os.environ.get("AMQ_BENCH_BASELINE")  # another checkout of ours (before/after a change)
        if baseline_dir:
            base = BrokerProcess(work / "baseline", log_dir=work / "baseline-log", env=baseline_env(baseline_dir))
            base.start()
            stops.append(base.terminate)
            contenders.append(("baseline", base.port, base.pid))
        node = activemq_node(work / "activemq", "bench", "1g", extra_xml=PRIORITY_POLICY)
        if node is not None:
            node.start()
            stops.append(node.stop)
            assert node.pid is not None
            contenders.append(("ActiveMQ", node.stomp_port, node.pid))
        counter = [0]
        for _name, port, _pid in contenders:  # warm up (JIT, imports)
            counter[0] += 1
            send(port, f"/queue/prio.warm{counter[0]}", priorities[:5000])
            consume(port, f"/queue/prio.warm{counter[0]}", 5000)
        runs: dict[str, dict[str, list[float]]] = {
            name: {k: [] for k in ("send", "send cpu", "consume", "consume cpu", "rises")} for name, _, _ in contenders}
        for _ in range(rounds):
            for name, port, pid in contenders:
                counter[0] += 1
                dest = f"/queue/prio.{counter[0]}"
                c0 = cpu_seconds(pid)
                rate = send(port, dest, priorities)
                c1 = cpu_seconds(pid)
                crate, rises = consume(port, dest, n)
                c2 = cpu_seconds(pid)
                r = runs[name]
                r["send"].append(rate)
                r["send cpu"].append((c1 - c0) / n * 1e6)
                r["consume"].append(crate)
                r["consume cpu"].append((c2 - c1) / n * 1e6)
                r["rises"].append(rises)
    finally:
        for stop in reversed(stops):
            stop()
    rows = []
    for phase, cpu in (("send", "send cpu"), ("consume", "consume cpu")):
        row: dict[str, object] = {"phase": phase}
        for name, r in runs.items():
            row[f"{name} msg/s"] = statistics.median(r[phase])
            row[f"{name} CPU µs/msg"] = round(statistics.median(r[cpu]), 1)
        if "ActiveMQ" in runs:
            row["ours/ActiveMQ msg/s"] = ratio(statistics.median(runs["ours"][phase]),
                                               statistics.median(runs["ActiveMQ"][phase]))
        for name, r in runs.items():  # the order of delivery, measured while consuming
            row[f"{name} rises"] = [int(x) for x in r["rises"]] if phase == "consume" else "-"
        for name, r in runs.items():
            row[f"{name} all"] = [round(x) for x in r[phase]]
        rows.append(row)
    print_table(rows, title=f"priority queue: {n} persistent 256-byte messages, priorities 0-9, {rounds} rounds, median")
    headline = {f"{r['phase']} ours/ActiveMQ": r.get("ours/ActiveMQ msg/s") for r in rows}
    write_result("priority", rows, headline=headline, notes=f"n={n}; machine={machine().get('cpu')}")


if __name__ == "__main__":
    main()
