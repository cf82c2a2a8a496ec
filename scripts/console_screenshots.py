#!/usr/bin/env python3
"""Make the console screenshots of docs/console.md with headless chromium.

Starts ``amq broker pair --http-port P --slave-http-port P2`` on free ports, puts some
traffic and two dead-lettered messages on it, and takes PNGs of the master's overview,
destinations and DLQ page, the slave's overview, and -- after a SIGKILL of the
master -- the former slave's overview as master. Run from the repository root:

    .venv/bin/python scripts/console_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

import amqtransport
from amqtransport.testing.ports import free_port

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--disable-dev-shm-usage"]


class Shooter:
    """Headless chromium through selenium, so pages run their live refresh in real time."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="amq-shot-")
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in (*FLAGS, f"--user-data-dir={self.profile}"):
            options.add_argument(flag)
        self.driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)

    def __call__(self, url: str, out: Path, size: tuple[int, int] = (1280, 860), wait: float = 2.5) -> None:
        self.driver.set_window_size(*size)
        self.driver.get(url)
        time.sleep(wait)
        self.driver.save_screenshot(str(out))
        print(f"wrote {out}")

    def close(self) -> None:
        self.driver.quit()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/img")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ports = [free_port() for _ in range(4)]
    data = Path(tempfile.mkdtemp(prefix="amq-shots-"))
    proc = subprocess.Popen([sys.executable, "-m", "amqtransport", "broker", "pair", "--port", str(ports[0]),
                             "--slave-port", str(ports[1]), "--http-port", str(ports[2]), "--slave-http-port",
                             str(ports[3]), "--data-dir", str(data)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    shot = Shooter()
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while not any("node b: role slave" in x for x in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        master_pid = int(next(m.group(1) for x in lines if (m := re.search(r"node a: role master pid (\d+)", x))))
        a, b = f"http://127.0.0.1:{ports[2]}", f"http://127.0.0.1:{ports[3]}"
        uri = f"failover:(tcp://127.0.0.1:{ports[0]},tcp://127.0.0.1:{ports[1]})?randomize=false"
        with amqtransport.connect(uri) as c:
            for i in range(40):
                c.send("/queue/orders", f'{{"order": {i}, "sku": "A-{i % 7}", "qty": {1 + i % 3}}}',
                       headers={"customer": f"c{i % 5}"})
            for i in range(25):
                c.send("/queue/payments", f"payment {i}")
            for i in range(12):
                c.send("/queue/invoices.eu", f"invoice {i}")
            sub = c.subscribe("/queue/orders", ack="client-individual", headers={"activemq.prefetchSize": "2"})
            nacks = 0
            while nacks < 14:  # two messages, 1 + max_redeliveries deliveries each
                m = sub.receive(timeout=5)
                if m is None:
                    break
                m.nack()
                nacks += 1
            sub.unsubscribe()
            cons = c.subscribe("/queue/payments", ack="client-individual", headers={"activemq.prefetchSize": "5"})
            traffic = threading.Event()

            def produce() -> None:
                with amqtransport.connect(uri) as p:
                    n = 0
                    while not traffic.is_set():
                        p.send("/queue/invoices.eu", f"invoice {n}")
                        n += 1
                        time.sleep(0.02)

            def consume() -> None:
                with amqtransport.connect(uri) as q:
                    inv = q.subscribe("/queue/invoices.eu")
                    while not traffic.is_set():
                        inv.receive(timeout=0.5)
                        time.sleep(0.03)

            t = threading.Thread(target=produce, daemon=True)
            t.start()
            threading.Thread(target=consume, daemon=True).start()
            shot(a + "/", out / "console-overview.png", wait=30)  # the rate chart fills
            shot(a + "/destinations", out / "console-destinations.png", (1280, 520), wait=5)
            shot(a + "/queues/DLQ.orders", out / "console-dlq.png", (1280, 900))
            shot(b + "/", out / "console-slave.png", (1280, 560))
            traffic.set()
            t.join(5)
            for _ in range(5):
                m = cons.receive(timeout=2)
                if m is not None:
                    m.ack()
        os.kill(master_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and requests.get(b + "/readyz", timeout=5).status_code != 200:
            time.sleep(0.05)
        time.sleep(1.5)
        shot(b + "/", out / "console-after-failover.png", (1280, 560))
    finally:
        shot.close()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
