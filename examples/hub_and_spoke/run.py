"""Hub and spoke: two spokes bridged to a hub master/slave, the hub master killed mid-run.

What it starts (every process is stopped at the end, also on Ctrl-C):

- the hub: a master/slave pair (``amq broker pair``, shared store by default). The
  bridges reach it through ``masterslave:(hub-a,hub-b)``, the seed's configuration;
- two spokes, spoke1 and spoke2, each a pair too (``amq broker pair``); each bridge's
  local side is ``failover:(spoke-a,spoke-b)``;
- one bridge process per spoke (``amq bridge run spokeN.toml``), each serving its
  status on HTTP;
- a consumer at the hub (``failover:(hub-a,hub-b)``) and a producer per spoke.

Then it sends from both spokes, SIGKILLs the hub master (the node every bridge is
connected to) under traffic, shows with ``amq bridge status`` that each bridge was
rebuilt on the hub slave, keeps sending, and checks at the end that every message
sent on a spoke arrived at the hub exactly once.

Run:  .venv/bin/python examples/hub_and_spoke/run.py [--messages 2000] [--mode replicated]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import amqtransport
from amqtransport.testing.ports import free_port

PY = sys.executable
QUEUE = "/queue/orders"


class Proc:
    """A child process we own, stopped by pid."""

    def __init__(self, name: str, args: list[str], log_dir: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = log_dir / f"{name}.log"
        self.popen: subprocess.Popen[str] | None = None

    def start(self, ready: str | None = None, timeout: float = 60.0) -> Proc:
        log = open(self.log_path, "a")  # noqa: SIM115 - closed with the process
        self.popen = subprocess.Popen([PY, "-m", "amqtransport", *self.args], stdout=subprocess.PIPE,
                                      stderr=log, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        if ready is not None:
            assert self.popen.stdout is not None
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                line = self.popen.stdout.readline()
                self.lines.append(line.rstrip("\n"))
                if ready in line:
                    break
                if not line and self.popen.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: see {self.log_path}")
            else:
                raise RuntimeError(f"{self.name} not ready after {timeout}s: see {self.log_path}")
        return self

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(30)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


class Pair:
    """``amq broker pair``: node a starts as master, node b as slave."""

    def __init__(self, name: str, mode: str, work: Path) -> None:
        self.name = name
        self.ports = (free_port(), free_port())
        self.proc = Proc(name, ["broker", "pair", "--mode", mode, "--port", str(self.ports[0]), "--slave-port",
                                str(self.ports[1]), "--data-dir", str(work / name)], work).start(ready="Ctrl-C stops")
        self.pids: dict[str, int] = {}
        for line in self.proc.lines:  # "node a: role master pid 5416 client tcp://127.0.0.1:27001 ..."
            words = line.split()
            if words[:1] == ["node"] and "pid" in words and "client" in words:
                self.pids[words[words.index("client") + 1]] = int(words[words.index("pid") + 1])

    @property
    def a(self) -> str:
        return f"tcp://127.0.0.1:{self.ports[0]}"

    @property
    def b(self) -> str:
        return f"tcp://127.0.0.1:{self.ports[1]}"

    @property
    def uri(self) -> str:
        return f"failover:({self.a},{self.b})?randomize=false&initialReconnectDelay=50"

    def kill_node(self, address: str) -> int:
        pid = self.pids[address]
        os.kill(pid, signal.SIGKILL)
        return pid


def bridge_config(spoke_uri: str, hub_a: str, hub_b: str, status_port: int, name: str) -> str:
    return f"""# bridge of {name}: forwards {QUEUE} to the hub, rebuilt whenever the hub master changes
local_uri = "{spoke_uri}"
status_listen = "127.0.0.1:{status_port}"

[[network_connector]]
name = "{name}-to-hub"
uri = "masterslave:({hub_a},{hub_b})?initialReconnectDelay=100&maxReconnectDelay=2000"
static_include = ["{QUEUE}"]
exclude = ["/queue/local.>"]
network_ttl = 1
heartbeat_ms = 1000
"""


def status(port: int) -> dict[str, object]:
    """The bridge's status, {} while its agent is not serving yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
            return json.loads(r.read())["bridges"][0]  # type: ignore[no-any-return]
    except OSError:
        return {}


def show_status(ports: dict[str, int], title: str) -> None:
    print(f"\n--- {title}: amq bridge status")
    for name, port in ports.items():
        out = subprocess.run([PY, "-m", "amqtransport", "bridge", "status", "--url", f"http://127.0.0.1:{port}"],
                             capture_output=True, text=True, timeout=30)
        lines = out.stdout.splitlines()
        if name == next(iter(ports)):
            print(lines[0])
        print("\n".join(lines[1:]) or out.stderr.strip())


