"""The ActiveMQ harness against the real broker: a node serves STOMP, a shared-store
pair fails over after SIGKILL of the master without losing a receipted message, and
nothing is left running afterwards.

STOMP is spoken here over a raw socket (a tiny client below), independent of our own
codec and client, so these tests check the harness and the broker, nothing else.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from amqtransport.processes.activemq import (
    ActiveMQError,
    ActiveMQNode,
    ActiveMQPair,
    activemq_home,
    missing_reason,
    stomp_handshake,
)
from amqtransport.testing.ports import ephemeral_range, free_port
from amqtransport.testing.pytest_fixtures import ActiveMQFactory, require_activemq

RawFrame = tuple[str, dict[str, str], bytes]


class RawStomp:
    """Just enough STOMP 1.2 over a blocking socket to test a broker by hand."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send_frame(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        head = "".join(f"{k}:{v}\n" for k, v in headers.items())
        if body:
            head += f"content-length:{len(body)}\n"
        self.sock.sendall(f"{command}\n{head}\n".encode() + body + b"\x00")

    def read_frame(self) -> RawFrame:
        while True:
            self.buf = self.buf.lstrip(b"\r\n")  # heart-beats
            end = self.buf.find(b"\x00")
            if end >= 0:
                break
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.buf += chunk
        raw, self.buf = self.buf[:end], self.buf[end + 1 :]
        head, _, body = raw.partition(b"\n\n")
        lines = head.decode().split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.rstrip("\r").partition(":")
            headers.setdefault(k, v)
        return lines[0].rstrip("\r"), headers, body

    def connect(self) -> RawFrame:
        self.send_frame("CONNECT", {"accept-version": "1.2", "host": "localhost", "heart-beat": "0,0"})
        return self.read_frame()

    def send(self, destination: str, body: bytes, receipt: str) -> RawFrame:
        self.send_frame(
            "SEND", {"destination": destination, "receipt": receipt, "persistent": "true"}, body
        )
        return self.read_frame()

    def close(self) -> None:
        self.sock.close()


def queue_name() -> str:
    return f"/queue/harness.{uuid.uuid4().hex[:12]}"


def receive_one(port: int, destination: str) -> RawFrame:
    c = RawStomp(port)
    try:
        assert c.connect()[0] == "CONNECTED"
        c.send_frame("SUBSCRIBE", {"destination": destination, "id": "s1", "ack": "auto"})
        return c.read_frame()
    finally:
        c.close()


