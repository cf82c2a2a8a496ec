"""A replicated pair with a witness (``amq broker witness``, ``--witness``): real processes.

Without a witness a master whose slave hangs holds every receipt until the slave is back
(tests/ha/test_suspect_port.py); with one it goes on receipting on the witness's lease.
A frozen master is replaced only with the witness's grant once its lease ran out, and is
fenced when it thaws; a witness killed alone changes nothing while the nodes see each
other; a restarted witness does not grant twice (its state is durable); a grant the other
node never used (it stood by meanwhile) does not keep the pair without a master.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import threading
import time
import urllib.request
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from ha_helpers import frozen, raw_connect, raw_send, read_frames, wait_for

import amqtransport
from amqtransport.broker.ha.lease import dump_state, load_state, pair_id, pair_key
from amqtransport.broker.ha.wire import ha_request_sync
from amqtransport.broker.ha.witness import (
    RENEW_HEADER,
    STATE_FILE,
    TAKEOVER_HEADER,
    WITNESS_STATUS,
    WitnessAnswer,
    WitnessClient,
)
from amqtransport.processes.witness import WitnessProcess
from amqtransport.testing.broker_pair import BrokerPair, HaNodeProcess
from amqtransport.testing.ports import free_port

pytestmark = pytest.mark.timeout(240)

LINK_TIMEOUT = 1.0  # a lease lasts 1.5 s


def _witness_status(witness: WitnessProcess, secret_file: Path) -> dict[str, str]:
    """What the witness says of the pair whose cluster secret is in ``secret_file``."""
    pid = pair_id(pair_key(secret_file.read_text().strip().encode()))
    return dict(ha_request_sync(witness.host, witness.port, 5.0, {WITNESS_STATUS: pid}).headers)


def _in_sync(bp: BrokerPair, witness: WitnessProcess) -> tuple[HaNodeProcess, HaNodeProcess]:
    """The master and its in-sync slave, once the witness knows the master has one."""
    master = bp.wait_master(30)
    slave = bp.other(master)
    wait_for(lambda: master.status().get("amq-ha-peer-state") == "in-sync", 30, "the slave to sync")
    assert bp.cluster_password_file is not None
    secret = bp.cluster_password_file
    wait_for(lambda: _witness_status(witness, secret).get("amq-witness-alone") == "false", 30,
             "the master to tell the witness that it has an in-sync slave")
    assert master.status().get("amq-ha-witness-state") == "up"
    return master, slave


def _log_line(log: str, text: str) -> tuple[float, str]:
    """(its timestamp in seconds, the line) of the first line of a node's log with ``text``."""
    line = next((ln for ln in log.splitlines() if text in ln), None)
    assert line is not None, f"no {text!r} in the log: {log[-3000:]}"
    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp(), line


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_a_master_whose_slave_hangs_keeps_receipting_on_the_witness_lease(tmp_path: Path) -> None:
    with WitnessProcess(tmp_path / "witness") as witness, BrokerPair(
        "replicated", tmp_path / "pair", link_timeout=LINK_TIMEOUT, witness=witness.address
    ) as bp:
        master, slave = _in_sync(bp, witness)
        queue = "/queue/witness.slave-hangs"
        done: list[str] = []
        errors: list[BaseException] = []
        with amqtransport.connect(bp.uri) as c:
            c.send(queue, "before", idempotency_key="k-before")
            with frozen(slave):
                frozen_at = time.monotonic()
                first_at: list[float] = []

                def send() -> None:
                    try:
                        for i in range(5):  # the first is in flight while the master drops the slave
                            c.send(queue, f"during-{i}", idempotency_key=f"k-during-{i}")
                            done.append(f"during-{i}")
                            first_at.append(time.monotonic())
                    except BaseException as exc:  # noqa: BLE001 - reported below
                        errors.append(exc)

                t = threading.Thread(target=send, daemon=True)
                t.start()
                # receipts resume while the slave is still frozen: the witness renews the lease
                t.join(90)
                assert not errors, errors
                assert done == [f"during-{i}" for i in range(5)], f"receipted while the slave hung: {done}"
                assert _stopped(slave.pid), "the slave was thawed before the receipts came"
                log = master.log_text()
                assert "the witness renews our lease" in log, log[-3000:]
                # the witness first: a frozen slave's HA port accepts the stand-by request and
                # never answers, so asking it first held every receipt for a whole second more
                held_at, _ = _log_line(log, "receipts without a slave ack are held")
                resumed_at, resumed = _log_line(log, "receipts resume")
                assert "the peer does not answer" not in resumed, resumed
                print(f"receipts held -> resumed on the witness lease: {resumed_at - held_at:.3f} s")
                print(f"slave frozen -> first receipt from the master alone: {first_at[0] - frozen_at:.2f} s "
                      f"(--link-timeout {LINK_TIMEOUT:g} s, lease {2 * LINK_TIMEOUT:g} s)")
                wait_for(lambda: float(master.status().get("amq-ha-lease", "0")) > 0, 30,
                         "the master's status to show its lease")
        # the slave is back: it relinks and resyncs; nothing receipted is missing
        wait_for(lambda: master.status().get("amq-ha-peer-state") == "in-sync", 60, "the slave to resync")
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe(queue, ack="auto")
            got = {m.text for m in iter(lambda: sub.receive(timeout=1.5), None)}
        assert {"before", *done} <= got


