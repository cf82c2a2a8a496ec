"""``amq send`` / ``amq recv`` against our broker process, including a SIGKILL mid-run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from amqtransport.cli.main import cli
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path / "logs") as proc:
        yield proc


def test_send_then_recv_json(broker: BrokerProcess) -> None:
    runner = CliRunner()
    uri = f"failover:({broker.uri})"
    res = runner.invoke(cli, ["send", uri, "/queue/cli", "--count", "250", "--size", "64", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["sent"] == 250 and out["seconds"] > 0 and out["rate"] > 0
    res = runner.invoke(cli, ["recv", uri, "/queue/cli", "--count", "250", "--timeout", "5", "--json", "--print"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["received"] == 250 and summary["duplicates"] == 0
    bodies = lines[:-1]
    assert len(bodies) == 250 and all(len(b) == 64 for b in bodies)
    assert bodies[0].startswith(out["id_prefix"] + "-0 ")


def test_recv_short_exits_non_zero_and_bad_uri_exits_two(broker: BrokerProcess) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["send", broker.uri, "/queue/short", "--count", "3"]).exit_code == 0
    res = runner.invoke(cli, ["recv", broker.uri, "/queue/short", "--count", "5", "--timeout", "0.5", "--json"])
    assert res.exit_code == 1
    assert json.loads(res.stdout.strip().splitlines()[-1])["received"] == 3
    assert "only 3 of 5" in res.stderr
    res = runner.invoke(cli, ["send", "failover:(tcp://a:1", "/queue/x", "--count", "1"])
    assert res.exit_code == 2
    assert res.stderr.startswith("error: ")


def test_send_through_a_broker_kill_then_recv_gets_all(broker: BrokerProcess, tmp_path: Path) -> None:
    uri = f"failover:({broker.uri})?initialReconnectDelay=20&maxReconnectDelay=200"
    count = 20000
    amq = [sys.executable, "-m", "amqtransport"]
    # --progress on a pipe prints its label once, after connecting and before the first
    # send: the first kill waits for it, so it lands mid-run however slow the start is
    proc = subprocess.Popen([*amq, "send", uri, "/queue/kill", "--count", str(count), "--window", "50",
                             "--json", "--progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        started = proc.stderr.readline()
        assert started.startswith("sending"), started
        time.sleep(0.05)
        for _ in range(3):
            broker.kill()
            time.sleep(0.3)
            broker.start()
            time.sleep(1.0)
            if proc.poll() is not None:
                break
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["sent"] == count
    assert summary["failovers"] >= 1, "the kill did not land mid-run"
    res = subprocess.run([*amq, "recv", uri, "/queue/kill", "--count", str(count), "--timeout", "5", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["received"] == count


def test_send_delay_holds_the_messages_for_that_long(broker: BrokerProcess) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["send", broker.uri, "/queue/later", "--count", "2", "--delay", "3000", "--json"])
    assert res.exit_code == 0, res.output
    early = runner.invoke(cli, ["recv", broker.uri, "/queue/later", "--count", "2", "--timeout", "1", "--json"])
    assert early.exit_code != 0 and json.loads(early.stdout.strip().splitlines()[-1])["received"] == 0
    res = runner.invoke(cli, ["recv", broker.uri, "/queue/later", "--count", "2", "--timeout", "10", "--json"])
    assert res.exit_code == 0, res.output
    assert runner.invoke(cli, ["send", broker.uri, "/queue/later", "--delay", "-1"]).exit_code == 2


def test_browse_prints_what_the_queue_holds_and_consumes_nothing(broker: BrokerProcess) -> None:
    import amqtransport

    with amqtransport.connect(broker.uri) as conn:
        for i in range(5):
            conn.send("/queue/browsed", f"b{i}", headers={"color": "red" if i % 2 else "blue"})
    runner = CliRunner()
    res = runner.invoke(cli, ["browse", broker.uri, "/queue/browsed"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == ["b0", "b1", "b2", "b3", "b4"]
    res = runner.invoke(cli, ["browse", broker.uri, "/queue/browsed", "--selector", "color = 'red'", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["browsed"] == 2 and summary["destination"] == "/queue/browsed"
    assert [m["headers"]["color"] for m in summary["messages"]] == ["red", "red"]
    assert all(m["bytes"] == 2 and m["message_id"] for m in summary["messages"])
    res = runner.invoke(cli, ["browse", broker.uri, "/queue/browsed", "--count", "2"])
    assert res.exit_code == 0 and res.stdout.splitlines() == ["b0", "b1"]
    res = runner.invoke(cli, ["recv", broker.uri, "/queue/browsed", "--count", "5", "--timeout", "5", "--print"])
    assert res.exit_code == 0, res.output  # all five still there
    assert res.stdout.splitlines()[:5] == ["b0", "b1", "b2", "b3", "b4"]
    res = runner.invoke(cli, ["browse", broker.uri, "/topic/x"])
    assert res.exit_code == 1 and "browser:true is for one queue" in res.stderr
