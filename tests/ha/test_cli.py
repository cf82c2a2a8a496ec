"""The newcomer's path: `amq broker pair`, send through the printed URI, kill -9 the
master's pid, the sends go on and nothing is lost; Ctrl-C stops both nodes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amqtransport.broker.ha.wire import ha_request_sync
from amqtransport.testing.ports import free_port

pytestmark = pytest.mark.timeout(150)

AMQ = [sys.executable, "-m", "amqtransport"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of another parent counts as gone
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


@pytest.mark.parametrize("mode", ["replicated", "shared-store"])
def test_pair_command_kill_master_nothing_lost(mode: str, tmp_path: Path) -> None:
    out_path = tmp_path / "pair.out"
    p1, p2 = free_port(), free_port()
    with open(out_path, "wb") as out:
        pair = subprocess.Popen(
            [*AMQ, "broker", "pair", "--mode", mode, "--port", str(p1), "--slave-port", str(p2),
             "--data-dir", str(tmp_path / "data")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline and "Ctrl-C stops both" not in text:
            assert pair.poll() is None, out_path.read_text()
            time.sleep(0.2)
            text = out_path.read_text()
        uri = re.search(r"^uri: (\S+)$", text, re.M)
        assert uri is not None, text
        assert uri.group(1) == f"failover:(tcp://127.0.0.1:{p1},tcp://127.0.0.1:{p2})?randomize=false"
        roles = dict(re.findall(r"^node (\w): role (\w+) pid", text, re.M))
        pids = [int(x) for x in re.findall(r"^node \w: role \w+ pid (\d+)", text, re.M)]
        assert roles == {"a": "master", "b": "slave"}, text
        master_pid = pids[0]

        ha_port = int(re.findall(r"^node a: .* ha-port tcp://127\.0\.0\.1:(\d+)", text, re.M)[0])
        n = 12000
        send = subprocess.Popen([*AMQ, "send", "-n", str(n), "--no-progress", "--json", uri.group(1), "/queue/demo"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # kill once the master has taken a good part of the stream, not after a fixed sleep
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sent = int(ha_request_sync("127.0.0.1", ha_port).get("amq-ha-sent") or 0)
            if sent >= 2000 or send.poll() is not None:
                break
            time.sleep(0.02)
        assert send.poll() is None, "the sender finished before the kill: make n larger"
        os.kill(master_pid, signal.SIGKILL)
        stdout, stderr = send.communicate(timeout=120)
        assert send.returncode == 0, stderr[-2000:]
        summary = json.loads(stdout)
        assert summary["sent"] == n and summary["connected"] == f"tcp://127.0.0.1:{p2}", summary
        recv = subprocess.run([*AMQ, "recv", "-n", str(n), "--json", uri.group(1), "/queue/demo"],
                              capture_output=True, text=True, timeout=120)
        assert recv.returncode == 0, recv.stderr[-2000:]
        got = json.loads(recv.stdout)
        assert got["received"] == n and got["duplicates"] == 0, got
        status = subprocess.run([*AMQ, "broker", "status", "--port", str(p2), "--json"],
                                capture_output=True, text=True, timeout=30)
        assert json.loads(status.stdout)["role"] == "master"
        time.sleep(0.5)
        assert "node a: pid" in out_path.read_text() and "exited" in out_path.read_text()
    finally:
        if pair.poll() is None:
            pair.send_signal(signal.SIGINT)
            try:
                pair.wait(40)
            except subprocess.TimeoutExpired:
                pair.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert "stopped both nodes" in out_path.read_text()
    assert not [p for p in pids if _alive(p)], "Ctrl-C left a node running"


def test_release_finds_the_secret_of_amq_broker_pair(tmp_path: Path) -> None:
    """`amq broker release` without a secret names where `amq broker pair` keeps it, and
    defaults to amq-pair-data/cluster.secret (docs/ha.md runs it against a real pair)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    none = subprocess.run([*AMQ, "broker", "release", "--port", str(free_port()), "--yes"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=env)
    assert none.returncode == 2 and "DATA_DIR/cluster.secret" in none.stderr, none.stderr
    (tmp_path / "amq-pair-data").mkdir()
    (tmp_path / "amq-pair-data" / "cluster.secret").write_text("s3cret-s3cret-s3cret\n")
    port = free_port()
    found = subprocess.run([*AMQ, "broker", "release", "--port", str(port), "--yes"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, env=env)
    # the secret was found: it went on to ask the (absent) master
    assert found.returncode == 1 and f"cannot reach 127.0.0.1:{port}" in found.stderr, found.stderr


def test_status_wait_keeps_trying_until_a_broker_listens(tmp_path: Path) -> None:
    """`amq broker status --wait S` rides out the seconds in which nothing listens on the
    port (a slave opens its client port only once it has taken over): it answers once a
    broker is there. Without --wait a refused connection is an error at once."""
    port = free_port()
    once = subprocess.run([*AMQ, "broker", "status", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert once.returncode == 1 and "nothing is listening there" in once.stderr
    waiting = subprocess.Popen([*AMQ, "broker", "status", "--port", str(port), "--wait", "60", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    broker = None
    try:
        time.sleep(1.0)  # (not a wait for anything: the status call must be refused at least once)
        assert waiting.poll() is None, waiting.communicate()
        broker = subprocess.Popen([*AMQ, "broker", "run", "--port", str(port), "--data-dir", str(tmp_path / "d")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out, err = waiting.communicate(timeout=90)
        assert waiting.returncode == 0, err
        assert json.loads(out)["role"] == "standalone"
    finally:
        if waiting.poll() is None:
            waiting.kill()
        if broker is not None:
            broker.terminate()
            broker.wait(30)
