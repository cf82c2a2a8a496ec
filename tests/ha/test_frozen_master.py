"""A frozen master (SIGSTOP ... SIGCONT) must not receipt a SEND the new master never had.

Real processes: a replicated pair with a small ``--link-timeout``. A raw STOMP socket
is connected to the master; the master is frozen; a SEND with a receipt request is
written into that socket (it sits in the kernel buffer of the frozen process); the
slave takes over (epoch 2); the old master is thawed. Its overdue timers then see
the replication link gone: before the fix it released the receipt it was holding
for the slave as a success and wrote a RECEIPT for a message only its own disk had,
and stepped down (wiping that disk) a moment later: a receipted message lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from ha_helpers import raw_connect, raw_send, read_frames, wait_for

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(150)


def _state(pid: int) -> str:
    """The process state letter of ``pid`` (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def freeze_round(bp: BrokerPair, queue: str, tag: str, sockets: int = 6) -> tuple[set[str], set[str], bytes]:
    """One freeze of the current master with a SEND in each of ``sockets`` socket buffers,
    and a client CONNECT written during the freeze.

    Returns (receipted, present, answer): the bodies the frozen-then-thawed master wrote
    a RECEIPT for, the bodies found on the node that is master afterwards, and what the
    thawed master answered the CONNECT.
    """
    old = bp.wait_master(30)
    new = bp.other(old)
    socks = [raw_connect(old.port) for _ in range(sockets)]
    bodies = [f"{tag}-{i}" for i in range(sockets)]
    try:
        os.kill(old.pid, signal.SIGSTOP)
        try:
            for sock, body in zip(socks, bodies, strict=True):
                raw_send(sock, queue, body, receipt=body, idempotency_key=f"key-{body}")
            # a client connecting now: the kernel queues it; the thawed node answers it later
            late = socket.create_connection(("127.0.0.1", old.port), timeout=5)
            socks.append(late)
            late.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:0,0\n\n\x00")
            assert bp.wait_master(30, exclude=old) is new
        finally:
            os.kill(old.pid, signal.SIGCONT)
        until = time.monotonic() + 5
        receipted = set()
        for sock, body in zip(socks, bodies, strict=False):
            frames, _closed = read_frames(sock, until)
            if any(f.startswith(b"RECEIPT") for f in frames):
                receipted.add(body)
        late_frames, _closed = read_frames(late, until)
    finally:
        for sock in socks:
            sock.close()
    # the thawed node steps down and resyncs from the new master
    wait_for(lambda: old.status().get("amq-ha-peer-state") == "in-sync", 30, "the old master to resync as slave")
    assert bp.wait_master(10) is new
    with amqtransport.connect(bp.uri) as c:
        sub = c.subscribe(queue, ack="auto")
        got = {m.text for m in iter(lambda: sub.receive(timeout=1.5), None)}
    return receipted, got, b"".join(late_frames[:1])


def test_thawed_master_never_receipts_what_the_new_master_lacks(tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path, link_timeout=0.5) as bp:
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/frozen", "warm-up")
        for n in range(2):  # a freezes, then b (the new master) freezes
            receipted, present, answer = freeze_round(bp, f"/queue/frozen{n}", f"round{n}")
            lost = receipted - present
            assert not lost, f"round {n}: the thawed master receipted SENDs the new master never had: {lost}"
            assert not receipted, f"round {n}: a master that lost its slave uncleanly receipted {receipted}"
            assert not answer.startswith(b"CONNECTED"), f"round {n}: the thawed master accepted a new client"
        log = bp.a.log_text()
        assert "demoting to slave" in log or "step down" in log, log[-3000:]


def _flood(port: int, stop: threading.Event) -> None:
    """Keep a broker's event loop busy with short turns: small batches of SENDs to a topic
    nobody subscribes to (a long turn would often run the stall timer before a freeze
    that lands in it ends: the test would then pass without the fix)."""
    chunk = b"SEND\ndestination:/topic/thaw.noise\n\nx\x00" * 100
    with contextlib.suppress(OSError):
        sock = raw_connect(port)
        with sock:
            sock.settimeout(1)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    sock.sendall(chunk)
                time.sleep(0.001)


def _freeze_mid_turn(pid: int, tries: int = 200) -> None:
    """SIGSTOP ``pid`` at a moment its main (event loop) thread runs Python code, not
    waiting in a system call such as epoll_wait (``/proc/PID/syscall`` reads ``-1``):
    only then does the thawed loop read its sockets before it runs its overdue timers.
    A freeze that lands in a system call is undone at once (a few ms) and tried again."""
    for _ in range(tries):
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: _state(pid) == "T", 5, "the master to stop")
        if Path(f"/proc/{pid}/syscall").read_text().split()[0] == "-1":
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    pytest.fail(f"the busy master was never caught outside a system call in {tries} freezes")


