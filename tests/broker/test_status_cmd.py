"""`amq broker status` against a plain `amq broker run` process (role standalone).

Real broker child processes, real sockets, the CLI run as a subprocess; an HA node's
status is covered by tests/ha/test_cli.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_helpers import StompPy

from amqtransport.broker.config import hash_password
from amqtransport.cli.ha_cmd import status_data, status_lines
from amqtransport.testing.broker_process import BrokerProcess
from amqtransport.testing.ports import free_port

pytestmark = pytest.mark.timeout(120)

AMQ = [sys.executable, "-m", "amqtransport"]


def amq_status(port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AMQ, "broker", "status", "--port", str(port), "--timeout", "10", *extra],
        capture_output=True, text=True, timeout=60,
    )


@pytest.fixture
def broker_proc(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path / "logs") as b:
        yield b


def test_status_of_a_plain_broker(broker_proc: BrokerProcess) -> None:
    port = broker_proc.port
    client = StompPy(port)
    try:
        ids = [client.send("/queue/status.a", f"a{i}") for i in range(3)]
        ids += [client.send("/queue/status.b", f"b{i}") for i in range(2)]
        client.wait_receipts(ids)

        res = amq_status(port, "--json")
        assert res.returncode == 0, (res.stdout, res.stderr, broker_proc.log_text()[-2000:])
        data = json.loads(res.stdout)
        assert data["role"] == "standalone"
        assert "epoch" not in data and "peer" not in data
        assert data["messages"] == 5
        assert data["depths"] == {"/queue/status.a": 3, "/queue/status.b": 2}
        assert data["queues"] == 2
        assert data["sent"] == 5
        assert data["connections"] == 1  # our StompPy client, not the status request itself
        assert data["pid"] == broker_proc.pid
        assert data["client"] == f"127.0.0.1:{port}"
        assert isinstance(data["uptime"], float) and data["uptime"] >= 0
        memory = data["memory"]
        assert memory["limit"] == 256 * 1024 * 1024  # BrokerConfig's default memory_limit
        assert 0 < memory["usage"] <= memory["peak"]
        assert memory["flow_control"] is False

        human = amq_status(port)
        assert human.returncode == 0, (human.stdout, human.stderr)
        lines = human.stdout.splitlines()
        assert lines[0].split() == ["role", "standalone"], human.stdout
        assert ["messages", "5"] in [ln.split() for ln in lines], human.stdout
        assert any(ln.startswith("memory ") and "of 256.0 MiB" in ln and "flow control off" in ln
                   for ln in lines), human.stdout
        assert "  /queue/status.a 3" in lines and "  /queue/status.b 2" in lines, human.stdout
    finally:
        client.close()

    # the status connection is not a client: the broker logged no error and still serves
    again = StompPy(port)
    try:
        again.wait_receipts([again.send("/queue/status.a", "after")])
    finally:
        again.close()
    assert json.loads(amq_status(port, "--json").stdout)["messages"] == 6


def test_status_with_users_shows_queue_names_only_to_a_valid_login(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('secret')}\n")
    with BrokerProcess(tmp_path / "data", args=["--users", str(users)], log_dir=tmp_path / "logs") as b:
        client = StompPy(b.port, login="alice", passcode="secret")
        try:
            client.wait_receipts([client.send("/queue/private", "x")])
        finally:
            client.close()
        anonymous = amq_status(b.port, "--json")
        assert anonymous.returncode == 0, anonymous.stderr
        data = json.loads(anonymous.stdout)
        assert data["role"] == "standalone" and data["messages"] == 1
        assert "depths" not in data
        wrong = json.loads(amq_status(b.port, "--json", "--user", "alice", "--password", "nope").stdout)
        assert "depths" not in wrong
        good = json.loads(amq_status(b.port, "--json", "--user", "alice", "--password", "secret").stdout)
        assert good["depths"] == {"/queue/private": 1}


def test_status_nothing_listening_is_a_clear_error() -> None:
    port = free_port()
    res = amq_status(port)
    assert res.returncode == 1
    assert f"cannot reach 127.0.0.1:{port}: nothing is listening there" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stdout == ""


def test_status_of_a_stomp_server_that_is_not_ours() -> None:
    """A STOMP server that answers CONNECTED without status headers (ActiveMQ, say)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(10)
            buf = b""
            while b"\x00" not in buf:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
            conn.sendall(b"CONNECTED\nversion:1.2\nserver:other/1.0\n\n\x00")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        res = amq_status(port)
    finally:
        t.join(15)
        srv.close()
    assert res.returncode == 1
    assert "not an amqtransport broker" in res.stderr, res.stderr


def test_status_lines_of_an_ha_master_and_flow_control() -> None:
    data = status_data({
        "role": "master", "epoch": "3", "peer": "127.0.0.1:61614", "peer-state": "in-sync",
        "messages": "7", "synced": "true", "memory-usage": "3145728", "memory-limit": "4194304",
        "memory-peak": "4194304", "memory-flow-control": "true", "uptime": "12.5",
    })
    assert data["epoch"] == 3 and data["synced"] is True and data["uptime"] == 12.5
    assert data["memory"] == {"usage": 3145728, "limit": 4194304, "peak": 4194304, "flow_control": True}
    lines = status_lines(data)
    assert lines[:3] == ["role         master", "epoch        3", "peer         127.0.0.1:61614"]
    assert "memory       3.0 MiB of 4.0 MiB (75.0%), peak 4.0 MiB, flow control ENGAGED" in lines
    assert "uptime       12.5 s" in lines