def test_a_master_that_loses_its_slave_keeps_its_client_port_open_while_its_lease_runs(tmp_path: Path) -> None:
    """Issue 24: a master that loses its slave cuts the clients whose receipts waited for
    it; they reconnect at once. It used to close its client port while it asked the
    witness (a few milliseconds): the clients found it refusing and went to the other
    address -- the lost slave's, which an isolated host leaves unanswered for seconds (the
    nemesis's isolate-node of the slave: 4 empty windows after the master had resumed).
    While its own lease runs the peer cannot be master, so the port stays open."""
    with WitnessProcess(tmp_path / "witness") as witness, BrokerPair(
        "replicated", tmp_path / "pair", link_timeout=LINK_TIMEOUT, witness=witness.address
    ) as bp:
        master, slave = _in_sync(bp, witness)
        mark = len(master.log_text())
        with amqtransport.connect(bp.uri) as c, frozen(slave):
            c.send("/queue/witness.port-open", "m0", idempotency_key="k0")
            wait_for(lambda: "receipts resume" in master.log_text()[mark:], 60,
                     "the master to resume on its lease")
            c.send("/queue/witness.port-open", "m1", idempotency_key="k1")
            log = master.log_text()[mark:]
            assert "the witness renews our lease" in log, log[-3000:]
            # a closed port is bound again when receipts resume: the server logs it
            assert f"broker {master.name} listening on" not in log, "the client port was closed:\n" + log[-3000:]
            assert _stopped(slave.pid)


