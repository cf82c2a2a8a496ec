"""What our client's ``conn.send`` adds over a raw socket: window-1 receipted sends,
one at a time, in the same run against the same servers (issue 27: <= 30 us).

Run: .venv/bin/python benchmarks/bench_client_latency.py [N]   (N sends per client per
round, default 2000; AMQ_BENCH_ROUNDS=R rounds, default 5; AMQ_BENCH_QUICK=1: a smoke run;
AMQ_BENCH_SERVERS=echo,broker,broker-fsync picks the servers)

Each contender sends one 256-byte SEND with a receipt, reads the RECEIPT, sends the next
(TCP_NODELAY everywhere); per send it records the wall-clock round trip, and over each
loop the client's CPU time (``time.process_time``: every thread of this process, so a
reader thread counts) and the sending thread's own (``time.thread_time``). Contenders:

* ``raw socket``: frames encoded before the clock starts (the headers our client sends:
  destination, persistent, an idempotency key, receipt), ``sendall``, read the RECEIPT
  with our sans-IO parser on the same thread -- what no client can beat;
* ``sync tcp``: ``amqtransport.connect("tcp://...")`` then ``conn.send(dest, body)``
  (the direct transport: a reader thread completes the receipt);
* ``sync failover``: the same through ``failover:(tcp://...)`` (the thread failover driver);
* ``aio``: ``await conn.send(dest, body)`` of ``amqtransport.aio`` on ``tcp://`` (the
  asyncio failover driver over one endpoint; ``asyncio.run`` in this thread);
* ``stomp.py``: stomp.py's ``Connection12.send(..., receipt)``, waiting for its
  listener's ``on_receipt`` (when stomp.py is installed).

Beside them, the floor of the sync client's shape (a reader thread completes the
receipt the sender waits for): a socketpair round trip read on the sending thread
against one read by a second thread that releases a lock (:func:`thread_handoff`).

Servers (the rounds alternate between the contenders, in a rotated order each round):

* ``echo``: a child process that answers a CONNECT and every ``receipt`` header at once
  (no broker work, no disk): this isolates the client's cost, and its figure is the one
  the goal is checked on;
* ``broker``: our single broker (``amq broker run``), non-persistent sends (the receipt
  does not wait for a disk);
* ``broker-fsync``: the same broker, persistent sends (each receipt waits for an
  fdatasync: the spread of the disk drowns the client's microseconds; shown for scale).

The overhead of a client is its p50 minus the raw socket's p50 against the same server,
over all rounds; beside it the median (and range) of the per-round differences, which
load drift between rounds cannot bias. The loops and the echo server here are the only
ones: ``bench_latency.py`` (its window-1 rows and client rows) and ``bench_client.py`` (its
stomp.py loop) use them.
"""

from __future__ import annotations

import _thread
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, quick, scale, work_dir, write_result  # noqa: E402
from bench_broker import BODY, RawClient  # noqa: E402

import amqtransport  # noqa: E402
import amqtransport.aio as aio  # noqa: E402
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame, serialize  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402

