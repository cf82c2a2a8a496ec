"""examples/async_producer.py and examples/async_consumer.py as a newcomer runs them
(docs/client-async.md): `amq broker pair` in one terminal, the consumer and the
producer in two others, `kill -9` of the master pid the pair printed, while both run.
Nothing is lost and nothing reaches the consumer twice."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amqtransport.processes.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
COUNT = 3000

pytestmark = pytest.mark.timeout(240)


def start_pair(mode: str, data: Path) -> tuple[subprocess.Popen[str], str, int, list[str]]:
    amq = Path(sys.executable).with_name("amq")
    proc = subprocess.Popen([str(amq), "broker", "pair", "--mode", mode, "--port", str(free_port()),
                             "--slave-port", str(free_port()), "--data-dir", str(data)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    uri, master = "", 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (uri and master):
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("uri: "):
            uri = line.split(" ", 1)[1].strip()
        m = re.match(r"node \w+: role master pid (\d+)", line)
        if m:
            master = int(m.group(1))
    assert uri and master, "amq broker pair did not print its uri and master pid:\n" + "".join(lines)
    return proc, uri, master, lines


def run_example(name: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(ROOT / "examples" / name), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("mode", ["replicated", "shared-store"])
def test_the_async_examples_lose_nothing_through_a_master_kill(mode: str, tmp_path: Path) -> None:
    pair, uri, master, _ = start_pair(mode, tmp_path / "pair")
    consumer = producer = None
    try:
        uri += "&initialReconnectDelay=10&maxReconnectDelay=500"
        consumer = run_example("async_consumer.py", uri, "/queue/orders", "--expect", str(COUNT), "--idle", "60",
                               "--work-ms", "1")
        producer = run_example("async_producer.py", uri, "/queue/orders", "--count", str(COUNT), "--tasks", "20",
                               "--rate", "1000")  # 3 s of sending: the kill lands mid-run
        assert producer.stdout is not None
        for line in producer.stdout:  # kill the master once sending is under way
            if line.startswith("sent "):
                break
        os.kill(master, signal.SIGKILL)
        p_out = line + producer.communicate(timeout=120)[0]
        c_out = consumer.communicate(timeout=120)[0]
    finally:
        for proc in (producer, consumer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        pair.send_signal(signal.SIGTERM)
        pair.communicate(timeout=60)
    assert producer.returncode == 0, p_out
    assert f"done: {COUNT} receipted" in p_out, p_out
    assert "link lost" in p_out and "resumed on" in p_out, p_out
    assert consumer.returncode == 0, c_out
    assert f"done: {COUNT} distinct, 0 missing, 0 seen twice" in c_out, c_out