def test_a_frozen_master_is_replaced_only_with_the_witness_grant_and_fenced_when_it_thaws(tmp_path: Path) -> None:
    with WitnessProcess(tmp_path / "witness") as witness, BrokerPair(
        "replicated", tmp_path / "pair", link_timeout=LINK_TIMEOUT, witness=witness.address
    ) as bp:
        old, new = _in_sync(bp, witness)
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/witness.frozen", "warm-up")
        queue = "/queue/witness.frozen"
        socks = [raw_connect(old.port) for _ in range(4)]
        bodies = [f"in-flight-{i}" for i in range(len(socks))]
        try:
            os.kill(old.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                for sock, body in zip(socks, bodies, strict=True):
                    raw_send(sock, queue, body, receipt=body, idempotency_key=f"key-{body}")
                assert bp.wait_master(60, exclude=old) is new
                print(f"master frozen -> the slave serves as master: {time.monotonic() - frozen_at:.2f} s "
                      f"(--link-timeout {LINK_TIMEOUT:g} s, lease {2 * LINK_TIMEOUT:g} s)")
            finally:
                os.kill(old.pid, signal.SIGCONT)
            until = time.monotonic() + 5
            receipted = {body for sock, body in zip(socks, bodies, strict=True)
                         if any(f.startswith(b"RECEIPT") for f in read_frames(sock, until)[0])}
        finally:
            for sock in socks:
                sock.close()
        assert not receipted, f"the thawed master receipted: {receipted}"
        # the takeover waited for the witness, which granted it once the old master's lease ran out
        log = new.log_text()
        assert "the witness grants mastership" in log and f"the lease of master {old.name} ran out" in log, \
            log[-3000:]
        # the thawed master leaves the master role and resyncs from the new one
        wait_for(lambda: old.status().get("amq-ha-peer-state") == "in-sync", 60, "the old master to resync")
        assert bp.wait_master(10) is new


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read().decode()


def _metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert values, f"no {name} in /metrics"
    return values[0]


def test_a_slave_refused_while_the_frozen_masters_lease_lasts_asks_again_when_it_ends(tmp_path: Path) -> None:
    """--link-timeout 3 s: the lease (6 s, renewed every second) of a master frozen now
    ends 5-6 s from now; its slave notices after 3 s, probes the silent master for 1 s
    and asks the witness, which refuses for the second or so the lease has left. The
    slave asks again just when it ends: it never goes back to probing the master
    ("isolated"), which cost a second more per round."""
    with WitnessProcess(tmp_path / "witness") as witness, BrokerPair(
        "replicated", tmp_path / "pair", link_timeout=3.0, witness=witness.address
    ) as bp:
        old, new = _in_sync(bp, witness)
        with frozen(old):
            frozen_at = time.monotonic()
            assert bp.wait_master(60, exclude=old) is new
            print(f"master frozen -> the slave serves as master: {time.monotonic() - frozen_at:.2f} s "
                  "(--link-timeout 3 s, lease 6 s)")
        log = new.log_text()
        assert "the witness grants mastership" in log, log[-3000:]
        assert "the witness does not grant mastership (yet)" not in log, log[-3000:]


def test_a_master_that_hands_over_releases_its_lease_so_the_slave_needs_no_wait(tmp_path: Path) -> None:
    """Issue 24: a master that stops (SIGTERM; a full disk fences the same way) hands over
    to its in-sync slave and gives its witness lease back first. Before, the slave asked
    the witness right after the handover and was refused for the whole lease the master
    had just renewed ("the master a holds the lease for 2.0 s more"): about 2 s with no
    master, in every nemesis disk-full round."""
    with WitnessProcess(tmp_path / "witness") as witness, BrokerPair(
        "replicated", tmp_path / "pair", link_timeout=LINK_TIMEOUT, witness=witness.address
    ) as bp:
        old, new = _in_sync(bp, witness)
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/witness.handover", "receipted", idempotency_key="k-handover")
        mark = len(new.log_text())
        old.terminate()
        assert bp.wait_master(60, exclude=old) is new
        log = new.log_text()[mark:]
        assert "hands over at epoch" in log and "the witness grants mastership" in log, log[-3000:]
        assert "holds the lease" not in log, "the slave waited for a lease the master no longer used:\n" + log[-3000:]
        assert "released" in old.log_text(), old.log_text()[-3000:]
        assert bp.cluster_password_file is not None
        assert _witness_status(witness, bp.cluster_password_file).get("amq-witness-holder") == new.name
        with amqtransport.connect(bp.uri) as c:
            msg = c.subscribe("/queue/witness.handover", ack="auto").receive(timeout=10)
            assert msg is not None and msg.text == "receipted"


def test_a_killed_masters_slave_waits_at_most_one_and_a_half_link_timeouts_for_its_lease(tmp_path: Path) -> None:
    """Issue 24: the slave of a killed master finds its ports refusing at once and asks
    the witness, which refuses while the dead master's lease lasts and says how long it
    has left (by the witness's own clock): never more than 1.5 x --link-timeout. Before,
    a lease lasted twice the link timeout: 1.7-2.0 s with no master after every kill."""
    with WitnessProcess(tmp_path / "witness") as witness, BrokerPair(
        "replicated", tmp_path / "pair", link_timeout=LINK_TIMEOUT, witness=witness.address
    ) as bp:
        old, new = _in_sync(bp, witness)
        mark = len(new.log_text())
        old.kill()
        assert bp.wait_master(60, exclude=old) is new
        log = new.log_text()[mark:]
        assert "the witness grants mastership" in log, log[-3000:]
        left = [float(x) for x in re.findall(r"holds the lease for ([0-9.]+) s more", log)]
        assert all(x <= 1.5 * LINK_TIMEOUT for x in left), log[-3000:]


def test_a_witness_killed_alone_changes_nothing_while_the_nodes_see_each_other(tmp_path: Path) -> None:
    http = {"a": free_port(), "b": free_port()}
    link_timeout = 2.0  # the default: a slow machine must not drop the slave while the witness is down
    with WitnessProcess(tmp_path / "witness") as witness, BrokerPair(
        "replicated", tmp_path / "pair", link_timeout=link_timeout, witness=witness.address,
        master_args=["--http", f"127.0.0.1:{http['a']}"], slave_args=["--http", f"127.0.0.1:{http['b']}"],
    ) as bp:
        master, _slave = _in_sync(bp, witness)
        # the console and /metrics show the witness link and the lease
        wait_for(lambda: _metric(_get(http[master.name], "/metrics"), "amq_ha_witness_lease_seconds") > 0, 30,
                 "/metrics to show the master's lease")
        assert _metric(_get(http[master.name], "/metrics"), "amq_ha_witness_up") == 1
        node = json.loads(_get(http[master.name], "/api/node"))
        assert node["witness"]["address"] == witness.address and node["witness"]["state"] == "up", node
        assert f"{witness.address} up, lease" in _get(http[master.name], "/")
        witness.kill()
        wait_for(lambda: master.status().get("amq-ha-witness-state") == "down", 30, "the master to miss the witness")
        wait_for(lambda: _metric(_get(http[master.name], "/metrics"), "amq_ha_witness_up") == 0, 30,
                 "/metrics to show the witness down")
        with amqtransport.connect(bp.uri) as c:
            deadline = time.monotonic() + 3 * 2 * link_timeout  # three leases long
            n = 0
            while time.monotonic() < deadline or n < 20:
                c.send("/queue/witness.gone", f"m{n}", idempotency_key=f"k{n}")
                n += 1
        st = master.status()
        assert st.get("amq-ha-role") == "master" and "amq-ha-suspect" not in st, st
        assert st.get("amq-ha-peer-state") == "in-sync", st
        assert bp.wait_master(5) is master


def _ask(client: WitnessClient, request: str, epoch: int, alone: bool = False) -> WitnessAnswer:
    return asyncio.run(client.ask(request, epoch, alone=alone, timeout=5.0))


def test_a_restarted_witness_does_not_grant_twice(tmp_path: Path) -> None:
    secret = b"a-pair-secret-for-the-witness-test"
    with WitnessProcess(tmp_path / "witness") as witness:
        host, port = witness.host, witness.port
        a = WitnessClient((host, port), secret, "a", lease=2.0)
        b = WitnessClient((host, port), secret, "b", lease=2.0)
        assert _ask(a, RENEW_HEADER, 1).granted
        assert (witness.data_dir / STATE_FILE).exists()
        witness.restart(hard=True)  # a crash right after the grant
        refused = _ask(b, TAKEOVER_HEADER, 2)
        assert not refused.granted and "holds the lease" in refused.reason, refused
        # once a's lease ran out (counted from the restart), b is granted ...
        wait_for(lambda: _ask(b, TAKEOVER_HEADER, 2).granted, 30, "the witness to grant b once a's lease ran out")
        witness.restart(hard=True)
        # ... and a restarted witness remembers it: a is fenced, a second node is not granted
        fenced = _ask(a, RENEW_HEADER, 1)
        assert not fenced.granted and fenced.fence, fenced
        assert not _ask(a, TAKEOVER_HEADER, 2).granted
        text = (witness.data_dir / STATE_FILE).read_text()
        assert pair_id(pair_key(secret)) in text and secret.decode() not in text
        # a wrong secret is refused (the key does not match the pair id it claims)
        forged = WitnessClient((host, port), b"another-secret-of-16+chars", "b", lease=2.0)
        forged.pair = a.pair
        forged_answer = _ask(forged, TAKEOVER_HEADER, 9)
        assert not forged_answer.granted and forged_answer.reached, forged_answer


def test_a_node_asks_past_a_grant_the_other_node_never_used(tmp_path: Path) -> None:
    """Issue 24: the witness granted b epoch 8 (b then stood by and never served); a,
    at epoch 7, asking "mastership at my epoch + 1" was refused for ever ("node b was
    granted epoch 8, not older than 8"). The client asks past the witness's record."""
    secret = b"a-pair-secret-for-the-deadlock-test"
    with WitnessProcess(tmp_path / "witness") as witness:
        a = WitnessClient((witness.host, witness.port), secret, "a", lease=0.5)
        b = WitnessClient((witness.host, witness.port), secret, "b", lease=0.5)
        assert _ask(a, RENEW_HEADER, 7).granted
        wait_for(lambda: _ask(b, TAKEOVER_HEADER, 8).granted, 30, "the witness to grant b epoch 8")
        fenced = _ask(a, RENEW_HEADER, 7)
        assert not fenced.granted and fenced.fence, fenced
        answers: list[WitnessAnswer] = []
        wait_for(lambda: answers.append(_ask(a, TAKEOVER_HEADER, 8)) or answers[-1].granted, 30,
                 "the witness to grant a mastership once b's unused lease ran out")
        assert answers[-1].epoch == 9, answers[-1]
        status = ha_request_sync(witness.host, witness.port, 5.0, {WITNESS_STATUS: a.pair}).headers
        assert dict(status)["amq-witness-epoch"] == "9" and dict(status)["amq-witness-holder"] == "a"
        assert _ask(b, RENEW_HEADER, 8).fence, "b, were it serving on its grant, is fenced"


def test_a_pair_whose_witness_granted_a_node_that_then_stood_by_gets_a_master_again(tmp_path: Path) -> None:
    """Issue 24, the nemesis deadlock as its end state, with real processes: the witness
    records that it granted the slave b the epoch after master a's, but b never served
    (it agreed to stand by for a: its copy is incomplete, here wiped). a holds every
    receipted message; it must serve again (before: both nodes waited for ever, a's
    takeover refused "node b was granted epoch E+1, not older than E+1")."""
    with WitnessProcess(tmp_path / "witness") as witness, BrokerPair(
        "replicated", tmp_path / "pair", link_timeout=LINK_TIMEOUT, witness=witness.address
    ) as bp:
        a, b = _in_sync(bp, witness)
        queue = "/queue/witness.unused-grant"
        with amqtransport.connect(bp.uri) as c:
            c.send(queue, "receipted", idempotency_key="k-receipted")
        epoch = int(a.status()["amq-ha-epoch"])
        b.kill()
        a.kill()
        witness.kill()
        path = witness.data_dir / STATE_FILE
        pairs = load_state(path.read_bytes(), 0.0)
        ((pid, rec),) = pairs.items()
        path.write_bytes(dump_state({pid: replace(rec, holder=b.name, epoch=epoch + 1, alone=False)}))
        witness.start()
        shutil.rmtree(b.data_dir)  # b stood by: its copy is not complete (never synced again)
        b.start()
        a.start()
        assert bp.wait_master(60) is a, a.log_text()[-3000:]
        assert int(a.status()["amq-ha-epoch"]) == epoch + 2
        wait_for(lambda: a.status().get("amq-ha-peer-state") == "in-sync", 60, "b to resync from a")
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe(queue, ack="auto")
            msg = sub.receive(timeout=10)
            assert msg is not None and msg.text == "receipted"


def test_the_witness_port_refuses_garbage(tmp_path: Path) -> None:
    with WitnessProcess(tmp_path / "witness") as witness:
        with socket.create_connection((witness.host, witness.port), timeout=5) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
            frames, _closed = read_frames(s, time.monotonic() + 5)
        assert frames and frames[0].startswith(b"ERROR") and b"witness port" in frames[0], frames