#: the client's CPU seconds over one loop: (process, sending thread)
Cpu = list[tuple[float, float]]
#: ``loop(port, dest, n, persistent=..., cpu=...)``: the seconds of each of ``n`` receipted sends
SendLoop = Callable[..., list[float]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Clocks:
    """The CPU clocks around one measured loop (appended to ``cpu`` when given)."""

    def __init__(self, cpu: Cpu | None) -> None:
        self._cpu = cpu
        self._p0 = time.process_time()
        self._t0 = time.thread_time()

    def stop(self) -> None:
        if self._cpu is not None:
            self._cpu.append((time.process_time() - self._p0, time.thread_time() - self._t0))


def window_one(port: int, dest: str, n: int, *, persistent: bool = True, keyed: bool = False,
               cpu: Cpu | None = None) -> list[float]:
    """Raw socket: seconds from each SEND written to its RECEIPT read, one at a time
    (``keyed``: each SEND carries an idempotency key, as our client's do)."""
    frames = send_frames(dest, n, persistent=persistent, keyed=keyed)
    c = RawClient(port)
    try:
        clocks = _Clocks(cpu)
        out = timed_receipts(c, frames)
        clocks.stop()
        return out
    finally:
        c.close()


def send_frames(dest: str, n: int, *, persistent: bool = True, keyed: bool = False) -> list[bytes]:
    """``n`` serialized SENDs of ``BODY`` to ``dest``, receipts "0" .. "n-1"."""
    flag = "true" if persistent else "false"
    return [serialize(Frame.make("SEND", {"destination": dest, "persistent": flag,
                                          **({IDEMPOTENCY_HEADER: uuid.uuid4().hex} if keyed else {}),
                                          "receipt": str(i)}, BODY))
            for i in range(n)]


def timed_receipts(c: RawClient, frames: list[bytes]) -> list[float]:
    """Seconds from each of ``frames`` written on ``c`` to its RECEIPT read, one at a time."""
    out = []
    for data in frames:
        t0 = time.perf_counter()
        c.sock.sendall(data)
        f = c.next_frame()
        out.append(time.perf_counter() - t0)
        if f.command != "RECEIPT":
            raise RuntimeError(f"unexpected {f.command}: {f.get('message')}")
    return out


def sync_loop(uri: str, dest: str, n: int, *, persistent: bool = True, cpu: Cpu | None = None) -> list[float]:
    """Seconds of each ``conn.send(dest, BODY)`` (receipted) through the sync client on ``uri``."""
    with amqtransport.connect(uri) as conn:
        out = []
        clocks = _Clocks(cpu)
        for _ in range(n):
            t0 = time.perf_counter()
            conn.send(dest, BODY, persistent=persistent)
            out.append(time.perf_counter() - t0)
        clocks.stop()
        return out


def sync_client(port: int, dest: str, n: int, *, persistent: bool = True, cpu: Cpu | None = None) -> list[float]:
    """:func:`sync_loop` on ``tcp://`` (the direct transport)."""
    return sync_loop(f"tcp://127.0.0.1:{port}", dest, n, persistent=persistent, cpu=cpu)


def sync_failover_client(port: int, dest: str, n: int, *, persistent: bool = True,
                         cpu: Cpu | None = None) -> list[float]:
    """:func:`sync_loop` on ``failover:(tcp://...)`` (the thread failover driver)."""
    return sync_loop(f"failover:(tcp://127.0.0.1:{port})", dest, n, persistent=persistent, cpu=cpu)


def aio_client(port: int, dest: str, n: int, *, persistent: bool = True, cpu: Cpu | None = None) -> list[float]:
    """Seconds of each ``await conn.send(dest, BODY)`` (receipted) through the asyncio client."""

    async def run() -> list[float]:
        async with aio.connect(f"tcp://127.0.0.1:{port}") as conn:
            out = []
            clocks = _Clocks(cpu)
            for _ in range(n):
                t0 = time.perf_counter()
                await conn.send(dest, BODY, persistent=persistent)
                out.append(time.perf_counter() - t0)
            clocks.stop()
            return out

    return asyncio.run(run())


def stomppy_client(port: int, dest: str, n: int, *, persistent: bool = True, cpu: Cpu | None = None,
                   vhost: str | None = None, login: str | None = None, passcode: str | None = None) -> list[float]:
    """Seconds of each stomp.py 8+ ``send`` with a ``receipt`` header until its listener's
    ``on_receipt``."""
    import stomp

    got = threading.Event()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: Any) -> None:
            got.set()

    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0), vhost=vhost)
    conn.set_listener("r", Listener())
    conn.connect(login, passcode, wait=True)
    flag = "true" if persistent else "false"
    try:
        out = []
        clocks = _Clocks(cpu)
        for i in range(n):
            t0 = time.perf_counter()
            got.clear()
            conn.send(dest, BODY, headers={"persistent": flag, "receipt": f"r{i}"})
            if not got.wait(30):
                raise RuntimeError("stomp.py: no receipt")
            out.append(time.perf_counter() - t0)
        clocks.stop()
        return out
    finally:
        conn.disconnect()


