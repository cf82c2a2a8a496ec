"""The client against RabbitMQ (Debian's rabbitmq-server 3.10, STOMP plugin): throughput
against stomp.py on the same node, against our broker, and recovery through kill -9.

Run: .venv/bin/python benchmarks/bench_rabbitmq.py      (AMQ_BENCH_QUICK=1 for a smoke run)

1. Pipelined receipted sends (``producer(window=100)``, persistent 256-byte bodies: each
   receipt is a publisher confirm) against a receipt-per-send loop with stomp.py 8
   (vhost ``/``, guest/guest), alternating rounds on one RabbitMQ node.
2. Our receipt-per-send ``Connection.send`` loop against the same stomp.py loop: the
   client's own cost where both wait for one confirm per message.
3. The same pipelined producer into RabbitMQ and into our broker (a real process,
   fsync on), alternating rounds: which broker the client drives faster here.
4. The node itself: spawn -> STOMP CONNECTED (a restart on the same directory), and
   kill -9 -> first receipted send through ``failover:`` by a client sending from the
   moment of the kill (the restart is started right after the kill).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import compare, machine, print_table, quick, scale, work_dir, write_result  # noqa: E402
from bench_client import producer_rate, send_loop_rate, stomppy_receipt_loop_rate  # noqa: E402

from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402
from amqtransport.testing.rabbitmq import RabbitMQNode, missing_reason  # noqa: E402


def main() -> None:
    reason = missing_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return
    rounds = 3 if quick() else 5
    n_pipe, n_loop = scale(10000, 500), scale(1000, 100)
    rows: list[dict[str, Any]] = []
    spread: list[dict[str, Any]] = []
    tmp = work_dir("bench-rabbitmq-")
    node = RabbitMQNode(tmp, "bench")
    node.start()
    try:
        port = node.stomp_port

        def stomppy() -> float:
            return stomppy_receipt_loop_rate(port, n_loop, vhost="/", login="guest", passcode="guest")

        producer_rate(node.uri, 200)  # warm up
        c = compare(lambda: producer_rate(node.uri, n_pipe), stomppy, rounds=rounds)
        rows.append({"case": f"RabbitMQ: pipelined receipts (window 100, {n_pipe} msgs) vs stomp.py receipt loop",
                     "ours msg/s": c.ours, "peer msg/s": c.peer, "ratio": c.ratio, "better": "higher"})
        c = compare(lambda: send_loop_rate(node.uri, n_loop), stomppy, rounds=rounds)
        rows.append({"case": "RabbitMQ: Connection.send (one receipt per send) vs the same stomp.py loop",
                     "ours msg/s": c.ours, "peer msg/s": c.peer, "ratio": c.ratio, "better": "higher"})
        with BrokerProcess(tmp / "amq-data", log_dir=tmp / "amq-logs") as ours:
            producer_rate(ours.uri, 200)
            c = compare(lambda: producer_rate(node.uri, n_pipe), lambda: producer_rate(ours.uri, n_pipe),
                        rounds=rounds)
            rows.append({"case": "pipelined producer: into RabbitMQ vs into our broker",
                         "ours msg/s": c.ours, "peer msg/s": c.peer, "ratio": c.ratio,
                         "better": "(RabbitMQ / ours)"})
        starts: list[float] = []
        recoveries: list[float] = []
        for _ in range(rounds):
            node.kill()
            t0 = time.perf_counter()
            node.start()
            starts.append(time.perf_counter() - t0)
        uri = f"failover:({node.uri})?initialReconnectDelay=50&maxReconnectDelay=500"
        import amqtransport

        for _ in range(rounds):
            with amqtransport.connect(uri) as conn:
                conn.send("/queue/bench.recovery", "before")
                restarter = threading.Thread(target=node.start)
                t0 = time.perf_counter()
                node.kill()
                restarter.start()
                conn.send("/queue/bench.recovery", "after")
                recoveries.append(time.perf_counter() - t0)
                restarter.join(120)
        for label, values in (("node restart: spawn -> STOMP CONNECTED, s", starts),
                              ("kill -9 -> first receipted send (restart included), s", recoveries)):
            values = sorted(values)
            spread.append({"case": label, "min": values[0], "median": values[len(values) // 2],
                           "max": values[-1], "rounds": len(values)})
    finally:
        node.stop()
    print_table(rows, ["case", "ours msg/s", "peer msg/s", "ratio", "better"], title="RabbitMQ: ratios")
    print_table(spread, ["case", "min", "median", "max", "rounds"], title="RabbitMQ: the node")
    write_result("rabbitmq", [*rows, *spread],
                 headline={"pipelined/stomp.py": rows[0]["ratio"], "kill -9 recovery s": spread[1]["median"]},
                 notes=f"RabbitMQ via amqtransport.testing.rabbitmq; machine {machine().get('cpu')}")


if __name__ == "__main__":
    main()
