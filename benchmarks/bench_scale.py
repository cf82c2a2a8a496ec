"""Scale: deep queues, restart and takeover at depth, many connections, many consumers, many spokes.

Run one part, or all of them (the default, at sizes that fit ``run_all.py``'s timeout):

    .venv/bin/python benchmarks/bench_scale.py depth --depths 10000,100000,1000000 [--activemq]
    .venv/bin/python benchmarks/bench_scale.py ha --depth 1000000
    .venv/bin/python benchmarks/bench_scale.py connections --connections 10000
    .venv/bin/python benchmarks/bench_scale.py consumers --consumers 1000
    .venv/bin/python benchmarks/bench_scale.py spokes --spokes 20
    .venv/bin/python benchmarks/bench_scale.py all            # 100k deep, 2,000 connections, ...

``--broker-config KEY=VALUE`` (repeatable) adds a key to the broker's TOML config (e.g.
``memory_limit=8589934592`` to let a broker without paging hold 1M messages at all).
``AMQ_BENCH_QUICK=1`` shrinks everything to a smoke run.

What each part measures (one client for every broker: a raw socket with our sans-IO
codec, 256-byte persistent messages, every figure from real processes):

``depth``  Per depth N: a *deep* broker (``amq broker run``) is filled with N messages on
  one queue (fire-and-forget in chunks of 1,000, one receipt per chunk); its RSS per
  queued message (RSS minus an *empty* broker's RSS, over N); the send rate into the
  deep queue against the rate into the empty broker (same client, alternating rounds);
  the drain rate of 10,000 messages from the deep queue against draining a queue of
  10,000 on the empty broker (alternating); the time from spawn to ``listening on``
  after a clean stop (SIGTERM) and after SIGKILL, and RSS after the restart; then the
  whole queue is drained and checked (every sequence number once). ``--activemq``
  does the same backlog, restart and drain on ActiveMQ 5.17 in the same run.
``ha``     A shared-store pair with N queued: SIGKILL of the master -> the slave answers
  a CONNECT. A replicated pair: the master is filled with N, then the slave starts:
  time until it is in sync, and the peak RSS (VmHWM) of both nodes.
``connections``  C idle STOMP connections with heart-beats (5 s both ways) on one broker:
  RSS per connection, the broker's CPU while idle, and how long a new client waits
  for CONNECTED (20 tries spread over the idle period).
``consumers``  K consumers (one connection each, prefetch 1, client-individual acks) on
  one queue, M messages: the aggregate rate and how evenly they were served (min/max
  per consumer, Jain's index).
``spokes`` S spoke brokers, each with its own bridge to one hub pair
  (``masterslave:``): S bridge processes, and one bridge process with S connectors
  (when the bridge's config allows a local broker per connector); aggregate forwarding
  rate against S x the rate of one bridge alone, per-spoke fairness, and the time until
  every bridge is up on the new hub master after the hub master's SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, print_table, quick, ratio, scale, work_dir, write_result  # noqa: E402
from bench_broker import RawClient, activemq_node, pipelined_frames  # noqa: E402

from amqtransport.stomp import Frame, FrameParser, serialize  # noqa: E402
from amqtransport.testing.broker_pair import BrokerPair  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402
from amqtransport.testing.ports import free_port  # noqa: E402

BODY_SIZE = 256
CHUNK = 1000
QUEUE = "/queue/deep"


# ---------------------------------------------------------------------- process figures
def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of ``pid`` in bytes."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def rss(pid: int) -> int:
    return proc_status(pid)["VmRSS"]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mb(n: float) -> float:
    return round(n / 1e6, 1)


# ---------------------------------------------------------------------- the client
def body(seq: int) -> bytes:
    head = b"%012d" % seq
    return head + b"x" * (BODY_SIZE - len(head))


def send_frame(dest: str, seq: int, receipt: str | None = None) -> bytes:
    headers = [("destination", dest), ("persistent", "true")]
    if receipt is not None:
        headers.append(("receipt", receipt))
    return serialize(Frame.make("SEND", headers, body(seq)))


def fill(port: int, dest: str, n: int, *, first: int = 0, stall: float = 60.0,
         progress: Callable[[int], None] | None = None) -> tuple[int, float]:
    """Send ``n`` persistent messages (sequence numbers from ``first``) in chunks of
    :data:`CHUNK` with a receipt on the last of each chunk, at most 8 chunks
    unreceipted. Returns (messages receipted, seconds); stops early when no receipt
    came for ``stall`` seconds (producer flow control that never releases)."""
    c = RawClient(port)
    c.sock.settimeout(stall)
    t0 = time.perf_counter()
    sent = done = 0
    try:
        while done < n:
            while sent < n and sent - done < 8 * CHUNK:
                upto = min(n, sent + CHUNK)
                frames = [send_frame(dest, first + i) for i in range(sent, upto - 1)]
                frames.append(send_frame(dest, first + upto - 1, receipt=str(upto)))
                c.sock.sendall(b"".join(frames))
                sent = upto
            try:
                frames_in = c.next_frames()
            except TimeoutError:
                print(f"  fill: no receipt for {stall:.0f} s at {done} messages: the producer is blocked")
                break
            for f in frames_in:
                if f.command != "RECEIPT":
                    raise RuntimeError(f"fill: {f.command}: {f.get('message')}")
                done = int(f.get("receipt-id") or 0)
                if progress is not None:
                    progress(done)
        return done, time.perf_counter() - t0
    finally:
        c.sock.close()


def pipelined(port: int, dest: str, n: int, window: int = 100, first: int = 0) -> float:
    """Messages/s of ``n`` receipted sends with ``window`` receipts outstanding."""
    return pipelined_frames(port, [send_frame(dest, first + i, receipt=str(i)) for i in range(n)], window)


def drain(port: int, dest: str, n: int, *, prefetch: int = 1000, seen: set[int] | None = None,
          idle: float = 30.0) -> tuple[int, float]:
    """Consume up to ``n`` messages (client-individual acks, one write per batch); returns
    (messages, messages/s). Sequence numbers go into ``seen`` (duplicates counted by the
    caller from the totals). Stops after ``idle`` seconds without a message."""
    c = RawClient(port)
    c.sock.settimeout(idle)
    c.sock.sendall(serialize(Frame.make("SUBSCRIBE", [
        ("destination", dest), ("id", "1"), ("ack", "client-individual"),
        ("activemq.prefetchSize", str(prefetch))])))
    got = 0
    t0 = time.perf_counter()
    try:
        while got < n:
            try:
                frames = c.next_frames()
            except TimeoutError:
                break
            acks: list[bytes] = []
            for f in frames:
                if f.command != "MESSAGE":
                    if f.command == "ERROR":
                        raise RuntimeError(f"drain: ERROR {f.get('message')}")
                    continue
                if got >= n:
                    break
                got += 1
                if seen is not None:
                    seen.add(int(f.body[:12]))
                acks.append(serialize(Frame.make("ACK", [("id", f.get("ack") or f.get("message-id") or "")])))
            if acks:
                c.sock.sendall(b"".join(acks))
        elapsed = time.perf_counter() - t0
        # a receipt for the last ACKs, so the next round starts with them processed
        c.sock.sendall(serialize(Frame.make("UNSUBSCRIBE", [("id", "1"), ("receipt", "u")])))
        c.sock.settimeout(max(idle, 120.0))
        while True:
            frames = c.next_frames()
            if any(f.command == "RECEIPT" for f in frames):
                break
        return got, got / elapsed if elapsed > 0 else 0.0
    finally:
        c.close()


def connect_latency(port: int) -> float:
    t0 = time.perf_counter()
    c = RawClient(port)
    dt = time.perf_counter() - t0
    c.close()
    return dt


def medians(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------------- brokers
class Work:
    """The run's scratch directory and our broker's config file."""

    def __init__(self, extra: dict[str, str]) -> None:
        self.dir = work_dir("bench-scale-")
        self.config = self.dir / "broker.toml"
        lines = [f"{k} = {v}" for k, v in extra.items()]
        self.config.write_text("\n".join(lines) + "\n")
        self.extra = extra

    def broker(self, name: str, *args: str) -> BrokerProcess:
        return BrokerProcess(self.dir / name, args=["--config", str(self.config), *args],
                             log_dir=self.dir / "logs" / name, startup_timeout=600)


def timed_start(b: BrokerProcess) -> float:
    t0 = time.perf_counter()
    b.start()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------- depth
def fill_and_weigh(port: int, pid: int, n: int, base_rss: int, row: dict[str, Any]) -> tuple[int, float]:
    """Fill the broker (process ``pid``) with ``n`` messages; its RSS and RSS per queued
    message over ``base_rss`` go into ``row``. Returns (queued, seconds)."""
    t_last = [time.monotonic()]

    def progress(done: int) -> None:
        if time.monotonic() - t_last[0] > 15:
            t_last[0] = time.monotonic()
            print(f"  filling: {done}/{n} rss {mb(rss(pid))} MB")

    queued, secs = fill(port, QUEUE, n, progress=progress)
    row["queued"] = queued
    row["fill msg/s"] = round(queued / secs)
    time.sleep(1.0)
    r = rss(pid)
    row["rss MB"] = mb(r)
    row["rss B/msg"] = round((r - base_rss) / max(1, queued))
    return queued, secs


def depth_part(work: Work, depths: list[int], *, rounds: int, sample: int, with_activemq: bool,
               amq_heap: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    empty = work.broker("empty")
    empty.start()
    try:
        empty_rss = rss(empty.pid)
        for n in depths:
            rows.append(depth_one(work, empty, empty_rss, n, rounds=rounds, sample=sample))
            if with_activemq:
                row = activemq_depth(work, n, sample=sample, heap=amq_heap)
                if row is not None:
                    rows.append(row)
    finally:
        empty.terminate()
    return rows


def depth_one(work: Work, empty: BrokerProcess, empty_rss: int, n: int, *, rounds: int,
              sample: int) -> dict[str, Any]:
    deep = work.broker(f"deep-{n}")
    deep.start()
    row: dict[str, Any] = {"broker": "ours", "depth": n}
    try:

        queued, secs = fill_and_weigh(deep.port, deep.pid, n, empty_rss, row)
        print(f"  depth {n}: {queued} queued in {secs:.1f} s, rss {row['rss MB']} MB "
              f"({row['rss B/msg']} B/msg over an empty broker's {mb(empty_rss)} MB)")
        blocked = queued < n
        total = queued
        if not blocked:
            # send rate at depth vs into an empty broker (alternating rounds)
            r_empty: list[float] = []
            r_deep: list[float] = []
            seq = n
            for i in range(rounds):
                q = f"/queue/empty.{n}.{i}"
                r_empty.append(pipelined(empty.port, q, sample))
                drain(empty.port, q, sample)
                r_deep.append(pipelined(deep.port, QUEUE, sample, first=seq))
                seq += sample
                total += sample
            row["send empty msg/s"] = round(medians(r_empty))
            row["send at depth msg/s"] = round(medians(r_deep))
            row["send depth/empty"] = round(ratio(medians(r_deep), medians(r_empty)), 2)
            # drain rate at depth vs draining a queue of `sample` (alternating rounds)
            d_small: list[float] = []
            d_deep: list[float] = []
            seen: set[int] = set()
            drained = 0
            for i in range(rounds):
                q = f"/queue/small.{n}.{i}"
                fill(empty.port, q, sample)
                d_small.append(drain(empty.port, q, sample)[1])
                got, rate = drain(deep.port, QUEUE, sample, seen=seen)
                drained += got
                d_deep.append(rate)
            row[f"drain {sample} msg/s"] = round(medians(d_small))
            row["drain at depth msg/s"] = round(medians(d_deep))
            row[f"drain depth/{sample}"] = round(ratio(medians(d_deep), medians(d_small)), 2)
        else:
            row["note"] = f"producer blocked at {queued} (memory_limit?)"
            seen, drained = set(), 0
        # restarts
        deep.terminate()
        row["restart clean s"] = round(timed_start(deep), 2)
        time.sleep(0.5)
        row["rss after restart MB"] = mb(rss(deep.pid))
        deep.kill()
        row["restart kill -9 s"] = round(timed_start(deep), 2)
        row["rss after kill restart MB"] = mb(rss(deep.pid))
        print(f"  restart: clean {row['restart clean s']} s, after kill -9 {row['restart kill -9 s']} s")
        # drain everything and check it
        left = total - drained
        got, rate = drain(deep.port, QUEUE, left, seen=seen, idle=60.0)
        drained += got
        row["full drain msg/s"] = round(rate)
        row["drained"] = drained
        row["distinct"] = len(seen)
        row["lost"] = sum(1 for i in range(total) if i not in seen)
        row["duplicates"] = drained - len(seen)
        row["peak rss MB"] = mb(proc_status(deep.pid)["VmHWM"])
        print(f"  drained {drained} ({len(seen)} distinct of {total}) at {rate:.0f} msg/s")
    finally:
        deep.terminate()
    return row


def activemq_depth(work: Work, n: int, *, sample: int, heap: str) -> dict[str, Any] | None:
    node = activemq_node(work.dir / f"activemq-{n}", "scale", heap, """
    <destinationPolicy><policyMap><policyEntries>
      <policyEntry queue=">" producerFlowControl="true"/>
    </policyEntries></policyMap></destinationPolicy>""")
    if node is None:
        return None
    row: dict[str, Any] = {"broker": "ActiveMQ 5.17", "depth": n}
    node.start(timeout=300)
    try:
        queued, _secs = fill_and_weigh(node.stomp_port, node.pid, n, rss(node.pid), row)
        seen: set[int] = set()
        got, rate = drain(node.stomp_port, QUEUE, sample, seen=seen)
        row["drain at depth msg/s"] = round(rate)
        node.stop(timeout=120)
        t0 = time.perf_counter()
        node.start(timeout=600)
        row["restart clean s"] = round(time.perf_counter() - t0, 2)
        time.sleep(0.5)
        row["rss after restart MB"] = mb(rss(node.pid))
        node.kill()
        t0 = time.perf_counter()
        node.start(timeout=600)
        row["restart kill -9 s"] = round(time.perf_counter() - t0, 2)
        got2, rate2 = drain(node.stomp_port, QUEUE, queued - got, seen=seen, idle=60.0)
        row["full drain msg/s"] = round(rate2)
        row["drained"] = got + got2
        row["distinct"] = len(seen)
        row["lost"] = queued - len(seen)
        print(f"  ActiveMQ depth {n}: rss {row['rss MB']} MB, restart {row['restart clean s']} s, "
              f"drained {got + got2} ({len(seen)} distinct)")
    finally:
        node.stop(timeout=60)
    return row


# ---------------------------------------------------------------------- ha
def ha_part(work: Work, n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    extra = ["--config", str(work.config)]
    # shared store: SIGKILL of the master -> the slave answers a CONNECT
    with BrokerPair("shared-store", work.dir / f"shared-{n}", extra_args=extra) as pair:
        master = pair.wait_master(60)
        slave = pair.other(master)
        queued, secs = fill(master.port, QUEUE, n)
        print(f"  shared store: {queued} queued in {secs:.1f} s")
        t0 = time.perf_counter()
        master.kill()
        while True:
            try:
                connect_latency(slave.port)
                break
            except OSError:
                time.sleep(0.01)
            if time.perf_counter() - t0 > 600:
                raise TimeoutError("no takeover within 600 s")
        takeover = time.perf_counter() - t0
        rows.append({"case": "shared-store takeover", "depth": queued, "seconds": round(takeover, 2),
                     "slave rss MB": mb(rss(slave.pid)), "slave peak rss MB": mb(proc_status(slave.pid)["VmHWM"])})
        print(f"  shared-store takeover with {queued} queued: {takeover:.2f} s")
    # replicated: fill the master alone, then start the slave and time its full sync
    pair = BrokerPair("replicated", work.dir / f"replicated-{n}", extra_args=extra)
    try:
        pair.a.start(60)
        master = pair.wait_master(60)
        queued, secs = fill(master.port, QUEUE, n)
        print(f"  replicated: {queued} queued on the master in {secs:.1f} s")
        m_before = proc_status(master.pid)
        t0 = time.perf_counter()
        pair.b.start(60)
        pair.wait_in_sync(timeout=1800)
        sync = time.perf_counter() - t0
        m_after = proc_status(master.pid)
        s_after = proc_status(pair.b.pid)
        rows.append({"case": "replicated full sync", "depth": queued, "seconds": round(sync, 2),
                     "master rss MB": mb(m_after["VmRSS"]), "master peak rss MB": mb(m_after["VmHWM"]),
                     "master rss before MB": mb(m_before["VmRSS"]),
                     "slave rss MB": mb(s_after["VmRSS"]), "slave peak rss MB": mb(s_after["VmHWM"])})
        print(f"  full sync of {queued}: {sync:.2f} s; peak rss master {mb(m_after['VmHWM'])} MB, "
              f"slave {mb(s_after['VmHWM'])} MB")
    finally:
        pair.stop()
    return rows


# ---------------------------------------------------------------------- connections
class IdleClients:
    """``n`` idle STOMP connections with heart-beats, driven by one selector loop."""

    def __init__(self, port: int, n: int, heartbeat_ms: int) -> None:
        self.port = port
        self.n = n
        self.hb = heartbeat_ms
        self.sel = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        self.beats_in = 0
        self.dropped = 0

    def open(self) -> None:
        connect = serialize(Frame.make("CONNECT", [("accept-version", "1.2"), ("host", "localhost"),
                                                   ("heart-beat", f"{self.hb},{self.hb}")]))
        pending: dict[socket.socket, FrameParser] = {}
        for i in range(self.n):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            s.sendall(connect)
            s.setblocking(False)
            pending[s] = FrameParser("1.2")
            self.sel.register(s, selectors.EVENT_READ)
            self.socks.append(s)
            if i % 500 == 499:
                self._settle(pending, 0.0)
        deadline = time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            self._settle(pending, 0.5)
        if pending:
            raise RuntimeError(f"{len(pending)} connections got no CONNECTED")

    def _settle(self, pending: dict[socket.socket, FrameParser], timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            data = s.recv(65536)
            if s in pending:
                p = pending[s]
                p.feed(data)
                for e in p.events():
                    if isinstance(e, Frame):
                        if e.command != "CONNECTED":
                            raise RuntimeError(f"connection refused: {e.command} {e.get('message')}")
                        del pending[s]
                        break

    def idle(self, seconds: float, probe: Callable[[], None], probes: int) -> None:
        """Keep every connection alive (a newline every heart-beat period) for ``seconds``;
        call ``probe`` ``probes`` times, evenly spread."""
        end = time.monotonic() + seconds
        next_beat = time.monotonic()
        next_probe = time.monotonic() + seconds / (probes + 1)
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_beat:
                for s in self.socks:
                    try:
                        s.send(b"\n")
                    except OSError:
                        self.dropped += 1
                next_beat = now + self.hb / 1000 / 2
            if now >= next_probe:
                probe()
                next_probe = now + seconds / (probes + 1)
            for key, _ in self.sel.select(0.05):
                fobj = key.fileobj
                assert isinstance(fobj, socket.socket)
                s = fobj
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self.sel.unregister(s)
                    self.dropped += 1
                else:
                    self.beats_in += 1

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.sel.close()


def connections_part(work: Work, n: int, idle_s: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    b = work.broker("connections")
    b.start()
    clients = IdleClients(b.port, n, heartbeat_ms=5000)
    try:
        base = rss(b.pid)
        lat0 = [connect_latency(b.port) for _ in range(5)]
        t0 = time.perf_counter()
        clients.open()
        opened = time.perf_counter() - t0
        time.sleep(1)
        full = rss(b.pid)
        lat: list[float] = []
        c0 = cpu_seconds(b.pid)
        w0 = time.perf_counter()
        clients.idle(idle_s, lambda: lat.append(connect_latency(b.port)), probes=20)
        cpu = (cpu_seconds(b.pid) - c0) / (time.perf_counter() - w0)
        rows.append({
            "connections": n, "open s": round(opened, 1), "rss empty MB": mb(base), "rss MB": mb(full),
            "rss KB/conn": round((full - base) / n / 1024, 1), "idle cpu %": round(100 * cpu, 1),
            "new client ms (median)": round(1000 * medians(lat), 1), "new client ms (max)": round(1000 * max(lat), 1),
            "new client ms, no load": round(1000 * medians(lat0), 1), "dropped": clients.dropped,
        })
    finally:
        clients.close()
        b.terminate()
    return rows


# ---------------------------------------------------------------------- consumers
def consumers_part(work: Work, k: int, m: int) -> list[dict[str, Any]]:
    b = work.broker("consumers")
    b.start()
    dest = "/queue/fair"
    sel = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    parsers: dict[socket.socket, FrameParser] = {}
    counts: dict[socket.socket, int] = {}
    try:
        connect = serialize(Frame.make("CONNECT", [("accept-version", "1.2"), ("host", "localhost")]))
        sub = serialize(Frame.make("SUBSCRIBE", [("destination", dest), ("id", "1"), ("ack", "client-individual"),
                                                 ("activemq.prefetchSize", "1")]))
        for _ in range(k):
            s = socket.create_connection(("127.0.0.1", b.port), timeout=30)
            s.sendall(connect + sub)
            s.setblocking(False)
            socks.append(s)
            parsers[s] = FrameParser("1.2")
            counts[s] = 0
            sel.register(s, selectors.EVENT_READ)
        time.sleep(1.0)
        t0 = time.perf_counter()
        fill(b.port, dest, m)
        got = 0
        deadline = time.monotonic() + 600
        while got < m and time.monotonic() < deadline:
            for key, _ in sel.select(1.0):
                fobj = key.fileobj
                assert isinstance(fobj, socket.socket)
                s = fobj
                p = parsers[s]
                p.feed(s.recv(65536))
                acks = []
                for e in p.events():
                    if isinstance(e, Frame) and e.command == "MESSAGE":
                        got += 1
                        counts[s] += 1
                        acks.append(serialize(Frame.make("ACK", [("id", e.get("ack") or "")])))
                if acks:
                    s.setblocking(True)
                    s.sendall(b"".join(acks))
                    s.setblocking(False)
        secs = time.perf_counter() - t0
        per = sorted(counts.values())
        jain = sum(per) ** 2 / (len(per) * sum(x * x for x in per)) if any(per) else 0.0
        return [{"consumers": k, "messages": m, "received": got, "msg/s (send+consume)": round(got / secs),
                 "min per consumer": per[0], "median": statistics.median(per), "max": per[-1],
                 "jain index": round(jain, 3), "idle consumers": sum(1 for x in per if x == 0)}]
    finally:
        for s in socks:
            s.close()
        sel.close()
        b.terminate()


# ---------------------------------------------------------------------- spokes
def _bridge_toml(path: Path, connectors: list[tuple[str, str, str]], status_port: int, *,
                 per_connector_local: bool) -> None:
    """connectors: (name, local uri, remote uri). One local_uri for the file unless
    ``per_connector_local``."""
    lines = [f'local_uri = "{connectors[0][1]}"', f'status_listen = "127.0.0.1:{status_port}"']
    for name, local, remote in connectors:
        lines += ["", "[[network_connector]]", f'name = "{name}"', f'uri = "{remote}"',
                  'static_include = ["/queue/orders"]', 'advisories = "off"']
        if per_connector_local:
            lines.append(f'local_uri = "{local}"')
    path.write_text("\n".join(lines) + "\n")


def _bridge_status(port: int) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
            return list(json.loads(r.read())["bridges"])
    except (OSError, ValueError):
        return []


def _start_bridge(work: Work, name: str, connectors: list[tuple[str, str, str]], *,
                  per_connector_local: bool) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cfg = work.dir / f"{name}.toml"
    _bridge_toml(cfg, connectors, port, per_connector_local=per_connector_local)
    log = open(work.dir / "logs" / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "amqtransport", "bridge", "run", str(cfg)],
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    return proc, port


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _supports_per_connector_local() -> bool:
    from bridge.config import NetworkConnectorConfig

    return "local_uri" in NetworkConnectorConfig.model_fields


def spokes_part(work: Work, s: int, k: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    dest = "/queue/orders"
    spokes = [work.broker(f"spoke{i}") for i in range(s)]
    extra = ["--config", str(work.config)]
    pair = BrokerPair("replicated", work.dir / "hub", extra_args=extra)
    try:
        for b in spokes:
            b.start()
        pair.start(120)
        hub = f"masterslave:({pair.a.uri},{pair.b.uri})"

        def run(layout: str, used: list[BrokerProcess]) -> tuple[float, list[float], list[subprocess.Popen[bytes]],
                                                                  list[int]]:
            """Preload ``k`` on each spoke, start the bridges; the clock runs from every bridge
            being up to every message forwarded (the rate counts what was forwarded meanwhile)."""
            for b in used:
                fill(b.port, dest, k)
            conns = [(f"spoke{i}", b.uri, hub) for i, b in enumerate(used)]
            procs: list[subprocess.Popen[bytes]] = []
            ports: list[int] = []
            if layout == "one process":
                p, port = _start_bridge(work, "bridge-all", conns, per_connector_local=True)
                procs, ports = [p], [port]
            else:
                for c in conns:
                    p, port = _start_bridge(work, f"bridge-{c[0]}-{layout.replace(' ', '-')}", [c],
                                            per_connector_local=False)
                    procs.append(p)
                    ports.append(port)

            def forwarded() -> dict[str, tuple[str, int]]:
                return {b["connector"]: (b["state"], int(b["forwarded"])) for port in ports for b in _bridge_status(port)}

            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                st = forwarded()
                if len(st) == len(used) and all(state == "up" for state, _ in st.values()):
                    break
                time.sleep(0.01)
            t0 = time.perf_counter()
            start = sum(n for _, n in forwarded().values())
            done_at: dict[str, float] = {}
            deadline = time.monotonic() + 900
            while len(done_at) < len(used) and time.monotonic() < deadline:
                for name, (_state, n) in forwarded().items():
                    if name not in done_at and n >= k:
                        done_at[name] = time.perf_counter() - t0
                time.sleep(0.05)
            total = time.perf_counter() - t0
            moved = k * len(used) - start
            if len(done_at) < len(used):
                print(f"  {layout}: only {len(done_at)} of {len(used)} bridges forwarded all {k}")
            return moved / total, [done_at.get(c[0], float("nan")) for c in conns], procs, ports

        # one bridge alone
        single, _, procs1, _ = run("alone", spokes[:1])
        _stop(procs1)
        layouts = ["processes"] + (["one process"] if _supports_per_connector_local() else [])
        for layout in layouts:
            agg, per, procs, ports = run(layout, spokes)
            try:
                # rebuild: SIGKILL the hub master, time until every bridge is up on the other node
                master = pair.wait_master(60)
                other = pair.other(master)
                t0 = time.perf_counter()
                master.kill()
                rebuilt = float("nan")
                while time.perf_counter() - t0 < 120:
                    states = [b for port in ports for b in _bridge_status(port)]
                    if len(states) == s and all(b["state"] == "up" and b["remote"] and str(other.port) in b["remote"]
                                                for b in states):
                        rebuilt = time.perf_counter() - t0
                        break
                    time.sleep(0.02)
                rows.append({"layout": f"{s} spokes, {layout}", "per spoke": k, "aggregate msg/s": round(agg),
                             "one bridge alone msg/s": round(single),
                             f"aggregate / ({s} x alone)": round(agg / (s * single), 2),
                             "fastest spoke s": round(min(per), 2), "slowest spoke s": round(max(per), 2),
                             "all rebuilt after hub SIGKILL s": round(rebuilt, 2)})
                print(f"  {layout}: {agg:.0f} msg/s aggregate vs {single:.0f} alone; rebuilt in {rebuilt:.2f} s")
            finally:
                _stop(procs)
            pair.restart(master if not master.alive else other, 60)
            pair.wait_in_sync(120)
        if not _supports_per_connector_local():
            rows.append({"layout": f"{s} spokes, one process", "note": "not supported: one local_uri per bridge agent"})
    finally:
        for b in spokes:
            b.terminate()
        pair.stop()
    return rows


# ---------------------------------------------------------------------- main
def _parse_extra(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--broker-config wants KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", nargs="?", default="all", choices=["all", "depth", "ha", "connections", "consumers", "spokes"])
    ap.add_argument("--depths", default=None, help="comma-separated queue depths (depth part)")
    ap.add_argument("--depth", type=int, default=None, help="queued messages (ha part)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sample", type=int, default=10000, help="messages per send/drain round")
    ap.add_argument("--activemq", action="store_true", help="the same backlog into ActiveMQ 5.17")
    ap.add_argument("--amq-heap", default="1g")
    ap.add_argument("--connections", type=int, default=None)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds the idle connections are watched")
    ap.add_argument("--consumers", type=int, default=None)
    ap.add_argument("--messages", type=int, default=None, help="messages for the consumers part")
    ap.add_argument("--spokes", type=int, default=None)
    ap.add_argument("--per-spoke", type=int, default=None)
    ap.add_argument("--broker-config", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--name", default="scale", help="result file name (benchmarks/results/NAME.json)")
    args = ap.parse_args(argv)
    work = Work(_parse_extra(args.broker_config))
    sample = scale(args.sample, 1000)
    rounds = 1 if quick() else args.rounds
    everything = args.part == "all"
    sections: dict[str, list[dict[str, Any]]] = {}
    started = time.time()
    if everything or args.part == "depth":
        depths = [int(x) for x in args.depths.split(",")] if args.depths else [scale(10000, 2000), scale(100000, 5000)]
        sections["depth"] = depth_part(work, depths, rounds=rounds, sample=min(sample, min(depths)),
                                       with_activemq=args.activemq, amq_heap=args.amq_heap)
    if everything or args.part == "ha":
        sections["ha"] = ha_part(work, args.depth or scale(100000, 5000))
    if everything or args.part == "connections":
        conns = args.connections or scale(2000, 200)
        sections["connections"] = connections_part(work, conns, scale(int(args.idle), 5) if not args.connections
                                                   else args.idle)
    if everything or args.part == "consumers":
        sections["consumers"] = consumers_part(work, args.consumers or scale(1000, 50), args.messages or scale(20000, 2000))
    if everything or args.part == "spokes":
        sections["spokes"] = spokes_part(work, args.spokes or scale(20, 3), args.per_spoke or scale(5000, 500))
    rows: list[dict[str, Any]] = []
    for name, part_rows in sections.items():
        columns = list(dict.fromkeys(k for r in part_rows for k in r))
        print_table(part_rows, columns, title=name)
        rows += [{"part": name, **r} for r in part_rows]
    headline: dict[str, Any] = {}
    for r in sections.get("depth", []):
        if r.get("broker") == "ours":
            headline[f"{r['depth']}: B/msg"] = r.get("rss B/msg")
            headline[f"{r['depth']}: restart s"] = r.get("restart clean s")
    cmd = " ".join(["bench_scale.py", *(argv if argv is not None else sys.argv[1:])])
    write_result(args.name, rows, headline=headline,
                 notes=f"{cmd}; broker config {work.extra}; {time.time() - started:.0f} s; "
                       f"machine={machine().get('cpu')}")


if __name__ == "__main__":
    main()