def wait_for(cond: object, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def produce(uri: str, prefix: str, start: int, count: int) -> None:
    with amqtransport.connect(uri) as c, c.producer(window=100) as p:
        for i in range(start, start + count):
            p.send(QUEUE, f"{prefix}-{i}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--messages", type=int, default=2000, help="messages per spoke (default 2000)")
    ap.add_argument("--mode", choices=["shared-store", "replicated"], default="shared-store",
                    help="HA mode of the three pairs (default shared-store)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs, journals)")
    args = ap.parse_args()
    n = args.messages
    work = Path(tempfile.mkdtemp(prefix="amq-hub-and-spoke-"))
    procs: list[Proc] = []
    try:
        print(f"work dir {work}")
        pairs: dict[str, Pair] = {}
        for name in ("hub", "spoke1", "spoke2"):
            pairs[name] = Pair(name, args.mode, work)
            procs.append(pairs[name].proc)
            print(f"started {args.mode} pair {name}: master {pairs[name].a}, slave {pairs[name].b}")
        hub = pairs["hub"]
        status_ports = {"spoke1": free_port(), "spoke2": free_port()}
        for spoke, sport in status_ports.items():
            cfg = work / f"{spoke}.toml"
            cfg.write_text(bridge_config(pairs[spoke].uri, hub.a, hub.b, sport, spoke))
            procs.append(Proc(f"bridge-{spoke}", ["bridge", "run", str(cfg)], work).start())
            print(f"started bridge process for {spoke} ({cfg.name}, status on http://127.0.0.1:{sport}/status)")
        for sport in status_ports.values():
            wait_for(lambda sport=sport: status(sport).get("state") == "up", 60, "bridges up")
        show_status(status_ports, "bridges up")

        # the hub consumer: failover over the hub pair; counts every copy the application
        # is given. On the wire delivery is at least once (a plain ACK not yet durable at
        # the kill, a send in flight that the bridge replays); the client's duplicate
        # filter drops those copies, and the script reports how many it dropped
        received: dict[str, int] = {}
        wire_copies = [0]
        stop = threading.Event()

        def consume(uri_text: str) -> None:
            with amqtransport.connect(uri_text) as c:
                sub = c.subscribe(QUEUE, ack="client-individual")
                while not stop.is_set():
                    m = sub.receive(timeout=0.2)
                    if m is not None:
                        received[m.text] = received.get(m.text, 0) + 1
                        m.ack()
                wire_copies[0] = c.duplicates

        consumer = threading.Thread(target=consume, args=(hub.uri,), daemon=True)
        consumer.start()

        half = n // 2
        producers = [threading.Thread(target=produce, args=(pairs[s].uri, s, 0, half)) for s in status_ports]
        for t in producers:
            t.start()
        time.sleep(0.3)  # traffic is flowing: kill the hub master under load
        pid = hub.kill_node(hub.a)
        killed = time.monotonic()
        print(f"\n*** SIGKILL of the hub master {hub.a} (pid {pid}) under traffic")
        for t in producers:
            t.join()
        for sport in status_ports.values():
            wait_for(lambda sport=sport: status(sport).get("remote") == hub.b, 60, "bridges rebuilt on the hub slave")
        print(f"all bridges rebuilt on the new hub master {hub.b} {time.monotonic() - killed:.2f}s after the kill")
        show_status(status_ports, "after the kill")

        producers = [threading.Thread(target=produce, args=(pairs[s].uri, s, half, n - half)) for s in status_ports]
        for t in producers:
            t.start()
        for t in producers:
            t.join()
        expected = {f"{s}-{i}" for s in status_ports for i in range(n)}
        try:
            wait_for(lambda: expected <= set(received), 120, "hub consumer")
        except RuntimeError:
            pass
        time.sleep(1.0)  # late duplicates, if any, would arrive now
        stop.set()
        consumer.join(10)
        show_status(status_ports, "final")
        missing = expected - set(received)
        copies = sum(received.values()) - len(set(received) & expected)
        print(f"\nsent {len(expected)} from 2 spokes; received {len(set(received) & expected)} distinct at the hub; "
              f"lost {len(missing)}; duplicates {copies} (copies on the wire dropped by the client's filter: "
              f"{wire_copies[0]})")
        return 0 if not missing and not copies else 1
    finally:
        for p in reversed(procs):
            p.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
