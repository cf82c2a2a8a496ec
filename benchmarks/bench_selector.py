"""A selective consumer on a deep queue: our broker against ActiveMQ Classic 5.17,
same client, same run.

Run: .venv/bin/python benchmarks/bench_selector.py [N] [--quick]
(N = 100,000 by default; ``--quick`` or AMQ_BENCH_QUICK=1: N = 5,000 and one round
for a smoke run; AMQ_BENCH_ROUNDS=R, default 3; AMQ_BENCH_BASELINE=DIR adds our broker
run from another checkout, e.g. before a change, as ``baseline``)

Per round and broker, on a fresh queue:

* ``fill`` -- N persistent 256-byte SENDs, fire-and-forget, then one receipted SEND;
  one in 100 carries the property ``k = 'hit'``, the others ``k = 'miss'`` (so
  N / 100 match).
* ``drain`` -- one client-individual subscription with ``selector: k = 'hit'``
  (prefetch 1000) takes the N / 100 matches, acking each: the clock runs from the
  SUBSCRIBE to the last match. The other 99 % stay in the queue.

Contenders: our broker with its defaults (``page_window`` 1000: the rest of the queue
is paged to the journal at SEND; the selective consumer's queue scans it there,
broker/dispatch/scan.py: only the records holding ``k`` = ``hit`` are read back), the
same with ``page_window`` = 2 N (``ours resident``: the whole queue stays in memory, as
ActiveMQ's here, each message evaluated as a resident one) and ActiveMQ 5.17 with
``maxPageSize`` = 2 N (see ``PAGE_POLICY``).

For each phase: messages/s (the drain's per match) and the broker's CPU per message
(user + system time of its process from ``/proc/PID/stat`` over the phase, JVM threads
included; the drain's per *match*, so it carries the cost of passing over the 99
misses per match). Rounds alternate (ours, ActiveMQ, ours, ...); the table gives
medians. The queue is left with its N - N / 100 misses (each round uses a new one).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, print_table, quick, ratio, work_dir, write_result  # noqa: E402
from bench_broker import RawClient, activemq_node  # noqa: E402
from bench_priority import baseline_env, cpu_seconds  # noqa: E402

from amqtransport.processes.broker import BrokerProcess  # noqa: E402
from amqtransport.stomp import Frame, serialize  # noqa: E402

BODY = b"x" * 256
EVERY = 100  # one message in EVERY matches
SELECTOR = "k = 'hit'"
RESIDENT = "ours resident"  # ours with page_window = 2 N: nothing paged
#: ActiveMQ pages ``maxPageSize`` (default 200) messages of a queue in for dispatch and
#: pages more only as those leave: 198 misses per page starve a 1 % selector after its
#: first two matches (measured: 2 of 20 delivered, then nothing). Its documented
#: remedy, a page as large as the queue, is what it runs with here.
PAGE_POLICY = """    <destinationPolicy><policyMap><policyEntries>
      <policyEntry queue=">" maxPageSize="{page}"/>
    </policyEntries></policyMap></destinationPolicy>"""


def fill(port: int, dest: str, n: int) -> float:
    """Send ``n`` messages (one in EVERY a hit); messages/s until the last receipt."""
    def frame(i: int) -> bytes:
        headers = [("destination", dest), ("persistent", "true"), ("k", "hit" if i % EVERY == EVERY - 1 else "miss")]
        if i == n - 1:
            headers.append(("receipt", "last"))
        return serialize(Frame.make("SEND", headers, BODY))

    frames = [frame(i) for i in range(n - 1)]
    last = frame(n - 1)
    c = RawClient(port)
    try:
        t0 = time.perf_counter()
        for i in range(0, len(frames), 256):
            c.sock.sendall(b"".join(frames[i : i + 256]))
        c.sock.sendall(last)
        f = c.next_frame()
        if f.command != "RECEIPT":
            raise RuntimeError(f"unexpected {f.command}: {f.get('message')}")
        return n / (time.perf_counter() - t0)
    finally:
        c.close()


def drain(port: int, dest: str, matches: int) -> float:
    """Matches/s of a selective client-individual consumer taking ``matches`` messages."""
    c = RawClient(port)
    try:
        sub = {"destination": dest, "id": "1", "ack": "client-individual", "activemq.prefetchSize": "1000",
               "selector": SELECTOR}
        t0 = time.perf_counter()
        c.sock.sendall(serialize(Frame.make("SUBSCRIBE", sub)))
        got = 0
        while got < matches:
            acks = []
            for f in c.next_frames():
                if f.command != "MESSAGE":
                    raise RuntimeError(f"unexpected {f.command}: {f.get('message')}")
                if f.get("k") != "hit":
                    raise RuntimeError(f"the selector {SELECTOR!r} let through k={f.get('k')!r}")
                acks.append(serialize(Frame.make("ACK", {"id": f.get("ack") or ""})))
                got += 1
            c.sock.sendall(b"".join(acks))
        return matches / (time.perf_counter() - t0)
    finally:
        c.close()


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--quick"]
    short = quick() or "--quick" in sys.argv[1:]
    n = int(args[0]) if args else (5000 if short else 100_000)
    rounds = 1 if short else int(os.environ.get("AMQ_BENCH_ROUNDS", "3"))
    matches = n // EVERY
    work = work_dir("bench-selector-")
    ours = BrokerProcess(work / "ours", log_dir=work)
    ours.start()
    contenders: list[tuple[str, int, int]] = [("ours", ours.port, ours.pid)]
    stops: list[Any] = [ours.terminate]
    runs: dict[str, dict[str, list[float]]] = {}
    try:
        baseline_dir = os.environ.get("AMQ_BENCH_BASELINE")  # another checkout of ours (before/after a change)
        if baseline_dir:
            base = BrokerProcess(work / "baseline", log_dir=work / "baseline-log", env=baseline_env(baseline_dir))
            base.start()
            stops.append(base.terminate)
            contenders.append(("baseline", base.port, base.pid))
        # the same broker with the whole queue resident (as ActiveMQ runs here)
        config = work / "resident.toml"
        config.write_text(f"page_window = {2 * n}\n", encoding="utf-8")
        resident = BrokerProcess(work / "resident", args=["--config", str(config)], log_dir=work)
        resident.start()
        stops.append(resident.terminate)
        contenders.append((RESIDENT, resident.port, resident.pid))
        node = activemq_node(work / "activemq", "bench", "1g", extra_xml=PAGE_POLICY.format(page=2 * n))
        if node is not None:
            node.start()
            stops.append(node.stop)
            assert node.pid is not None
            contenders.append(("ActiveMQ", node.stomp_port, node.pid))
        counter = 0
        for _name, port, _pid in contenders:  # warm up (JIT, imports)
            counter += 1
            fill(port, f"/queue/sel.warm{counter}", 2000)
            drain(port, f"/queue/sel.warm{counter}", 2000 // EVERY)
        runs = {name: {k: [] for k in ("fill", "fill cpu", "drain", "drain cpu")} for name, _, _ in contenders}
        for _ in range(rounds):
            for name, port, pid in contenders:
                counter += 1
                dest = f"/queue/sel.{counter}"
                c0 = cpu_seconds(pid)
                rate = fill(port, dest, n)
                c1 = cpu_seconds(pid)
                drate = drain(port, dest, matches)
                c2 = cpu_seconds(pid)
                r = runs[name]
                r["fill"].append(rate)
                r["fill cpu"].append((c1 - c0) / n * 1e6)
                r["drain"].append(drate)
                r["drain cpu"].append((c2 - c1) / matches * 1e6)
    finally:
        for stop in reversed(stops):
            stop()
    rows = []
    for phase, cpu, what in (("fill", "fill cpu", f"fill ({n} messages, 1 % hits)"),
                             ("drain", "drain cpu", f"drain ({matches} matches, selector {SELECTOR})")):
        row: dict[str, object] = {"phase": what}
        for name, r in runs.items():
            row[f"{name} msg/s"] = statistics.median(r[phase])
            row[f"{name} CPU µs/msg"] = round(statistics.median(r[cpu]), 1)
        if "ActiveMQ" in runs:
            for name in ("ours", RESIDENT):
                row[f"{name}/ActiveMQ msg/s"] = ratio(statistics.median(runs[name][phase]),
                                                      statistics.median(runs["ActiveMQ"][phase]))
        for name, r in runs.items():
            row[f"{name} all"] = [round(x) for x in r[phase]]
        rows.append(row)
    print_table(rows, title=f"selective consumer: {n} persistent 256-byte messages, 1 in {EVERY} matching, "
                            f"{rounds} rounds, median")
    headline = {f"{p} {name}/ActiveMQ": r.get(f"{name}/ActiveMQ msg/s")
                for p, r in zip(("fill", "drain"), rows, strict=True) for name in ("ours", RESIDENT)}
    write_result("selector", rows, headline=headline, notes=f"n={n}; machine={machine().get('cpu')}")


if __name__ == "__main__":
    main()
