"""Both HA modes under SIGKILL: every receipted message consumed exactly once.

Real processes: a producer (receipts) and a consumer (client-individual, dedupe on)
run through the pair's failover URI while the master is killed with SIGKILL; the
killed node is restarted, rejoins as slave, and a second kill (of the new master)
still loses nothing. Recovery (kill -> next receipted send) is printed.
"""

from __future__ import annotations

import time

import pytest
from ha_helpers import run_traffic

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("mode", ["replicated", "shared-store"])
def test_sigkill_master_twice_loses_nothing(mode: str, tmp_path: object) -> None:
    with BrokerPair(mode, tmp_path, lock_interval=0.05) as bp:  # type: ignore[arg-type]
        first = bp.wait_master()
        epochs: list[int] = [int(first.status()["amq-ha-epoch"])]
        killed: list[object] = []

        def kill_and_reintroduce_later() -> None:
            killed.append(bp.kill_master())

        def second_kill() -> None:
            # the first victim has rejoined as slave (and, replicated, resynced) by now
            node = bp.wait_master()
            assert node is not first
            killed.append(bp.kill_master())

        def between() -> None:
            kill_and_reintroduce_later()

        kills = [between, second_kill]

        # run the first half, restart the victim, then the second half with the second kill
        res1 = run_traffic(bp.uri, kills[:1], total=240, kill_every=120)
        new_master = bp.wait_master()
        epochs.append(int(new_master.status()["amq-ha-epoch"]))
        victim = killed[0]
        bp.restart(victim)  # type: ignore[arg-type]
        if mode == "replicated":
            slave = bp.wait_in_sync(30)
            assert slave is victim, bp.describe()
            st = slave.status()
            assert st["amq-ha-role"] == "slave"
            assert int(st["amq-ha-epoch"]) == epochs[-1], "the rejoined node resynced at the new epoch"
        else:
            victim.wait_line("role slave", 30)  # type: ignore[attr-defined]
        res2 = run_traffic(bp.uri, kills[1:], total=240, kill_every=120, queue="/queue/ha.test2")
        last = bp.wait_master()
        assert last is victim, "the reintroduced node took over on the second kill"
        assert int(last.status()["amq-ha-epoch"]) > epochs[-1]

    for res in (res1, res2):
        print("receipted", len(res.receipted), "consumed", sum(res.consumed.values()), res.recovery)
    for res in (res1, res2):
        assert not res.errors, res.errors
        res.check_exactly_once()
        assert len(res.receipted) >= 230
        assert res.recovery, "no receipted send after the kill"
    print(f"\n[{mode}] recovery after SIGKILL: first {res1.recovery[0]:.3f} s, "
          f"second {res2.recovery[0]:.3f} s; receipted {len(res1.receipted)}+{len(res2.receipted)}, "
          f"unconfirmed {len(res1.failed)}+{len(res2.failed)}")


def test_status_command_and_pair_uri(tmp_path: object) -> None:
    import json
    import subprocess
    import sys

    with BrokerPair("replicated", tmp_path) as bp:  # type: ignore[arg-type]
        assert bp.uri == f"failover:(tcp://127.0.0.1:{bp.a.port},tcp://127.0.0.1:{bp.b.port})?randomize=false"
        out = subprocess.run(
            [sys.executable, "-m", "amqtransport", "broker", "status", "--port", str(bp.b.ha_port), "--json"],
            capture_output=True, text=True, timeout=30,
        )
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert data["role"] == "slave" and data["peer-state"] == "in-sync" and data["epoch"] == 1
        # the master answers on its client port too
        out = subprocess.run(
            [sys.executable, "-m", "amqtransport", "broker", "status", "--port", str(bp.a.port), "--json"],
            capture_output=True, text=True, timeout=30,
        )
        data = json.loads(out.stdout)
        assert data["role"] == "master" and data["messages"] == 0 and data["peer-state"] == "in-sync"
        t0 = time.monotonic()
        bad = subprocess.run(
            [sys.executable, "-m", "amqtransport", "broker", "status", "--port", str(bp.b.port)],
            capture_output=True, text=True, timeout=30,
        )
        assert bad.returncode == 1 and "cannot reach" in bad.stderr, "slave's client port is closed"
        assert time.monotonic() - t0 < 25


