"""What each node's ``fdatasync`` does on the disk, window 1: a single broker and a
replicated pair, traced in the kernel (issue 27: why the slave's sync stage did not get
faster with preallocated segments).

Run (root, ``perf`` installed, tracefs mounted at /sys/kernel/tracing):
    .venv/bin/python benchmarks/trace_fdatasync.py [N]   (default 500 sends per target)

For each target the script starts the broker(s) (``amq broker run``; ``amq broker pair``
in replicated mode; the code on ``PYTHONPATH``, which may be another checkout's), sends 1,000 warm-up receipted 256-byte
SENDs one at a time, then N more while ``perf record -a`` records the kernel's
``ext4:ext4_sync_file_enter``/``exit`` (one ``fdatasync``), ``ext4:ext4_mark_inode_dirty``
and ``block:block_rq_issue`` events. For every process that made at least N/2 of the syncs
(the single broker; the master and the slave) it prints
the syncs' p50 and mean, how many also wrote the inode (a ``WSM`` request: a metadata
write inside the ``fdatasync``) and their mean, and the device's cache flushes (``FF``)
per sync; for a pair, how far apart the master's and the slave's syncs of one record start
and end (either may come first).
No JSON result: a diagnostic, not a figure kept over time (BENCHMARKS.md quotes it).
"""

from __future__ import annotations

import bisect
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, work_dir  # noqa: E402
from bench_broker import RawClient  # noqa: E402
from bench_client_latency import send_frames, timed_receipts  # noqa: E402

from amqtransport.processes.pair import BrokerPair  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402

EVENTS = "ext4:ext4_sync_file_enter,ext4:ext4_sync_file_exit,ext4:ext4_mark_inode_dirty,block:block_rq_issue"
_EVENT = re.compile(r"^\s*(\d+)/(\d+)\s+([\d.]+):\s+(\S+):(.*)$")  # perf script -F pid,tid,time,event,trace


@dataclass
class Sync:
    start: float
    end: float = 0.0
    inode_writes: int = 0  # WSM requests issued inside it (the inode's block)


@dataclass
class Trace:
    syncs: dict[int, list[Sync]] = field(default_factory=dict)  # process id -> its fdatasyncs (any thread)
    flushes: int = 0  # FF requests (the device's cache flushes), all threads


def parse(text: str) -> Trace:
    """``perf script``'s lines of :data:`EVENTS` -> each process's syncs."""
    trace = Trace()
    open_: dict[int, tuple[int, Sync]] = {}  # thread id -> (its process, the sync it is in)
    for line in text.splitlines():
        m = _EVENT.match(line)
        if m is None:
            continue
        pid, tid, at, name, rest = int(m.group(1)), int(m.group(2)), float(m.group(3)), m.group(4), m.group(5)
        if name == "ext4:ext4_sync_file_enter":
            open_[tid] = pid, Sync(at)
        elif name == "ext4:ext4_sync_file_exit" and tid in open_:
            pid, sync = open_.pop(tid)
            sync.end = at
            trace.syncs.setdefault(pid, []).append(sync)
        elif name == "block:block_rq_issue":
            kind = rest.split()[1] if len(rest.split()) > 1 else ""
            if kind == "FF":
                trace.flushes += 1
            elif kind == "WSM" and tid in open_:
                open_[tid][1].inode_writes += 1
    return trace


def us(seconds: list[float], at: float) -> float:
    xs = sorted(seconds)
    return round(xs[min(len(xs) - 1, int(len(xs) * at))] * 1e6, 1) if xs else float("nan")


def traced(port: int, n: int, out: Path) -> Trace:
    """Warm up, then N window-1 sends under ``perf record -a``."""
    client = RawClient(port)
    frames = send_frames("/queue/trace", 1000 + n)
    timed_receipts(client, frames[:1000])
    perf = subprocess.Popen(["perf", "record", "-q", "-a", "-o", str(out), "-e", EVENTS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # perf attaches
    timed_receipts(client, frames[1000:])
    perf.terminate()
    perf.wait(30)
    client.close()
    text = subprocess.run(["perf", "script", "-F", "pid,tid,time,event,trace", "-i", str(out)], capture_output=True, text=True, check=True).stdout
    return parse(text)


def rows_of(target: str, trace: Trace, n: int) -> list[dict[str, object]]:
    busy = sorted((p for p, s in trace.syncs.items() if len(s) >= n // 2), key=lambda p: trace.syncs[p][0].start)
    rows: list[dict[str, object]] = []
    for i, pid in enumerate(busy):
        syncs = sorted(trace.syncs[pid], key=lambda s: s.start)
        took = [s.end - s.start for s in syncs]
        with_inode = [s.end - s.start for s in syncs if s.inode_writes]
        rows.append({"target": target, "node": ("master/single", "slave")[min(i, 1)], "syncs": len(syncs),
                     "p50 us": us(took, 0.5), "mean us": round(statistics.mean(took) * 1e6, 1),
                     "with inode write": len(with_inode),
                     "their mean us": round(statistics.mean(with_inode) * 1e6, 1) if with_inode else None})
    if len(busy) == 2:
        starts, ends = [], []
        second = sorted(trace.syncs[busy[1]], key=lambda s: s.start)
        at = [s.start for s in second]
        for a in trace.syncs[busy[0]]:  # each master sync and the slave's nearest to it (the same record)
            i = bisect.bisect_left(at, a.start)
            near = min(second[max(0, i - 1):i + 1], key=lambda s: abs(s.start - a.start), default=None)
            if near is not None and abs(near.start - a.start) < 0.0005:
                starts.append(abs(near.start - a.start))
                ends.append(abs(near.end - a.end))
        rows.append({"target": target, "node": "slave - master", "syncs": None, "p50 us": None, "mean us": None,
                     "with inode write": f"{len(ends)} matched: starts {us(starts, 0.5)} us, ends {us(ends, 0.5)} us apart (p50)",
                     "their mean us": None})
    total = sum(len(trace.syncs[t]) for t in busy)
    if busy:
        rows.append({"target": target, "node": "all", "syncs": total, "p50 us": None, "mean us": None,
                     "with inode write": f"{trace.flushes} cache flushes (FF), whole machine", "their mean us": None})
    return rows


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    if shutil.which("perf") is None or not Path("/sys/kernel/tracing/events/ext4").is_dir():
        sys.exit("trace_fdatasync: needs perf and tracefs (mount -t tracefs nodev /sys/kernel/tracing), as root")
    work = work_dir("trace-fdatasync-")
    os.chdir(work)  # a broker child runs `python -m amqtransport` here, first on its path: PYTHONPATH's code runs
    rows: list[dict[str, object]] = []
    single = BrokerProcess(work / "single", log_dir=work / "single-log")
    single.start()
    try:
        rows += rows_of("single", traced(single.port, n, work / "single.perf"), n)
    finally:
        single.terminate()
    pair = BrokerPair("replicated", work / "replicated")
    pair.start()
    try:
        master = pair.wait_master(60)
        pair.wait_in_sync(60)
        rows += rows_of("replicated", traced(master.port, n, work / "replicated.perf"), n)
    finally:
        pair.stop()
    print_table(rows, title=f"fdatasync in the kernel, window 1, {n} sends per target")


if __name__ == "__main__":
    main()