def stomppy_available() -> bool:
    try:
        import stomp  # noqa: F401
    except ImportError:
        return False
    return True


#: a STOMP "broker" that answers at once: CONNECTED to a CONNECT, a RECEIPT to every frame that
#: asks for one (a child process, so the client measured has its CPU and GIL to itself)
_ECHO = r"""
import re, socket, sys
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(8); print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); buf = b""
    while True:
        try:
            data = conn.recv(1 << 16)
        except OSError:
            break
        if not data:
            break
        buf += data
        out = []
        while b"\0" in buf:
            frame, buf = buf.split(b"\0", 1)
            frame = frame.lstrip(b"\r\n")
            if frame.startswith((b"CONNECT", b"STOMP")):
                out.append(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\0")
            m = re.search(rb"\nreceipt:([^\r\n]*)", frame)
            if m:
                out.append(b"RECEIPT\nreceipt-id:" + m.group(1) + b"\n\n\0")
        if out:
            try:
                conn.sendall(b"".join(out))
            except OSError:
                break
    conn.close()
"""


def start_echo() -> tuple[int, Callable[[], None], int]:
    """The echo server (see the module docstring): its port, how to stop it, its pid."""
    proc = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())

    def stop() -> None:
        proc.kill()
        proc.wait(10)

    return port, stop, proc.pid


def keyed_window_one(port: int, dest: str, n: int, *, persistent: bool = True,
                     cpu: Cpu | None = None) -> list[float]:
    """:func:`window_one` with the headers our client sends (an idempotency key)."""
    return window_one(port, dest, n, persistent=persistent, keyed=True, cpu=cpu)


def thread_handoff(n: int) -> tuple[float, float]:
    """The floor of a reader-thread client (the sync client's shape): p50 seconds of a
    one-byte round trip over a socketpair read on the same thread, and read by a second
    thread that wakes the first through a lock (what a RECEIPT's arrival costs besides
    the client's own work)."""
    a, b = socket.socketpair()
    try:
        same = []
        for _ in range(n):
            t0 = time.perf_counter()
            a.send(b"x")
            b.recv(16)
            same.append(time.perf_counter() - t0)
        gates: list[Any] = []

        def reader() -> None:
            while b.recv(16) == b"x":
                gates.pop().release()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        cross = []
        for _ in range(n):
            gate = _thread.allocate_lock()
            gate.acquire()
            gates.append(gate)
            t0 = time.perf_counter()
            a.send(b"x")
            gate.acquire()
            cross.append(time.perf_counter() - t0)
        a.send(b"q")
        thread.join(10)
        return statistics.median(same), statistics.median(cross)
    finally:
        a.close()
        b.close()


