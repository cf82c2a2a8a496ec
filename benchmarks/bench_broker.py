"""Broker throughput: our embedded broker against ActiveMQ Classic 5.17, same client, same run.

Run: .venv/bin/python benchmarks/bench_broker.py [N]
(AMQ_BENCH_QUICK=1 for a smoke run; AMQ_BENCH_ROUNDS=R, default 5;
AMQ_BENCH_BASELINE=DIR also runs our broker from the checkout DIR -- another version of
the code, e.g. ``git worktree add --detach DIR main`` -- in the same rounds, and the
table adds ``ours / baseline``)

Workloads (persistent 256-byte SENDs to a fresh queue per round, one connection):

* ``receipt, window W`` -- a receipt per message, at most W receipts outstanding
  (pipelined); the rate counts receipted messages (for us: fsynced).
* ``receipt, window 1`` -- one message at a time (latency-bound: one fsync each).
* ``fire-and-forget`` -- no receipts, then one last SEND with a receipt so that the
  clock stops when the broker has processed (and, for ours, persisted) every message.
* ``consume`` -- N messages waiting (sent fire-and-forget, not timed), then one
  auto-ack subscription with a prefetch of 1000 drains them: the broker's MESSAGE path.

The client is a raw socket with our sans-IO codec; all frames are serialized before
the clock starts, so the client's CPU cost is the same small loop for both brokers.
Ours runs as a real process (``amq broker run``, fsync on), ActiveMQ as Debian's
5.17 (KahaDB, journal disk syncs on -- its default). Rounds alternate (ours, peer, ...)
and the table reports the medians and ``ours / ActiveMQ`` (higher is better).
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, print_table, quick, ratio, scale, work_dir, write_result  # noqa: E402

from amqtransport.stomp import Frame, FrameParser, serialize  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402

BODY = b"x" * 256


class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser("1.2")
        self.sock.sendall(serialize(Frame.make("CONNECT", {"accept-version": "1.2", "host": "localhost"})))
        f = self.next_frame()
        assert f.command == "CONNECTED", f

    def next_frames(self) -> list[Frame]:
        while True:
            frames = [e for e in self.parser.events() if isinstance(e, Frame)]
            if frames:
                return frames
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.parser.feed(data)

    def next_frame(self) -> Frame:
        return self.next_frames()[0]

    def close(self) -> None:
        try:
            self.sock.sendall(serialize(Frame.make("DISCONNECT", {})))
        except OSError:
            pass
        self.sock.close()


def _frames(dest: str, n: int, receipts: bool) -> list[bytes]:
    out = []
    for i in range(n):
        headers = [("destination", dest), ("persistent", "true")]
        if receipts:
            headers.append(("receipt", str(i)))
        out.append(serialize(Frame.make("SEND", headers, BODY)))
    return out


def pipelined(port: int, dest: str, n: int, window: int) -> float:
    return pipelined_frames(port, _frames(dest, n, receipts=True), window)


def pipelined_frames(port: int, frames: list[bytes], window: int) -> float:
    """Messages/s of sending ``frames`` (each asking for a receipt) with at most
    ``window`` receipts outstanding."""
    n = len(frames)
    c = RawClient(port)
    try:
        sent = done = 0
        t0 = time.perf_counter()
        while done < n:
            if sent < n and sent - done < window:
                upto = min(n, done + window)
                c.sock.sendall(b"".join(frames[sent:upto]))
                sent = upto
            for f in c.next_frames():
                if f.command != "RECEIPT":
                    raise RuntimeError(f"unexpected {f.command}: {f.get('message')}")
                done += 1
        return n / (time.perf_counter() - t0)
    finally:
        c.close()


def fire_and_forget(port: int, dest: str, n: int) -> float:
    frames = _frames(dest, n, receipts=False)
    last = serialize(Frame.make("SEND", {"destination": dest, "persistent": "true", "receipt": "last"}, BODY))
    c = RawClient(port)
    try:
        t0 = time.perf_counter()
        chunk = 256
        for i in range(0, n, chunk):
            c.sock.sendall(b"".join(frames[i : i + chunk]))
        c.sock.sendall(last)
        f = c.next_frame()
        if f.command != "RECEIPT":
            raise RuntimeError(f"unexpected {f.command}: {f.get('message')}")
        return (n + 1) / (time.perf_counter() - t0)
    finally:
        c.close()


def consume(port: int, dest: str, n: int, prefetch: int = 1000) -> float:
    """Messages/s of draining ``n`` waiting messages with one auto-ack subscription."""
    fire_and_forget(port, dest, n - 1)  # n - 1 plus the receipted last one: n waiting
    c = RawClient(port)
    try:
        sub = {"destination": dest, "id": "1", "ack": "auto", "activemq.prefetchSize": str(prefetch)}
        t0 = time.perf_counter()
        c.sock.sendall(serialize(Frame.make("SUBSCRIBE", sub)))
        got = 0
        while got < n:
            for f in c.next_frames():
                if f.command != "MESSAGE":
                    raise RuntimeError(f"unexpected {f.command}: {f.get('message')}")
                got += 1
        return n / (time.perf_counter() - t0)
    finally:
        c.close()


def activemq_node(workdir: Path, name: str, heap: str, extra_xml: str = "") -> Any:
    """An (unstarted) ``ActiveMQNode``, or None (with the reason printed) when ActiveMQ
    is not installed."""
    try:
        from amqtransport.processes.activemq import ActiveMQNode, missing_reason
    except ImportError as exc:  # pragma: no cover - the harness is part of the project
        print(f"ActiveMQ harness unavailable: {exc}")
        return None
    reason = missing_reason()
    if reason is not None:
        print(f"skipped ActiveMQ: {reason}")
        return None
    return ActiveMQNode(workdir, name, heap=heap, extra_xml=extra_xml)


def start_activemq(workdir: Path) -> tuple[int, Callable[[], None]] | None:
    node = activemq_node(workdir, "bench", "512m")
    if node is None:
        return None
    node.start()
    return node.stomp_port, node.stop


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else scale(20000, 2000)
    n_sync = scale(500, 100)
    rounds = int(os.environ.get("AMQ_BENCH_ROUNDS", "5")) if not quick() else 1
    window = 100
    work = work_dir("bench-broker-")
    baseline_dir = os.environ.get("AMQ_BENCH_BASELINE")
    ours_env = None
    if baseline_dir:
        # a broker child runs `python -m amqtransport` in our working directory, which Python
        # puts first on its path: from a checkout's root the "baseline" ran that checkout's
        # code, not DIR's. So both start from a neutral directory, each with its code first.
        here = str(Path(__file__).resolve().parent.parent)
        ours_env = {"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
        os.chdir(work)
    ours = BrokerProcess(work / "ours", log_dir=work, env=ours_env)
    ours.start()
    contenders: list[tuple[str, int]] = [("ours", ours.port)]
    stops: list[Callable[[], object]] = [ours.terminate]
    try:
        if baseline_dir:
            env = {**os.environ, "PYTHONPATH": str(Path(baseline_dir).resolve())}
            base = BrokerProcess(work / "baseline", log_dir=work / "baseline-log", env=env)
            base.start()
            stops.append(base.terminate)
            contenders.append(("baseline", base.port))
        amq = start_activemq(work / "activemq")
        if amq is not None:
            stops.append(amq[1])
            contenders.append(("ActiveMQ", amq[0]))
        counter = [0]

        def dest() -> str:
            counter[0] += 1
            return f"/queue/bench.{counter[0]}"

        # warm up (JIT for ActiveMQ, imports and page cache for ours)
        for name, port in contenders:
            pipelined(port, dest(), 5000 if name == "ActiveMQ" else 2000, window)
        cases: list[tuple[str, Callable[[int], float]]] = [
            (f"receipt per message, window {window}", lambda port: pipelined(port, dest(), n, window)),
            ("fire-and-forget (+1 final receipt)", lambda port: fire_and_forget(port, dest(), n)),
            ("receipt per message, window 1", lambda port: pipelined(port, dest(), n_sync, 1)),
            ("consume (auto-ack, prefetch 1000)", lambda port: consume(port, dest(), n)),
        ]
        rows = []
        for label, fn in cases:
            runs: dict[str, list[float]] = {name: [] for name, _ in contenders}
            for _ in range(rounds):  # alternate: ours, baseline, ActiveMQ, ours, ...
                for name, port in contenders:
                    runs[name].append(fn(port))
            med = {name: statistics.median(vals) for name, vals in runs.items()}
            row: dict[str, object] = {"workload": label, "ours msg/s": med["ours"]}
            for other in ("ActiveMQ", "baseline"):
                if other in med:
                    row[f"{other} msg/s"] = med[other]
                    row[f"ours/{other}"] = ratio(med["ours"], med[other])
            for name, vals in runs.items():
                row[f"{name} all"] = [round(x) for x in vals]
            rows.append(row)
    finally:
        for stop in reversed(stops):
            stop()
    print_table(rows, title=f"persistent {len(BODY)}-byte sends, n={n} (window 1: n={n_sync}), {rounds} rounds, median")
    headline = {f"{r['workload']} {k}": v for r in rows for k, v in r.items() if k.startswith("ours/")}
    notes = f"n={n}, window={window}; machine={machine().get('cpu')}"
    if baseline_dir:
        notes += f"; baseline={baseline_dir}"
    write_result("broker", rows, headline=headline, notes=notes)


if __name__ == "__main__":
    main()
