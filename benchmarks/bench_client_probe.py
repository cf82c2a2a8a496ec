"""Client reconnect after a broker starts listening: the TCP probe of the back-off
(failover ``probeInterval``, 100 ms) against ActiveMQ's behaviour (``probeInterval=0``),
alternating in the same run.

A failover client waits for a broker that is not there (``initialReconnectDelay=100``,
exponential: its waits are 0.1, 0.2, 0.4, 0.8, 1.6, 3.2 s ...); after ``WAIT`` seconds
a broker process starts on the port; we time from the broker accepting connections
(``BrokerProcess.start()`` returned) to the client's ``connect()`` returning.

Run: .venv/bin/python benchmarks/bench_client_probe.py [ROUNDS]   (WAIT=2.0 by default)
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import tempfile
import threading
import time

import amqtransport
from amqtransport.testing.broker_process import BrokerProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_round(probe_ms: int, wait: float) -> float:
    port = free_port()
    uri = f"failover:(tcp://127.0.0.1:{port})?initialReconnectDelay=100&probeInterval={probe_ms}"
    done: list[float] = []

    def client() -> None:
        conn = amqtransport.connect(uri)
        done.append(time.monotonic())
        conn.close()

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    time.sleep(wait)
    with tempfile.TemporaryDirectory() as data, BrokerProcess(data, port=port):
        listening = time.monotonic()
        thread.join(60)
    if not done:
        raise SystemExit("the client never connected")
    return max(0.0, done[0] - listening)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    wait = float(os.environ.get("WAIT", "2.0"))
    results: dict[int, list[float]] = {100: [], 0: []}
    for r in range(rounds):
        for probe_ms in (100, 0):
            seconds = one_round(probe_ms, wait)
            results[probe_ms].append(seconds)
            print(f"round {r + 1}/{rounds} probeInterval={probe_ms}: connected {seconds:.3f} s after the broker listened",
                  flush=True)
    print(f"\nbroker up {wait:g} s into the back-off, {rounds} rounds each")
    print("probeInterval  median   min    max")
    for probe_ms, xs in results.items():
        print(f"{probe_ms:>13}  {statistics.median(xs):.3f}  {min(xs):.3f}  {max(xs):.3f}")


if __name__ == "__main__":
    main()