def pid_running(pid: int) -> bool:
    """True when ``pid`` exists and is still an ActiveMQ JVM (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return b"activemq.jar" in cmdline


def port_refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


# ---------------------------------------------------------------- without a broker


def test_free_port_is_free_distinct_and_outside_the_ephemeral_range() -> None:
    lo, hi = ephemeral_range()
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    for p in ports:
        assert not lo <= p <= hi
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # really free


def test_missing_install_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AMQ_ACTIVEMQ_HOME", str(tmp_path / "nowhere"))
    assert activemq_home() is None
    reason = missing_reason()
    assert reason is not None and "activemq.jar" in reason and "nowhere" in reason


def test_bad_node_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="name"):
        ActiveMQNode(tmp_path, "bad name/")
    with pytest.raises(ValueError, match="lock_interval_ms"):
        ActiveMQNode(tmp_path, "ok", lock_interval_ms=0)


# ---------------------------------------------------------------- one node


@pytest.mark.activemq
def test_node_answers_connect_and_a_receipted_send(activemq_node: ActiveMQNode) -> None:
    assert activemq_node.alive and activemq_node.uri == f"tcp://127.0.0.1:{activemq_node.stomp_port}"
    dest = queue_name()
    c = RawStomp(activemq_node.stomp_port)
    try:
        command, headers, _ = c.connect()
        assert command == "CONNECTED", headers
        assert headers.get("version") == "1.2"
        command, headers, _ = c.send(dest, b"hello activemq", receipt="r-1")
        assert (command, headers.get("receipt-id")) == ("RECEIPT", "r-1")
    finally:
        c.close()
    command, headers, body = receive_one(activemq_node.stomp_port, dest)
    assert command == "MESSAGE" and body == b"hello activemq"
    assert headers["destination"] == dest and headers.get("message-id")
    print(f"\nActiveMQ node start: {activemq_node.start_seconds:.2f} s")


@pytest.mark.activemq
def test_stomp_py_as_an_independent_peer(activemq_node: ActiveMQNode) -> None:
    stomp = pytest.importorskip("stomp")
    receipts: list[str] = []
    got_receipt = threading.Event()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc,name-defined]
        def on_receipt(self, frame: object) -> None:
            receipts.append(getattr(frame, "headers", {}).get("receipt-id", ""))
            got_receipt.set()

    conn = stomp.Connection12([("127.0.0.1", activemq_node.stomp_port)])
    conn.set_listener("t", Listener())
    conn.connect(wait=True)
    try:
        conn.send(destination=queue_name(), body="via stomp.py", headers={"receipt": "rcpt-1"})
        assert got_receipt.wait(timeout=10)
        assert receipts == ["rcpt-1"]
    finally:
        conn.disconnect()


@pytest.mark.activemq
def test_killed_node_restarts_with_its_persistent_messages(activemq_factory: ActiveMQFactory) -> None:
    node = activemq_factory.node("restart")
    dest = queue_name()
    c = RawStomp(node.stomp_port)
    assert c.connect()[0] == "CONNECTED"
    assert c.send(dest, b"survives", receipt="r")[0] == "RECEIPT"
    c.close()
    old_pid, port = node.pid, node.stomp_port
    assert old_pid is not None
    node.kill()
    assert not node.alive and not pid_running(old_pid) and port_refuses(port)
    node.start()
    assert node.pid != old_pid and node.stomp_port == port
    assert receive_one(port, dest)[2] == b"survives"


@pytest.mark.activemq
def test_a_broken_config_fails_fast_with_the_log(activemq_factory: ActiveMQFactory) -> None:
    node = activemq_factory.node("broken", start=False, extra_xml="<noSuchElement/>")
    t0 = time.monotonic()
    with pytest.raises(ActiveMQError) as info:
        node.start(timeout=60)
    assert time.monotonic() - t0 < 55  # it exited; we did not sit out the timeout
    assert "broken" in str(info.value) and "noSuchElement" in str(info.value)
    assert not node.alive


# ---------------------------------------------------------------- a shared-store pair


@pytest.mark.activemq
def test_pair_fails_over_after_sigkill_without_losing_a_receipted_message(
    activemq_pair: ActiveMQPair,
) -> None:
    master, slave = activemq_pair.master, activemq_pair.slave
    assert activemq_pair.uri == f"failover:({master.uri},{slave.uri})?randomize=false"
    assert activemq_pair.wait_master(timeout=5) is master
    assert master.is_serving() and not slave.is_serving()
    assert slave.alive and port_refuses(slave.stomp_port)

    dest = queue_name()
    c = RawStomp(master.stomp_port)
    assert c.connect()[0] == "CONNECTED"
    for i in range(5):
        command, headers, _ = c.send(dest, f"m{i}".encode(), receipt=f"r{i}")
        assert (command, headers.get("receipt-id")) == ("RECEIPT", f"r{i}")
    c.close()

    master_pid = master.pid
    assert master_pid is not None
    t0 = time.monotonic()
    assert activemq_pair.kill_master() is master
    assert not master.alive and not pid_running(master_pid)
    new_master = activemq_pair.wait_master(timeout=30)
    takeover = time.monotonic() - t0
    print(f"\nActiveMQ shared-store takeover after SIGKILL (lock interval 500 ms): {takeover:.2f} s")
    assert new_master is slave
    assert takeover < 30

    got = []
    c = RawStomp(slave.stomp_port)
    try:
        assert c.connect()[0] == "CONNECTED"
        c.send_frame("SUBSCRIBE", {"destination": dest, "id": "s", "ack": "auto"})
        for _ in range(5):
            command, _headers, body = c.read_frame()
            assert command == "MESSAGE"
            got.append(body)
    finally:
        c.close()
    assert sorted(got) == [f"m{i}".encode() for i in range(5)]


@pytest.mark.activemq
def test_pair_context_manager_leaves_no_java_behind(tmp_path: Path) -> None:
    require_activemq()
    with ActiveMQPair(tmp_path / "ok") as pair:
        pids = pair.pids()
        assert len(pids) == 2 and all(pid_running(p) for p in pids)
    assert not any(pid_running(p) for p in pids)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), ActiveMQPair(tmp_path / "boom") as pair:
        pids = pair.pids()
        assert stomp_handshake("127.0.0.1", pair.master.stomp_port)
        raise Boom
    assert not any(pid_running(p) for p in pids)
    assert os.path.isdir(tmp_path / "boom" / "shared-kahadb")


@pytest.mark.activemq
def test_a_port_taken_before_the_first_start_is_replaced(activemq_factory: ActiveMQFactory) -> None:
    node = activemq_factory.node("race", start=False)
    blocked = node.stomp_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", blocked))
        squatter.listen(1)
        node.start(timeout=60)
        assert node.stomp_port != blocked
        assert node.is_serving()
    assert "Address already in use" in node.log_tail(None)


@pytest.mark.activemq
def test_the_broker_dies_with_a_hard_killed_test_process(tmp_path: Path) -> None:
    """A SIGKILLed test run runs no cleanup; the JVM must not outlive it (setpriv --pdeathsig)."""
    require_activemq()
    pidfile = tmp_path / "java.pid"
    code = textwrap.dedent(f"""
        import time
        from amqtransport.processes.activemq import ActiveMQNode
        node = ActiveMQNode({str(tmp_path)!r}, "orphan").start()
        open({str(pidfile)!r}, "w").write(str(node.pid))
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() or not pidfile.read_text():
            assert parent.poll() is None and time.monotonic() < deadline, "node did not start"
            time.sleep(0.1)
        java = int(pidfile.read_text())
        assert pid_running(java)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while pid_running(java) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_running(java):  # do not leave it behind even when the test fails
        os.kill(java, 9)
        pytest.fail("the ActiveMQ JVM outlived its SIGKILLed parent")