def test_thawed_master_checks_its_stall_before_answering_a_connect(tmp_path: Path) -> None:
    """The nemesis case (replicated round 147): a client's TCP connection was accepted
    before the freeze and its CONNECT sits in that socket's buffer. A master frozen in
    the middle of a loop turn (busy, not waiting in epoll) reads that CONNECT on SIGCONT
    before it runs its overdue timers, i.e. before the timer that notices the stall:
    before the fix it answered CONNECTED after the slave had taken over (two masters
    for a moment). It must answer ERROR or close instead."""
    with BrokerPair("replicated", tmp_path, link_timeout=0.5) as bp:
        old = bp.wait_master(30)
        new = bp.other(old)
        wait_for(lambda: old.status().get("amq-ha-peer-state") == "in-sync", 30, "the slave to sync")
        early = socket.create_connection(("127.0.0.1", old.port), timeout=5)
        stop = threading.Event()
        flood = threading.Thread(target=_flood, args=(old.port, stop), daemon=True)
        flood.start()
        try:
            time.sleep(0.5)  # the master accepts the connection (no CONNECT yet) and gets busy
            _freeze_mid_turn(old.pid)
            try:
                early.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:0,0\n\n\x00")
                assert bp.wait_master(30, exclude=old) is new
            finally:
                stop.set()
                os.kill(old.pid, signal.SIGCONT)
            frames, _closed = read_frames(early, time.monotonic() + 3)
        finally:
            stop.set()
            early.close()
            flood.join(10)
        assert not any(f.startswith(b"CONNECTED") for f in frames), (
            f"the thawed master accepted a client after the slave took over: {frames[:1]}")


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_frozen_master_many_rounds(tmp_path: Path) -> None:
    """The same freeze, ROUNDS times in a row on one pair (the nodes swap roles each
    round): no RECEIPT from a thawed master, no receipted message missing, no client
    session accepted by a thawed master. ``AMQ_FREEZE_ROUNDS`` sets the count (20)."""
    rounds = int(os.environ.get("AMQ_FREEZE_ROUNDS", "20"))
    with BrokerPair("replicated", tmp_path, link_timeout=0.5) as bp:
        t0 = time.monotonic()
        for n in range(rounds):
            receipted, present, answer = freeze_round(bp, f"/queue/soak{n}", f"soak{n}")
            assert not receipted - present and not receipted, (n, receipted, present)
            assert not answer.startswith(b"CONNECTED"), n
        print(f"\n{rounds} freeze rounds, 6 buffered SENDs + 1 CONNECT each: 0 receipted by a thawed master, "
              f"0 sessions accepted; {time.monotonic() - t0:.0f} s")


def test_a_thawed_master_whose_successor_died_holds_until_the_peer_answers(tmp_path: Path) -> None:
    """Master a is frozen until b has taken over, b is killed, a is thawed: b may have
    receipted alone, so a must not receipt at its old epoch because b's addresses now
    refuse (a no-witness soak lost receipted messages so: the refusal window was counted
    from the thaw, a cleared at once and its writes were dropped when b came back with
    the newer store). a holds until b answers, then steps down."""
    with BrokerPair("replicated", tmp_path, link_timeout=0.5) as bp:
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/succ", "warm-up")
        old = bp.wait_master(30)
        new = bp.other(old)
        sock = raw_connect(old.port)
        try:
            os.kill(old.pid, signal.SIGSTOP)
            try:
                assert bp.wait_master(30, exclude=old) is new
                new.kill()
            finally:
                os.kill(old.pid, signal.SIGCONT)
            raw_send(sock, "/queue/succ", "after-thaw", receipt="r1", idempotency_key="k-after-thaw")
            frames, _closed = read_frames(sock, time.monotonic() + 4)
            assert not any(f.startswith(b"RECEIPT") for f in frames), \
                f"the thawed master receipted alone while its successor was down: {frames}"
        finally:
            sock.close()
        bp.restart(new)
        assert bp.wait_master(30, exclude=old) is new
        wait_for(lambda: old.status().get("amq-ha-peer-state") == "in-sync", 30, "the old master to resync as slave")