def contenders() -> dict[str, SendLoop]:
    out: dict[str, SendLoop] = {"raw socket": keyed_window_one, "sync tcp": sync_client,
                                "sync failover": sync_failover_client, "aio": aio_client}
    if stomppy_available():
        out["stomp.py"] = stomppy_client
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else scale(2000, 200)
    rounds = 1 if quick() else int(os.environ.get("AMQ_BENCH_ROUNDS", "5"))
    wanted = os.environ.get("AMQ_BENCH_SERVERS", "echo,broker,broker-fsync").split(",")
    work = work_dir("bench-client-latency-")
    clients = contenders()
    stops: list[Callable[[], object]] = []
    servers: dict[str, tuple[int, bool]] = {}  # name -> (port, persistent sends)
    samples: dict[tuple[str, str], list[list[float]]] = {}  # (server, client) -> each round's seconds
    cpu: dict[tuple[str, str], Cpu] = {}
    try:
        if "echo" in wanted:
            echo, stop_echo, _pid = start_echo()
            stops.append(stop_echo)
            servers["echo"] = (echo, False)
        if "broker" in wanted or "broker-fsync" in wanted:
            broker = BrokerProcess(work / "broker", log_dir=work / "broker-log")
            broker.start()
            stops.append(broker.terminate)
            if "broker" in wanted:
                servers["broker"] = (broker.port, False)
            if "broker-fsync" in wanted:
                servers["broker-fsync"] = (broker.port, True)
        names = list(clients)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]  # rotated: no contender always first
            for srv, (port, persistent) in servers.items():
                for name in order:
                    fn = clients[name]
                    fn(port, f"/queue/client.warm.{r}", max(50, n // 20), persistent=persistent)
                    got = fn(port, f"/queue/client.{srv}.{r}", n, persistent=persistent,
                             cpu=cpu.setdefault((srv, name), []))
                    samples.setdefault((srv, name), []).append(got)
                print(f"round {r + 1}/{rounds} {srv}: " + ", ".join(
                    f"{name} {statistics.median(samples[(srv, name)][-1]) * 1e6:.0f}" for name in names) + " us p50",
                    flush=True)
    finally:
        for stop in reversed(stops):
            stop()
    load = os.getloadavg()[0]
    rows: list[dict[str, object]] = []
    overhead: dict[tuple[str, str], float] = {}
    for srv in servers:
        raw_rounds = samples[(srv, "raw socket")]
        raw = statistics.median([x for rnd in raw_rounds for x in rnd])
        for name in clients:
            per_round = samples[(srv, name)]
            pooled = [x for rnd in per_round for x in rnd]
            diffs = [(statistics.median(mine) - statistics.median(base)) * 1e6
                     for mine, base in zip(per_round, raw_rounds, strict=True)]
            p50 = statistics.median(pooled)
            overhead[(srv, name)] = (p50 - raw) * 1e6
            proc_us = statistics.median(p / n for p, _t in cpu[(srv, name)]) * 1e6
            thread_us = statistics.median(t / n for _p, t in cpu[(srv, name)]) * 1e6
            rows.append({"server": srv, "client": name, "p50 us": p50 * 1e6,
                         "p99 us": percentile(pooled, 0.99) * 1e6,
                         "adds p50 us": None if name == "raw socket" else overhead[(srv, name)],
                         "per-round adds, median (min..max)": None if name == "raw socket" else
                         f"{statistics.median(diffs):.1f} ({min(diffs):.1f}..{max(diffs):.1f})",
                         "CPU us/send": proc_us, "thread CPU us/send": thread_us})
    print_table(rows, title=f"window-1 receipted 256-byte sends, {n} x {rounds} rounds per client and server "
                            f"(load {load:.1f})")
    same, cross = thread_handoff(n)
    print(f"\nthread hand-off floor (socketpair round trip, p50): read on the sending thread {same * 1e6:.1f} us, "
          f"read by a second thread that releases a lock {cross * 1e6:.1f} us (+{(cross - same) * 1e6:.1f} us)")
    goals = []
    if "echo" in servers:
        for name in ("sync tcp", "sync failover", "aio"):
            goals.append({"goal": f"{name} adds <= 30 us over a raw socket (p50, echo)",
                          "measured": round(overhead[("echo", name)], 1), "met": overhead[("echo", name)] <= 30.0})
        print_table(goals, title="issue 27 item 3")
    write_result("client_latency", rows,
                 headline={f"{name} adds us (echo)": round(overhead[("echo", name)], 1)
                           for name in ("sync tcp", "sync failover", "aio") if ("echo", name) in overhead},
                 notes=f"n={n}, rounds={rounds}, load={load:.1f}")


if __name__ == "__main__":
    main()
