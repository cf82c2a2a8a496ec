"""Replication credentials and the ActiveMQ master/slave options, on real processes."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest
from ha_helpers import (
    forwarded_pair,
    frozen,
    never_master,
    refuses,
    send_in_background,
    wait_for,
    with_opts,
)

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(120)

USERS = {"admin": "secret", "app": "apppw"}


def test_wrong_master_credentials_refused_with_clear_logs(tmp_path: Path) -> None:
    bp = BrokerPair("replicated", tmp_path, users=USERS, master_user="admin", master_password="secret",
                    slave_master_user="admin", slave_master_password="wrong")
    try:
        bp.a.start()
        bp.wait_master()
        bp.b.start()
        wait_for(lambda: "refused" in bp.b.log_text(), 15, "the slave's refusal log line")
        slave_log = bp.b.log_text()
        assert "replication link to master tcp://127.0.0.1:" in slave_log
        assert "authentication failed" in slave_log and "--master-user/--master-password" in slave_log
        master_log = bp.a.log_text()
        assert "replication link from slave b" in master_log and "bad credentials for login 'admin'" in master_log
        assert bp.a.status()["amq-ha-peer-state"] == "none"
        assert bp.b.status()["amq-ha-role"] == "waiting"
        never_master(bp.b, 1.0)
    finally:
        bp.stop()


def test_right_credentials_and_no_credentials(tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path / "ok", users=USERS, master_user="app", master_password="apppw") as bp:
        assert bp.b.status()["amq-ha-peer-state"] == "in-sync"
        with amqtransport.connect(bp.uri, login="app", passcode="apppw") as c:
            c.send("/queue/auth", "x")
    bp = BrokerPair("replicated", tmp_path / "none", users=USERS)
    try:
        bp.a.start()
        bp.wait_master()
        bp.b.start()
        wait_for(lambda: "bad credentials for login None" in bp.a.log_text(), 15, "refusal of a login-less link")
    finally:
        bp.stop()


def test_shutdown_on_master_failure_keeps_a_cold_backup(tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path, slave_args=["--shutdown-on-master-failure"]) as bp:
        with amqtransport.connect(bp.uri) as c:
            for i in range(5):
                c.send("/queue/cold", f"m{i}")
        bp.kill_master()
        assert bp.b.proc is not None
        assert bp.b.proc.wait(15) == 0
        assert any(line.startswith("role cold-backup") for line in bp.b.lines)
        assert "not taking over" in bp.b.log_text()
        assert refuses(bp.b.port)
        # the backup's store is complete: start it as a plain broker on a copy
        from amqtransport.broker import EmbeddedBroker

        with EmbeddedBroker(port=0, data_dir=bp.b.data_dir) as single:
            with amqtransport.connect(single.uri) as c:
                sub = c.subscribe("/queue/cold")
                got = {m.text for m in iter(lambda: sub.receive(timeout=2), None)}
        assert got == {f"m{i}" for i in range(5)}


def test_wait_for_slave_and_shutdown_on_slave_failure(tmp_path: Path) -> None:
    bp = BrokerPair("replicated", tmp_path, master_args=["--wait-for-slave", "--shutdown-on-slave-failure"])
    try:
        bp.a.start()
        bp.a.wait_line("role master", 15)
        time.sleep(0.5)
        assert refuses(bp.a.port), "--wait-for-slave: no client port before a slave has synced"
        assert bp.a.status()["amq-ha-listening"] == "false"
        bp.b.start()
        assert bp.wait_master(20) is bp.a
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/w", "one")
        bp.b.kill()
        assert bp.a.proc is not None
        assert bp.a.proc.wait(15) == 3
        assert "--shutdown-on-slave-failure" in bp.a.log_text()
    finally:
        bp.stop()


def test_shared_store_clean_shutdown_hands_over_and_failback(tmp_path: Path) -> None:
    with BrokerPair("shared-store", tmp_path, lock_interval=0.05, slave_args=["--allow-failback"]) as bp:
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/s", "one")
        t0 = time.monotonic()
        assert bp.a.terminate() == 0
        assert bp.wait_master(10) is bp.b
        print(f"\nclean-shutdown handover in {time.monotonic() - t0:.2f} s")
        assert int(bp.b.status()["amq-ha-epoch"]) == 2
        # failback: the primary (a) returns and b, started with --allow-failback, yields
        bp.a.start()
        wait_for(lambda: bp.a.status().get("amq-ha-role") == "master", 15, "failback to the primary")
        bp.b.wait_line("role slave", 10, start=2)
        assert bp.wait_master(10) is bp.a
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe("/queue/s")
            m = sub.receive(timeout=5)
            assert m is not None and m.text == "one"


def test_receipt_waits_for_the_slave(tmp_path: Path) -> None:
    """A receipt means both disks: with the slave frozen (SIGSTOP) a receipted send
    stays blocked. Once the master gives up on the slave (--link-timeout) it cannot
    tell a frozen slave from one that took over, so it cuts the client (the client
    replays the send) and holds every receipt until the slave answers its stand-by
    request: after SIGCONT (until then it refuses new client CONNECTs too)."""
    with BrokerPair("replicated", tmp_path, link_timeout=1.0) as bp:
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/r", "warm-up")
            with frozen(bp.b):
                done = send_in_background(c, "/queue/r", "gated")
                assert not done.wait(0.5), "receipt came while the slave could not have the message"
                st = bp.a.status()
                assert int(st["amq-ha-seq"]) > int(st["amq-ha-acked"]), st
                wait_for(lambda: "amq-ha-suspect" in bp.a.status(), 10, "the master to drop the frozen slave")
                assert not done.wait(3.0), "receipted on one disk while the peer could not be asked to stand by"
                st = bp.a.status()
                # still suspect: the cut client cannot even reconnect (CONNECT refused) meanwhile
                assert st["amq-ha-role"] == "master" and "amq-ha-suspect" in st, st
            assert done.wait(20), "the thawed slave stood by but the receipt never came"
            log = bp.a.log_text()
            assert "no ack for seq" in log or "slave silent" in log
            assert "client connections so their clients replay" in log and "receipts resume" in log, log[-3000:]
        # the slave relinks and resyncs both messages (the replayed copy was dropped by its key)
        wait_for(lambda: bp.b.status().get("amq-ha-peer-state") == "in-sync"
              and bp.b.status().get("amq-ha-messages") == "2", 30, "the thawed slave to resync")


def test_garbage_on_the_ha_port_is_answered_and_harmless(tmp_path: Path) -> None:
    import socket

    from amqtransport.broker.ha.wire import ha_request_sync

    with BrokerPair("replicated", tmp_path) as bp:
        for junk in (b"\x00\x01garbage\n\n\x00", b"SEND\ndestination:/queue/x\n\nhi\x00",
                     b"CONNECT\naccept-version:1.2\n\n\x00"):
            with socket.create_connection(("127.0.0.1", bp.a.ha_port), timeout=5) as s:
                s.sendall(junk)
                data = b""
                while chunk := s.recv(4096):
                    data += chunk
            assert data.startswith(b"ERROR"), data
        frame = ha_request_sync("127.0.0.1", bp.a.ha_port)
        assert frame.get("amq-ha-role") == "master"
        assert bp.a.alive and bp.b.status()["amq-ha-peer-state"] == "in-sync"


def test_shutdown_on_slave_failure_survives_a_slave_relink(tmp_path: Path) -> None:
    """The slave's link goes silent and half-open (its close never reaches the master);
    the slave re-links through a new connection while the master still holds the old
    one. Before: the master took the replacement for a lost slave and stopped
    (--shutdown-on-slave-failure) while the slave was wiping its store for the full
    sync: neither node could serve. Now a re-link is not a slave failure."""
    with forwarded_pair(tmp_path, master_args=["--shutdown-on-slave-failure", "--link-timeout", "3"],
                        slave_args=["--link-timeout", "1.5"]) as (bp, fwd):  # the slave gives up first
        bp.start()
        with amqtransport.connect(bp.uri) as c:
            for i in range(20):
                c.send("/queue/relink", f"m{i}")
        fwd.freeze()
        wait_for(lambda: "replaced by a new connection" in bp.a.log_text(), 15, "the slave to re-link")
        time.sleep(1.0)
        assert bp.a.alive, "the master stopped on a slave re-link:\n" + bp.a.log_text()[-2000:]
        wait_for(lambda: bp.b.status().get("amq-ha-peer-state") == "in-sync"
                 and bp.b.status().get("amq-ha-messages") == "20", 20, "the slave to resync")
        assert bp.wait_master(5) is bp.a
        with amqtransport.connect(with_opts(bp.uri, "maxReconnectAttempts=20")) as c:
            c.send("/queue/relink", "after")
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        assert _messages(bp.uri, "/queue/relink") == {f"m{i}" for i in range(20)} | {"after"}


def _messages(uri: str, queue: str) -> set[str]:
    with amqtransport.connect(uri) as c:
        sub = c.subscribe(queue)
        return {m.text for m in iter(functools.partial(sub.receive, timeout=2), None)}


def test_slave_of_a_strict_master_takes_over_when_it_stops(tmp_path: Path) -> None:
    """--shutdown-on-slave-failure never receipts without the slave's ack, so a synced
    slave of such a master holds every receipted message: when that master stops, the
    slave takes over -- also after a restart of its own. Before: (1) a slave that saw
    the stopping master still answering as master went back to deciding and then
    waited for it forever (1 round in 4 measured with a cut link); (2) the slave, killed
    and restarted after the master had stopped, waited for it forever."""
    for round_ in range(2):  # (1) the replication link is cut: the master stops, the slave takes over
        with forwarded_pair(tmp_path / f"r{round_}", link_timeout=1.0,
                            master_args=["--shutdown-on-slave-failure"]) as (bp, fwd):
            bp.start()
            with amqtransport.connect(bp.uri) as c:
                for i in range(5):
                    c.send("/queue/strict", f"m{i}")
            fwd.cut()
            assert bp.a.proc is not None and bp.a.proc.wait(15) == 3
            assert bp.wait_master(15) is bp.b, f"round {round_}: nobody serves; " + bp.describe()
            assert _messages(bp.uri, "/queue/strict") == {f"m{i}" for i in range(5)}
    # (2) the slave is killed: the master stops; the slave restarts alone and takes over
    with BrokerPair("replicated", tmp_path / "restart", link_timeout=1.0,
                    master_args=["--shutdown-on-slave-failure"]) as bp:
        with amqtransport.connect(bp.uri) as c:
            for i in range(5):
                c.send("/queue/strict", f"m{i}")
        bp.b.kill()
        assert bp.a.proc is not None and bp.a.proc.wait(15) == 3
        bp.b.start()
        assert bp.wait_master(15) is bp.b, "the restarted slave of a strict master did not take over; " + bp.describe()
        assert "it never receipts without this copy" in bp.b.log_text()
        assert _messages(bp.uri, "/queue/strict") == {f"m{i}" for i in range(5)}


def test_operator_releases_a_master_whose_peer_is_gone(tmp_path: Path) -> None:
    """A slave whose host hangs can neither answer nor refuse: its master holds every
    receipt. `amq broker release` (signed with the cluster secret) tells the master the
    peer is gone for good: it receipts alone again at once."""
    import subprocess
    import sys

    amq = [sys.executable, "-m", "amqtransport", "broker", "release"]
    with BrokerPair("replicated", tmp_path / "pair", link_timeout=1.0) as bp:
        assert bp.cluster_password_file is not None
        secret = ["--cluster-password-file", str(bp.cluster_password_file)]
        idle = subprocess.run([*amq, "--port", str(bp.a.ha_port), *secret, "--yes"], capture_output=True, text=True,
                              timeout=30)
        assert idle.returncode == 1 and "not holding receipts" in idle.stderr, idle.stderr
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/rel", "warm-up")
            with frozen(bp.b):
                done = send_in_background(c, "/queue/rel", "held")
                wait_for(lambda: "amq-ha-suspect" in bp.a.status(), 10, "the master to drop the frozen slave")
                assert not done.wait(1.0)
                other = tmp_path / "other.secret"
                other.write_text("x" * 32)
                wrong = subprocess.run([*amq, "--port", str(bp.a.ha_port), "--cluster-password-file", str(other),
                                        "--yes"], capture_output=True, text=True, timeout=30)
                assert wrong.returncode == 1 and "bad cluster secret" in wrong.stderr, wrong.stderr
                assert not done.is_set()
                ok = subprocess.run([*amq, "--port", str(bp.a.ha_port), *secret, "--yes"], capture_output=True,
                                    text=True, timeout=30)
                assert ok.returncode == 0 and "receipts alone again" in ok.stdout, ok.stderr
                assert done.wait(20), "the release did not free the receipt"
                assert "released the receipts" in bp.a.log_text()
        wait_for(lambda: bp.b.status().get("amq-ha-peer-state") == "in-sync"
                 and bp.b.status().get("amq-ha-messages") == "2", 30, "the thawed slave to resync")
