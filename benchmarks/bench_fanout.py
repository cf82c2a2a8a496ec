"""Durable topics at scale: one topic, N offline durable subscribers, ours against ActiveMQ.

Run: .venv/bin/python benchmarks/bench_fanout.py [--quick] [--subs 1,10,50,200] [-n 5000]
     [--rounds R] [--baseline DIR] [--no-pair]
(``--quick``, or AMQ_BENCH_QUICK=1: subs 1,10,50, 2000 messages, one round, no pairs)

For each N: a fresh broker (empty data directory), N durable subscriptions of
``/topic/bench.fan`` made and left offline (a connection with its ``client-id`` each,
``activemq.subscriptionName``, disconnected), then ``-n`` persistent 256-byte SENDs to
the topic, pipelined (a receipt each, at most 100 outstanding): the rate counts
receipted messages. Then, with the broker still up:

* ``journal MB``: our journal's segments (``<data>/journal/seg-*.log``); ActiveMQ's
  KahaDB journal files (``db-*.log``);
* ``disk MB``: every file of the store directory, as allocated on disk (``st_blocks``;
  KahaDB preallocates its journal files sparsely, so their length says little);
* ``RSS MB``: the broker process's resident set (``VmRSS``; a JVM with ``-Xmx512m``).

Contenders, alternating within each round (ours, ActiveMQ, ...): ``ours`` (``amq broker
run``, defaults, fsync on), ``ActiveMQ`` (Debian's 5.17, KahaDB, its defaults),
``ours pair`` (a replicated pair: a receipt waits for the slave; journal and RSS of the
master), ``ActiveMQ pair`` (its shared-store master/slave: ActiveMQ 5.17 has no
replicated store), and with ``--baseline DIR`` our broker from another checkout (e.g.
``git archive 6baca03 | tar -x -C DIR``: the code before the message was stored once).
The table gives the medians over the rounds.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, print_table, quick, ratio, work_dir, write_result  # noqa: E402
from bench_broker import RawClient, activemq_node, pipelined_frames  # noqa: E402

from amqtransport.stomp import Frame, FrameParser, serialize  # noqa: E402
from amqtransport.testing.broker_pair import BrokerPair  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402

BODY = b"x" * 256
TOPIC = "/topic/bench.fan"
WINDOW = 100
MB = 1 << 20


class Target:
    """A started broker: its STOMP port, its store directory, its pid."""

    def __init__(self, port: int, store: Path, pid: int | None, journal_glob: str) -> None:
        self.port = port
        self.store = store
        self.pid = pid
        self.journal_glob = journal_glob


class SubscriberClient(RawClient):
    """A raw STOMP connection with a ``client-id`` (a durable subscriber)."""

    def __init__(self, port: int, client_id: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser("1.2")
        self.sock.sendall(serialize(Frame.make(
            "CONNECT", {"accept-version": "1.2", "host": "localhost", "client-id": client_id})))
        self.expect("CONNECTED")

    def expect(self, command: str) -> None:
        f = self.next_frame()
        if f.command != command:
            raise RuntimeError(f"expected {command}, got {f.command}: {f.get('message')}")


def make_subscriptions(port: int, n: int) -> None:
    """``n`` durable subscriptions of the topic, left offline."""
    for i in range(n):
        c = SubscriberClient(port, f"bench-{i}")
        c.sock.sendall(serialize(Frame.make("SUBSCRIBE", {
            "destination": TOPIC, "id": "1", "ack": "client-individual",
            "activemq.subscriptionName": f"sub-{i}", "receipt": "s"})))
        c.expect("RECEIPT")
        c.close()


def topic_frames(n: int) -> list[bytes]:
    return [
        serialize(Frame.make("SEND", [("destination", TOPIC), ("persistent", "true"), ("receipt", str(i))], BODY))
        for i in range(n)
    ]


def files(store: Path, pattern: str) -> Iterator[Path]:
    return (p for p in store.rglob(pattern) if p.is_file())


def rss_mb(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def measure(target: Target, subs: int, frames: list[bytes]) -> dict[str, float]:
    make_subscriptions(target.port, subs)
    rate = pipelined_frames(target.port, frames, WINDOW)
    time.sleep(0.5)  # let background writes (KahaDB's index) land before reading sizes
    return {
        "msg/s": rate,
        "journal MB": sum(p.stat().st_size for p in files(target.store, target.journal_glob)) / MB,
        "disk MB": sum(p.stat().st_blocks * 512 for p in files(target.store, "*")) / MB,
        "RSS MB": rss_mb(target.pid),
    }


@contextmanager
def ours(work: Path, env: dict[str, str] | None = None) -> Iterator[Target]:
    bp = BrokerProcess(work / "data", log_dir=work, env=env)
    bp.start()
    try:
        yield Target(bp.port, work / "data" / "journal", bp.pid, "seg-*.log")
    finally:
        bp.terminate()


@contextmanager
def ours_pair(work: Path) -> Iterator[Target]:
    with BrokerPair("replicated", work) as bp:
        bp.wait_in_sync(60)
        master = bp.a
        yield Target(master.port, Path(master.data_dir) / "journal", master.pid, "seg-*.log")


@contextmanager
def activemq(work: Path) -> Iterator[Target]:
    node = activemq_node(work, "fan", "512m")
    if node is None:
        raise LookupError("ActiveMQ is not installed")
    node.start()
    try:
        yield Target(node.stomp_port, node.kahadb_dir, node.pid, "db-*.log")
    finally:
        node.stop()


@contextmanager
def activemq_pair(work: Path) -> Iterator[Target]:
    from amqtransport.processes.activemq import ActiveMQPair

    with ActiveMQPair(work, 500) as pair:
        master = pair.nodes[0] if pair.nodes[0].is_serving() else pair.nodes[1]
        yield Target(master.stomp_port, master.kahadb_dir, master.pid, "db-*.log")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (also AMQ_BENCH_QUICK=1)")
    ap.add_argument("--subs", default=None, help="durable subscriber counts, comma-separated (default 1,10,50,200)")
    ap.add_argument("-n", type=int, default=None, help="messages published per run (default 5000)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3; 1 with --quick)")
    ap.add_argument("--baseline", default=None, help="another checkout of this project to run as 'baseline'")
    ap.add_argument("--no-pair", action="store_true", help="leave out the pairs")
    args = ap.parse_args()
    short = args.quick or quick()
    subs_list = [int(s) for s in (args.subs or ("1,10,50" if short else "1,10,50,200")).split(",")]
    n = args.n or (2000 if short else 5000)
    rounds = args.rounds or (1 if short else 3)
    frames = topic_frames(n)
    contenders: list[tuple[str, Callable[[Path], object]]] = [("ours", ours)]
    if activemq_node(Path(tempfile.gettempdir()), "probe", "64m") is not None:
        contenders.append(("ActiveMQ", activemq))
    if args.baseline:
        # ``python -m`` puts its working directory first on sys.path: run the brokers from
        # a directory with no checkout in it, so each gets the code its PYTHONPATH names
        os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        os.chdir(tempfile.gettempdir())
        env = {**os.environ, "PYTHONPATH": str(Path(args.baseline).resolve())}
        contenders.append(("baseline", lambda w: ours(w, env)))
    if not (args.no_pair or short):
        contenders.append(("ours pair", ours_pair))
        if any(name == "ActiveMQ" for name, _ in contenders):
            contenders.append(("ActiveMQ pair", activemq_pair))
    base = work_dir("bench-fanout-")
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    for r in range(rounds):
        for subs in subs_list:
            for name, start in contenders:
                work = Path(tempfile.mkdtemp(dir=base))
                with start(work) as target:  # type: ignore[attr-defined]
                    got = measure(target, subs, frames)
                runs.setdefault((subs, name), []).append(got)
                print(f"round {r + 1}/{rounds}, {subs} subs, {name}: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in got.items()), flush=True)
    rows = []
    for subs in subs_list:
        for name, _ in contenders:
            results = runs[(subs, name)]
            row: dict[str, object] = {"subs": subs, "broker": name}
            for key in results[0]:
                row[key] = statistics.median(x[key] for x in results)
            rows.append(row)
    for row in rows:  # against the same broker with 1 subscriber, and against ActiveMQ
        one = next(r for r in rows if r["subs"] == subs_list[0] and r["broker"] == row["broker"])
        row["msg/s vs 1 sub"] = ratio(float(row["msg/s"]), float(one["msg/s"]))  # type: ignore[arg-type]
        row["journal vs 1 sub"] = ratio(float(row["journal MB"]), float(one["journal MB"]))  # type: ignore[arg-type]
        peer_name = {"ours": "ActiveMQ", "ours pair": "ActiveMQ pair"}.get(str(row["broker"]))
        peer = next((r for r in rows if r["subs"] == row["subs"] and r["broker"] == peer_name), None)
        row["msg/s vs ActiveMQ"] = ratio(float(row["msg/s"]), float(peer["msg/s"])) if peer else ""  # type: ignore[arg-type]
    print_table(rows, title=f"{n} persistent {len(BODY)}-byte messages to one topic, N offline durable subscribers, "
                f"pipelined (window {WINDOW}), {rounds} round(s), median")
    headline: dict[str, object] = {}
    for row in rows:
        if row["broker"] == "ours" and row["subs"] == 50:
            headline = {"50 subs msg/s vs 1 sub": row["msg/s vs 1 sub"], "50 subs journal vs 1 sub": row["journal vs 1 sub"],
                        "50 subs msg/s vs ActiveMQ": row["msg/s vs ActiveMQ"]}
    write_result("fanout", rows, headline=headline,
                 notes=f"n={n}, subs={subs_list}, rounds={rounds}, quick={short}; machine={machine().get('cpu')}")


if __name__ == "__main__":
    main()