def test_slave_joining_mid_stream_then_master_killed(tmp_path: object) -> None:
    """The seam between the snapshot and the stream: a slave attaches while a producer
    and a consumer run, then the master is killed; nothing receipted is lost."""
    bp = BrokerPair("replicated", tmp_path)  # type: ignore[arg-type]
    try:
        bp.a.start()
        bp.wait_master()
        with amqtransport.connect(bp.uri) as c:
            for i in range(300):
                c.send("/queue/backlog", f"b{i}")  # a snapshot worth the name

        def start_slave() -> None:
            bp.b.start()

        def kill_after_sync() -> None:
            bp.wait_in_sync(30)
            bp.kill_master()

        res = run_traffic(bp.uri, [start_slave, kill_after_sync], total=450, kill_every=150)
        assert not res.errors, res.errors
        res.check_exactly_once()
        assert bp.wait_master() is bp.b
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe("/queue/backlog", ack="auto")
            got = {m.text for m in iter(lambda: sub.receive(timeout=2), None)}
        assert got == {f"b{i}" for i in range(300)}
    finally:
        bp.stop()


def test_replicated_state_beyond_sends(tmp_path: object) -> None:
    """Acks, transactions and durable subscriptions reach the slave too."""
    with BrokerPair("replicated", tmp_path) as bp:  # type: ignore[arg-type]
        with amqtransport.connect(bp.uri, client_id="dur-client") as c:
            sub = c.subscribe("/topic/news", headers={"activemq.subscriptionName": "s1"})
            c.send("/topic/news", "n0")
            m = sub.receive(timeout=5)
            assert m is not None and m.text == "n0"
        with amqtransport.connect(bp.uri) as c:
            c.send("/topic/news", "n1-while-offline")
            with c.transaction() as tx:
                tx.send("/queue/tx", "t1")
                tx.send("/queue/tx", "t2")
            for i in range(4):
                c.send("/queue/acked", f"a{i}")
            q = c.subscribe("/queue/acked", ack="client-individual")
            for _ in range(2):
                m = q.receive(timeout=5)
                assert m is not None
                m.ack()
            # the acks went before this send on the same connection: its receipt (both
            # disks) covers their journal records too
            c.send("/queue/fence", "x")
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        with amqtransport.connect(bp.uri, client_id="dur-client") as c:
            sub = c.subscribe("/topic/news", headers={"activemq.subscriptionName": "s1"})
            m = sub.receive(timeout=5)
            assert m is not None and m.text == "n1-while-offline"
            tx = c.subscribe("/queue/tx")
            assert {x.text for x in iter(lambda: tx.receive(timeout=2), None)} == {"t1", "t2"}
            q = c.subscribe("/queue/acked")
            rest = {x.text for x in iter(lambda: q.receive(timeout=2), None)}
            assert len(rest) == 2 and rest < {f"a{i}" for i in range(4)}, rest


def test_full_sync_of_big_messages_in_bounded_frames(tmp_path: object) -> None:
    """A slave that attaches to a master holding 24 MiB of 768 KiB messages receives them
    in several bounded SNAP frames (4 MiB each) and has all of them when the master dies."""
    bp = BrokerPair("replicated", tmp_path)  # type: ignore[arg-type]
    try:
        bp.a.start()
        bp.wait_master()
        body = "B" * (768 << 10)
        with amqtransport.connect(bp.uri) as c:
            for i in range(32):
                c.send("/queue/big", f"{i:02d}{body}")
        bp.b.start()
        bp.wait_in_sync(60)
        assert bp.b.status()["amq-ha-messages"] == "32"
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe("/queue/big", ack="auto")
            got = [m.text for m in iter(lambda: sub.receive(timeout=3), None)]
        assert sorted(t[:2] for t in got) == [f"{i:02d}" for i in range(32)]
        assert all(t[2:] == body for t in got)
    finally:
        bp.stop()
