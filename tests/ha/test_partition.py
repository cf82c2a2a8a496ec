"""Partitions of a replicated pair behave as documented in amqtransport/broker/ha/node.py.

The slave's master connector goes through a TCP forwarder the test controls, so the
replication link can be cut while both processes live; the takeover-check address is
a bare listener the test opens and closes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ha_helpers import Listener, forwarded_pair, never_master, refuses, wait_for

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(120)


def test_link_cut_while_master_lives_makes_no_second_master(tmp_path: Path) -> None:
    """Case 4: only the replication link is cut. The slave sees the master alive on its
    own address and stays slave; the master serves alone; the link heals and resyncs."""
    check = Listener().open()
    try:
        with forwarded_pair(tmp_path, takeover_check=check.address, link_timeout=1.0) as (bp, fwd):
            bp.start()
            with amqtransport.connect(bp.uri) as c:
                for i in range(20):
                    c.send("/queue/p", f"before-{i}")
                fwd.cut()
                # the master keeps serving: receipts come (from its disk alone) once it has
                # dropped the slave and the slave (on its own address) agreed to stand by
                t0 = time.monotonic()
                for i in range(20):
                    c.send("/queue/p", f"during-{i}")
                print(f"\nsends during the cut resumed after {time.monotonic() - t0:.2f} s")
                assert c.connected_uri == bp.a.uri
                never_master(bp.b, 3.0)
                st = bp.b.status()
                assert st["amq-ha-role"] in ("slave", "waiting"), st
                # the slave knew the master was alive: it re-links ("master answers"/"master
                # alive"), or the master's stand-by request reached it first and it agreed
                # ("goes on without us"; its store is then no copy and it does not decide)
                log_b = bp.b.log_text()
                assert any(s in log_b for s in ("master alive", "master answers", "is alive and goes on without us")), log_b
                fwd.restore()
                bp.wait_in_sync(30)
                wait_for(lambda: bp.b.status().get("amq-ha-messages") == "40", 10, "slave resync to 40")
            # and the resynced slave really has everything: kill the master now
            bp.kill_master()
            assert bp.wait_master(20) is bp.b
            with amqtransport.connect(bp.uri) as c:
                sub = c.subscribe("/queue/p", ack="client-individual")
                got = set()
                while (m := sub.receive(timeout=3)) is not None:
                    got.add(m.text)
                    m.ack()
            assert got == {f"before-{i}" for i in range(20)} | {f"during-{i}" for i in range(20)}
    finally:
        check.close()


def test_takeover_check(tmp_path: Path) -> None:
    """Case 5 seen from the slave: master gone AND takeover check unreachable -> no
    takeover; once the check answers, the slave takes over with everything."""
    check = Listener().open()
    with BrokerPair("replicated", tmp_path, takeover_check=check.address, link_timeout=1.0) as bp:
        with amqtransport.connect(bp.uri) as c:
            for i in range(10):
                c.send("/queue/t", f"m{i}")
        check.close()
        bp.kill_master()
        never_master(bp.b, 3.0)
        assert "takeover check" in bp.b.log_text() and "not taking over" in bp.b.log_text()
        check.open()
        t0 = time.monotonic()
        assert bp.wait_master(20) is bp.b
        print(f"\ntook over {time.monotonic() - t0:.2f} s after the check address came back")
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe("/queue/t", ack="auto")
            got = {m.text for m in iter(lambda: sub.receive(timeout=2), None)}
        assert got == {f"m{i}" for i in range(10)}
    check.close()


def test_master_fences_itself_when_isolated(tmp_path: Path) -> None:
    """Case 6 seen from the master: it loses its synced slave and cannot reach the
    takeover check -> it closes its client port instead of serving alone."""
    check = Listener().open()
    with BrokerPair("replicated", tmp_path, takeover_check=check.address, link_timeout=1.0) as bp:
        check.close()
        bp.b.kill()
        wait_for(lambda: refuses(bp.a.port), 15, "the master to close its client port")
        # the port closes first as the master holds its receipts (suspect), then the
        # decision that the takeover check is unreachable fences it (after that check's
        # timeout: under load the log line can follow the closed port by a second or two)
        wait_for(lambda: "fencing" in bp.a.log_text(), 15, "the master's fencing decision")
        never_master(bp.a, 1.0)
        # the network heals, but the slave had synced from us and is unreachable: it may
        # have taken over with newer data, so the old master waits for it (rule 3)
        check.open()
        never_master(bp.a, 1.5)
        assert "may hold newer data" in bp.a.log_text() or "waiting" in bp.a.status()["amq-ha-role"]
        bp.b.start()
        assert bp.wait_master(20) is bp.a
        assert bp.wait_in_sync(20) is bp.b
    check.close()


def test_frozen_master_is_replaced_and_demotes_itself_on_resume(tmp_path: Path) -> None:
    """Case 3 (a frozen master): the master freezes (SIGSTOP: its sockets stay open
    but nothing answers), the slave takes over after --link-timeout; when the old master
    resumes it finds a master with a higher epoch, stops serving and resyncs as slave."""
    import os
    import signal

    with BrokerPair("replicated", tmp_path, link_timeout=1.0) as bp:
        with amqtransport.connect(bp.uri) as c:
            for i in range(10):
                c.send("/queue/f", f"m{i}")
        assert bp.a.proc is not None
        os.kill(bp.a.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            assert bp.wait_master(30, exclude=bp.a) is bp.b
            print(f"\nfrozen master replaced after {time.monotonic() - t0:.2f} s")
            assert int(bp.b.status()["amq-ha-epoch"]) == 2
        finally:
            os.kill(bp.a.pid, signal.SIGCONT)
        wait_for(lambda: bp.a.status().get("amq-ha-role") == "slave", 20, "the old master to rejoin as slave")
        assert "demoting to slave" in bp.a.log_text()
        assert bp.wait_in_sync(20) is bp.a
        assert bp.a.status()["amq-ha-messages"] == "10"
        assert refuses(bp.a.port)


def test_master_with_a_wiped_store_is_told_to_step_down(tmp_path: Path) -> None:
    """A configured master that comes back with an empty data dir knows nothing of its
    peer and starts as master at epoch 1; the real master (epoch 2) finds it on its next
    probe and asks it to step down; it rejoins as slave and resyncs."""
    import shutil

    with BrokerPair("replicated", tmp_path, users={"admin": "pw"}, master_user="admin",
                    master_password="pw") as bp:
        with amqtransport.connect(bp.uri, login="admin", passcode="pw") as c:
            for i in range(10):
                c.send("/queue/w", f"m{i}")
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        shutil.rmtree(bp.a.data_dir)
        bp.a.start()
        wait_for(lambda: bp.a.status().get("amq-ha-peer-state") == "in-sync", 30,
              "the wiped node to step down and resync")
        assert bp.a.status()["amq-ha-role"] == "slave"
        assert "asks us to step down" in bp.a.log_text()
        assert bp.a.status()["amq-ha-messages"] == "10"
        assert bp.wait_master() is bp.b


def test_a_scheduled_send_refused_during_a_link_partition_still_fires(tmp_path: Path) -> None:
    """Found by the nemesis (replicated, the replication link partitioned, lost p-sched:240):
    the master dropped its slave before it acked a scheduled SEND, refused that receipt
    (cutting the producer) and went on as master. The job was on its disk but never joined
    its timetable; the producer's replay was a duplicate of it (receipted), so the message
    was never delivered. It is delivered, once, when the job's record counts after all."""
    check = Listener().open()
    try:
        with forwarded_pair(tmp_path, takeover_check=check.address, link_timeout=1.0) as (bp, fwd):
            bp.start()
            bp.wait_in_sync(30)
            with amqtransport.connect(bp.uri) as c:
                c.send("/queue/warm", "warm-up")
                fwd.freeze()  # the link goes silent both ways: the slave never acks what follows
                c.send("/queue/sched", "later", headers={"AMQ_SCHEDULED_DELAY": "2000"})  # receipted in the end
                log_a = bp.a.log_text()
                assert "will never be receipted" in log_a, log_a  # the case: the first SEND was refused
                assert c.connected_uri == bp.a.uri
                sub = c.subscribe("/queue/sched", ack="client-individual")
                got = []
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not got:
                    if (m := sub.receive(timeout=1)) is not None:
                        got.append(m.text)
                        m.ack()
                while (m := sub.receive(timeout=3)) is not None:  # and no second copy
                    got.append(m.text)
                    m.ack()
            assert got == ["later"], f"the receipted scheduled SEND was delivered {got}; " + bp.describe()
    finally:
        check.close()
