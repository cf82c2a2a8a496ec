"""Shared store: the lock file ``ha.lock`` deleted or replaced while the pair runs.

Before: the slave created and locked a new ``ha.lock``, raised the shared epoch and
died with ``StoreLockedError`` on the journal's own lock (and every restart of it died
the same way). Now the slave sees the journal still locked, lets go and stays slave;
the master notices within a poll that the name no longer leads to the file it locked
and locks the new file -- or, when another process holds that file, fences itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ha_helpers import never_master, refuses, wait_for

import amqtransport
from amqtransport.broker.ha.lock import FileLock, is_locked
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(120)


def _epoch(bp: BrokerPair) -> int:
    return int(json.loads((bp.a.data_dir / "ha-state.json").read_text())["epoch"])


def _delete(lock: Path) -> None:
    lock.unlink()


def _replace(lock: Path) -> None:
    new = lock.with_name("ha.lock.new")
    new.write_text("someone else's file\n")
    os.replace(new, lock)


@pytest.mark.parametrize("damage", [_delete, _replace], ids=["deleted", "replaced"])
def test_lock_file_lost_under_a_live_master(tmp_path: Path, damage: object) -> None:
    with BrokerPair("shared-store", tmp_path, lock_interval=0.05) as bp:
        with amqtransport.connect(bp.uri) as c:
            for i in range(10):
                c.send("/queue/lock", f"m{i}")
        lock = bp.a.data_dir / "ha.lock"
        assert _epoch(bp) == 1
        for _ in range(3):  # again and again: nothing accumulates
            damage(lock)  # type: ignore[operator]
            wait_for(lambda: lock.exists() and is_locked(lock) and "locked the file that has the name now"
                     in bp.a.log_text(), 10, "the master to lock the new file")
            never_master(bp.b, 1.0)
            assert bp.b.alive, "the slave died:\n" + bp.b.log_text()[-3000:]
            assert bp.b.status()["amq-ha-role"] == "slave"
            assert bp.a.status()["amq-ha-role"] == "master"
            assert _epoch(bp) == 1, "the slave raised the shared epoch"
            assert "StoreLockedError" not in bp.b.log_text()
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/lock", "m10")
        # and the lock really is the master's: killing it hands over
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        assert _epoch(bp) == 2
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe("/queue/lock")
            assert {m.text for m in iter(lambda: sub.receive(timeout=2), None)} == {f"m{i}" for i in range(11)}


def test_master_that_cannot_take_its_lock_back_fences_itself(tmp_path: Path) -> None:
    """The name now leads to a file a third process holds: the master cannot lock it,
    fences itself after its grace period (about 2 s), and nobody is master until that
    process lets go; then one node takes over with every message."""
    with BrokerPair("shared-store", tmp_path, lock_interval=0.05) as bp:
        with amqtransport.connect(bp.uri) as c:
            for i in range(5):
                c.send("/queue/fence", f"m{i}")
        lock = bp.a.data_dir / "ha.lock"
        # a third process locks a file of its own and renames it over ha.lock
        holder_code = (
            "import os, sys; from amqtransport.broker.ha.lock import FileLock;"
            f"l = FileLock({str(lock) + '.held'!r}); assert l.try_acquire(); "
            f"os.replace({str(lock) + '.held'!r}, {str(lock)!r}); print('held', flush=True); sys.stdin.read()"
        )
        holder = subprocess.Popen([sys.executable, "-c", holder_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
            wait_for(lambda: refuses(bp.a.port), 15, "the master to fence itself")
            assert "fencing" in bp.a.log_text()
            never_master(bp.a, 1.0)
            never_master(bp.b, 0.5)
            assert bp.a.alive and bp.b.alive
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(10)
        node = bp.wait_master(20)
        assert FileLock(lock).is_locked_by_other()
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe("/queue/fence")
            assert {m.text for m in iter(lambda: sub.receive(timeout=2), None)} == {f"m{i}" for i in range(5)}
        print(f"\nafter the third process let go, node {node.name} became master")
        time.sleep(0.2)
        assert bp.other(node).status()["amq-ha-role"] == "slave"


def test_file_lock_follows_its_name(tmp_path: Path) -> None:
    path = tmp_path / "ha.lock"
    a, b = FileLock(path), FileLock(path)
    assert a.try_acquire() and a.still_ours()
    path.unlink()
    assert not a.still_ours()
    assert b.try_acquire(), "a new file under the name can be locked by another"
    assert not a.relock(), "while b holds it, a cannot take it"
    b.release()
    assert a.relock() and a.still_ours()
    assert not b.try_acquire()
    assert is_locked(path) and not is_locked(tmp_path / "missing")
    assert not (tmp_path / "missing").exists(), "probing does not create the file"
    a.release()
    assert not is_locked(path)


@pytest.mark.parametrize("content", ["", "\n"], ids=["empty", "blank"])
def test_a_failback_request_naming_nobody_does_not_block_the_pair(tmp_path: Path, content: str) -> None:
    """A power loss leaves ``ha-failback-request`` created but empty (its write never
    reached the disk: found by the nemesis's power-loss fault, LazyFS). Before: both
    nodes read a request naming neither of them and waited for each other forever
    ("slave waiting for the store lock" on a free lock). Now a request naming no node
    asks nothing."""
    bp = BrokerPair("shared-store", tmp_path, lock_interval=0.05)
    store = bp.a.data_dir
    store.mkdir(parents=True, exist_ok=True)
    (store / "ha-failback-request").write_text(content)
    try:
        bp.start(timeout=20)
        assert bp.a.status()["amq-ha-role"] == "master"
    finally:
        bp.stop()
