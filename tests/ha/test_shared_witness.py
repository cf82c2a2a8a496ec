"""A shared-store pair with a witness (``--ha shared-store --witness``; amqtransport/broker/ha/sealed.py).

Without a witness a frozen (SIGSTOP) master keeps its ``flock`` on the shared store, so
its standby can never take over while it is frozen (issue 24). With one, mastership is a
witness lease and the new master seals the store by renaming its directory before it
reads it: the thawed master then gets no receipt out for a write after the seal, and
nothing receipted is lost. The journal tests below put the seal on either side of the
commit's "directory still named" check with real files; the pair test uses real
processes and SIGSTOP.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from ha_helpers import raw_connect, raw_send, read_frames, wait_for

import amqtransport
from amqtransport.broker.ha.sealed import disarm, seal
from amqtransport.broker.ha.shared import store_dirs
from amqtransport.broker.ha.witness import lease_seconds
from amqtransport.broker.store import guard as guard_module
from amqtransport.broker.store.journal import Journal
from amqtransport.broker.store.records import Ack, encode
from amqtransport.processes.witness import WitnessProcess
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(240)

LINK_TIMEOUT = 1.0  # a lease lasts 1.5 s


def _append(j: Journal, name: str) -> BaseException | None:
    """Append one record and wait for its completion: None (receipted) or the error."""
    done = threading.Event()
    got: list[BaseException | None] = []

    def cb(err: BaseException | None) -> None:
        got.append(err)
        done.set()

    j.append([encode(Ack((name,)))], cb)
    assert done.wait(20), f"no completion for {name}"
    return got[0]


def _names(journal: Path) -> list[str]:
    j = Journal(journal)
    try:
        return [r.ids[0] for _seg, r in j.recover() if isinstance(r, Ack)]
    finally:
        j.close()


def _old_master(data: Path, *, segment_size: int = 32 << 20) -> Journal:
    store = seal(data, 1)
    j = Journal(store / "journal", segment_size=segment_size)
    list(j.recover())
    j.start()
    for i in range(5):
        assert _append(j, f"before-{i}") is None
    return j


def _seal_again(data: Path) -> Path:
    store = seal(data, 2)
    disarm(store / "journal")
    return store / "journal"


def test_a_seal_between_the_fsync_and_the_check_refuses_the_receipt(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The old master's write and fdatasync are done; the new master seals before its
    check: the check fails, no receipt; the new master still reads every receipted record."""
    j = _old_master(tmp_path)
    quick = guard_module.StorageGuard.quick
    sealed: list[Path] = []

    def seal_then_check(self: guard_module.StorageGuard, *args: object, **kwargs: object) -> str | None:
        if not sealed:
            sealed.append(_seal_again(tmp_path))
        return quick(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(guard_module.StorageGuard, "quick", seal_then_check)
    err = _append(j, "raced")
    assert err is not None and "journal" in str(err), f"receipted after the seal: {err!r}"
    monkeypatch.setattr(guard_module.StorageGuard, "quick", quick)
    # the journal is failed: nothing more is receipted
    with pytest.raises(Exception, match="journal"):
        _append(j, "after")
    j.close()
    names = _names(sealed[0])
    assert names[:5] == [f"before-{i}" for i in range(5)], names
    assert "after" not in names


def test_a_seal_after_the_check_leaves_the_receipted_record_in_the_sealed_store(tmp_path: Path) -> None:
    """The other side of the race: the check passed before the seal (the seal lands in
    the batch hook, after the check): the receipt goes out, and the record is in what
    the new master reads (the copy of the newest segment)."""
    j = _old_master(tmp_path)
    sealed: list[Path] = []

    def hook(_payloads: object) -> None:
        if not sealed:
            sealed.append(_seal_again(tmp_path))

    j.add_batch_hook(hook)  # type: ignore[arg-type]
    assert _append(j, "checked") is None
    j.remove_batch_hook(hook)  # type: ignore[arg-type]
    assert sealed
    # from now on the old journal's check fails: no receipt
    assert _append(j, "late") is not None
    j.close()
    names = _names(sealed[0])
    assert names == [*(f"before-{i}" for i in range(5)), "checked"], names


def test_the_old_master_cannot_touch_the_sealed_store(tmp_path: Path) -> None:
    """After the seal the old master's appends go to a file no name leads to, and the
    segment it rolls to cannot be created (its directory's name is gone)."""
    j = _old_master(tmp_path, segment_size=4096)
    journal = _seal_again(tmp_path)
    before = sorted(p.name for p in journal.iterdir())
    for i in range(40):  # ~40 records of ~100 bytes: past the 4 KiB segment, a roll
        if _append(j, f"stray-{i}" + "x" * 80) is not None:
            break
    j.close()
    assert sorted(p.name for p in journal.iterdir()) == before
    names = _names(journal)
    assert not [n for n in names if n.startswith("stray-")], names
    assert names == [f"before-{i}" for i in range(5)]


def test_the_first_master_with_a_witness_moves_a_store_made_without_one(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal")
    list(j.recover())
    j.start()
    assert _append(j, "legacy") is None
    j.close()
    store = seal(tmp_path, 3)
    assert store_dirs(tmp_path) == [(3, store)] and not (tmp_path / "journal").exists()
    assert _names(store / "journal") == ["legacy"]
    # a name once used never comes back: an old master's path must keep naming nothing
    for epoch in (2, 3):
        with pytest.raises(FileExistsError, match="at epoch 3 already"):
            seal(tmp_path, epoch)
    assert store_dirs(tmp_path) == [(3, store)]


def test_a_frozen_shared_store_master_is_replaced_on_the_witness_lease_and_fenced_when_it_thaws(
        tmp_path: Path) -> None:
    """SIGSTOP the master: the standby takes over once the lease ran out (the frozen one
    still holds its file locks) and receipts; SENDs written into the frozen master's
    sockets get no receipt when it thaws; it steps down; every receipted message is there."""
    with WitnessProcess(tmp_path / "witness") as witness, BrokerPair(
        "shared-store", tmp_path / "pair", link_timeout=LINK_TIMEOUT, witness=witness.address
    ) as bp:
        bp.start()
        old = bp.wait_master(30)
        queue = "/queue/shared.witness"
        receipted: list[str] = []
        with amqtransport.connect(bp.uri) as c:
            for i in range(10):
                c.send(queue, f"before-{i}", idempotency_key=f"k-before-{i}")
                receipted.append(f"before-{i}")
        socks = [raw_connect(old.port) for _ in range(3)]
        bodies = [f"in-flight-{i}" for i in range(len(socks))]
        try:
            os.kill(old.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                for sock, body in zip(socks, bodies, strict=True):
                    raw_send(sock, queue, body, receipt=body, idempotency_key=f"key-{body}")
                new = bp.wait_master(60, exclude=old)
                print(f"shared-store master frozen -> the standby serves: {time.monotonic() - frozen_at:.2f} s "
                      f"(--link-timeout {LINK_TIMEOUT:g} s, lease {lease_seconds(LINK_TIMEOUT):g} s)")
                with amqtransport.connect(bp.uri) as c:
                    for i in range(10):
                        c.send(queue, f"after-{i}", idempotency_key=f"k-after-{i}")
                        receipted.append(f"after-{i}")
            finally:
                os.kill(old.pid, signal.SIGCONT)
            until = time.monotonic() + 5
            got = {body for sock, body in zip(socks, bodies, strict=True)
                   if any(f.startswith(b"RECEIPT") for f in read_frames(sock, until)[0])}
        finally:
            for sock in socks:
                sock.close()
        assert not got, f"the thawed master receipted: {got}"
        wait_for(lambda: old.status().get("amq-ha-role") == "slave", 30, "the thawed master to step down")
        assert bp.wait_master(10) is new
        log = new.log_text()
        assert "the witness granted the store at epoch" in log, log[-3000:]
        assert [e for e, _p in store_dirs(bp.a.data_dir)] == [int(new.status()["amq-ha-epoch"])]
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe(queue, ack="auto")
            seen = [m.text for m in iter(lambda: sub.receive(timeout=3), None)]
        missing = [b for b in receipted if b not in seen]
        assert not missing, f"receipted and lost: {missing}"
