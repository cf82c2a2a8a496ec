"""Network bridge: forwarding throughput against a direct producer, and time to forward again.

Run: .venv/bin/python benchmarks/bench_bridge.py [N]      (AMQ_BENCH_QUICK=1 for a smoke run)

Brokers are our broker as real processes (``amq broker run``, fsync on); the bridge
agent runs in this process, like ``amq bridge run`` would.

1. Throughput (rounds alternate, ratio of medians, higher is better), for both
   ``ack_mode = "client-individual"`` (the default) and ``"client"`` (one cumulative ACK
   per batch):
   * ``direct`` -- our client's producer (window 100) sends N persistent 256-byte
     messages straight to the hub; rate = N / time to the last receipt;
   * ``bridged`` -- N messages are first loaded on the spoke (not timed), then a
     bridge starts; rate = N / time from the bridge being up to the N-th message
     acknowledged by the hub (receipted there, acked on the spoke).
   Issue 6's target: bridged >= 0.7 x direct.

2. Time to forward again: the bridge is connected to hub node h1 of
   ``masterslave:(h1,h2)?initialReconnectDelay=100``; h1 is SIGKILLed while h2 is
   down; h2 is started ``GAP`` seconds later (a takeover), a probe message is
   waiting on the spoke; we time from the moment h2 accepts connections to the probe
   being on h2. Measured with the default exponential static back-off and the
   default TCP probe (``probe_interval_ms`` 100), then without the probe (ActiveMQ's
   behaviour: the wait after the slave is up depends on how long the takeover took,
   the retries being at 0.1, 0.3, 0.7, 1.5, 3.1 s ... after the loss), and with a
   constant back-off (``useExponentialBackOff=false``) without the probe.
   Issue 6's target: < 1 s with initialReconnectDelay=100.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, quick, scale, write_result  # noqa: E402

import amqtransport  # noqa: E402
from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402
from amqtransport.testing.ports import free_port  # noqa: E402
from bridge.agent import BridgeAgent  # noqa: E402
from bridge.config import parse_config  # noqa: E402

BODY = "x" * 256


def config(local: str, remote: str, queue: str, prefetch: int = 1000, ack_mode: str = "client-individual") -> str:
    return f'''
local_uri = "{local}"
status_listen = ""
[[network_connector]]
name = "bench"
uri = "{remote}"
static_include = ["{queue}"]
prefetch = {prefetch}
ack_mode = "{ack_mode}"
heartbeat_ms = 1000
'''


def produce(uri: str, queue: str, n: int) -> float:
    with amqtransport.connect(uri) as c:
        t0 = time.perf_counter()
        with c.producer(window=100) as p:
            for _ in range(n):
                p.send(queue, BODY)
        return time.perf_counter() - t0


def wait(cond: object, timeout: float, what: str, poll: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(poll)
    raise RuntimeError(f"timed out waiting for {what}")


def drain(uri: str, queue: str, n: int) -> None:
    with amqtransport.connect(uri) as c:
        sub = c.subscribe(queue, ack="auto", prefetch=1000)
        got = 0
        deadline = time.monotonic() + 120
        while got < n and time.monotonic() < deadline:
            if sub.receive(timeout=0.5) is not None:
                got += 1


class Throughput:
    def __init__(self, spoke: BrokerProcess, hub: BrokerProcess, n: int, prefetch: int) -> None:
        self.spoke, self.hub, self.n, self.prefetch = spoke, hub, n, prefetch
        self.round = 0

    def direct(self) -> float:
        self.round += 1
        q = f"/queue/direct.{self.round}"
        secs = produce(self.hub.uri, q, self.n)
        drain(self.hub.uri, q, self.n)
        return self.n / secs

    def bridged(self, ack_mode: str = "client-individual") -> float:
        self.round += 1
        q = f"/queue/bridged.{self.round}"
        produce(self.spoke.uri, q, self.n)
        cfg = parse_config(config(self.spoke.uri, f"masterslave:({self.hub.uri},tcp://127.0.0.1:9)", q, self.prefetch,
                                  ack_mode))
        with BridgeAgent(cfg) as agent:
            st = agent.registry.get("bench")
            wait(lambda: st.state == "up", 30, "bridge up")
            t0 = time.perf_counter()
            wait(lambda: st.forwarded >= self.n, 300, "all forwarded")
            secs = time.perf_counter() - t0
        drain(self.hub.uri, q, self.n)
        return self.n / secs


def recovery(work: Path, *, gap: float, exponential: bool, probe_ms: int = 100) -> float:
    """Seconds from h2 accepting connections to the probe being forwarded to h2."""
    h2_port = free_port()
    opts = "initialReconnectDelay=100" + ("" if exponential else "&useExponentialBackOff=false")
    with BrokerProcess(work / f"s-{time.monotonic_ns()}", args=("--name", "spoke")) as spoke, \
            BrokerProcess(work / f"h1-{time.monotonic_ns()}", args=("--name", "h1")) as h1:
        h2 = BrokerProcess(work / f"h2-{time.monotonic_ns()}", port=h2_port, args=("--name", "h2"))
        remote = f"masterslave:({h1.uri},tcp://127.0.0.1:{h2_port})?{opts}"
        cfg = parse_config(config(spoke.uri, remote, "/queue/probe") + f"probe_interval_ms = {probe_ms}\n")
        try:
            with BridgeAgent(cfg) as agent:
                st = agent.registry.get("bench")
                wait(lambda: st.state == "up", 30, "bridge up")
                h1.kill()
                with amqtransport.connect(spoke.uri) as c:
                    c.send("/queue/probe", "probe")
                time.sleep(gap)
                h2.start()  # returns once it prints "listening on": accepting connections
                t_up = time.perf_counter()
                got: list[float] = []

                def watch() -> None:
                    with amqtransport.connect(h2.uri) as c:
                        sub = c.subscribe("/queue/probe", ack="auto")
                        if sub.receive(timeout=60) is not None:
                            got.append(time.perf_counter())

                t = threading.Thread(target=watch)
                t.start()
                t.join(70)
                if not got:
                    raise RuntimeError("probe never arrived on h2")
                return got[0] - t_up
        finally:
            h2.kill()
            h2.close()  # and its temporary log directory


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else scale(20000, 2000)
    rounds = 3 if not quick() else 1
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="amq-bench-bridge-") as tmp:
        work = Path(tmp)
        with BrokerProcess(work / "spoke", args=("--name", "spoke")) as spoke, \
                BrokerProcess(work / "hub", args=("--name", "hub")) as hub:
            tp = Throughput(spoke, hub, n, prefetch=1000)
            tp.direct()  # warm-up (caches, journal files)
            runs: dict[str, list[float]] = {"client-individual": [], "client": [], "direct": []}
            for _ in range(rounds):  # alternating, so load drift hits all three
                runs["client-individual"].append(tp.bridged("client-individual"))
                runs["client"].append(tp.bridged("client"))
                runs["direct"].append(tp.direct())
        direct = statistics.median(runs["direct"])
        for mode in ("client-individual", "client"):
            med = statistics.median(runs[mode])
            rows.append({"case": f"bridged ack_mode={mode}, {n} x 256 B persistent", "bridged msg/s": round(med),
                         "direct msg/s": round(direct), "bridged/direct": round(med / direct, 2),
                         "bridged min..max": f"{min(runs[mode]):.0f}..{max(runs[mode]):.0f}",
                         "direct min..max": f"{min(runs['direct']):.0f}..{max(runs['direct']):.0f}",
                         "rounds": rounds})
        print_table(rows, title="Forwarding throughput (higher is better)")

        rec_rows: list[dict[str, object]] = []
        tries = 3 if not quick() else 1
        for exponential, probe_ms in ((True, 100), (True, 0), (False, 0)):
            for gap in (0.5, 2.0):
                secs = [recovery(work, gap=gap, exponential=exponential, probe_ms=probe_ms) for _ in range(tries)]
                rec_rows.append({
                    "static back-off": "exponential (default)" if exponential else "useExponentialBackOff=false",
                    "probe_interval_ms": probe_ms,
                    "slave up after (s)": gap,
                    "median s": round(statistics.median(secs), 3),
                    "min s": round(min(secs), 3), "max s": round(max(secs), 3), "rounds": tries,
                })
        print_table(rec_rows, title="Slave accepting -> bridge forwarding again (initialReconnectDelay=100)")
    worst_default = max(float(r["max s"]) for r in rec_rows if r["probe_interval_ms"] == 100)  # type: ignore[arg-type]
    write_result(
        "bridge",
        rows + rec_rows,
        headline={"bridged/direct throughput (client-individual)": rows[0]["bridged/direct"],
                  "bridged/direct throughput (ack_mode=client)": rows[1]["bridged/direct"],
                  "forwarding again after slave up, max s (defaults + initialReconnectDelay=100)": worst_default},
        notes="bridge agent in the benchmark process; brokers are amq broker run processes",
    )


if __name__ == "__main__":
    main()
