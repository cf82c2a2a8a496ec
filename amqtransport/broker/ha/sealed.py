"""A shared store with a witness: mastership is a witness lease, the store is sealed by a rename.

Theory of operation
-------------------
Without a witness the kernel's ``flock`` on ``ha.lock`` elects the master of a shared
store (:mod:`.shared`), and a frozen master keeps it: its standby can never take over
while it is frozen. With ``--witness`` the store's mastership is the witness's lease
(:mod:`.lease`, the same rules as a replicated pair's) and the file system fences the
master that lost it (docs/ha.md, "A shared store with a witness"):

* The store lives in ``DATA/store-<epoch>/`` (:func:`store_dirs`), one at a time, named by
  the epoch of the master that opened it last; the journal is its ``journal/``.
* A standby asks the witness for mastership (:data:`.witness.TAKEOVER_HEADER`), granted
  once the master's lease ran out. Granted epoch ``E``, it *seals* the store
  (:func:`seal`): renames ``store-<old>`` to ``store-<E>`` and fsyncs ``DATA`` before it
  reads anything. From then on every path the old master uses names nothing, so it can
  create, truncate, replace or delete no file of the store. It then waits
  :func:`settle_delay` (a path operation already inside the kernel at the rename ends
  meanwhile) and disarms what the old master still holds open (:func:`disarm`):
  ``journal/LOCK`` and ``*.tmp`` are unlinked, and the newest segment -- the only file it
  may still append to, through its descriptor -- is copied, fsynced and renamed over its
  own name, so later appends go to a file no name leads to.
* Receipts: each follows write + fdatasync + the check that the journal directory's
  path still leads to the directory the journal opened (:class:`..store.guard.StorageGuard`).
  A check that passed ran before the rename, so the write before it is in what the new
  master reads (the copy of the newest segment, or an older segment); a check after the
  rename fails the journal: no receipt, and the master leaves the role
  (:meth:`.master.MasterRole._fenced`). No clock is involved.
* The master renews its lease every third of ``--link-timeout`` (on a thread of its
  own: a busy loop must not lose it), saying it does not receipt alone (the standby reads the same journal: it lacks nothing), and leaves the
  role when its own count of the lease ends unrenewed (before the witness's: a live
  master stops writing before anyone is granted), when the witness says another node
  holds a newer epoch, or when its store directory lost its name.

:class:`LeasedStoreRole` reads and changes the node only through :class:`LeasedHost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from ...tasks import cancel_and_wait
from ..config import BrokerConfig
from ..store import StoreLockedError
from ..store.chain import SegmentsLost
from ..store.files import fsync_dir
from ..store.segments import JournalError
from ..store.segments import segment_id as _segment_id
from .epoch import HaState
from .shared import KnownNode, SharedHost, announce, store_dirs
from .witness import LEASE_MARGIN, RENEW_HEADER, TAKEOVER_HEADER, WitnessAnswer, WitnessClient

__all__ = ["LeasedHost", "LeasedStoreRole", "current_store", "disarm", "seal", "settle_delay"]

log = logging.getLogger(__name__)

LEGACY = "journal"  # a store made without a witness: DATA/journal
_COPY_CHUNK = 1 << 20


def current_store(data_dir: Path) -> Path | None:
    """The store directory of the newest epoch (None: none yet)."""
    dirs = store_dirs(data_dir)
    return dirs[-1][1] if dirs else None


def seal(data_dir: Path, epoch: int, *, fsync: bool = True) -> Path:
    """Make ``DATA/store-<epoch>`` the store: rename the current one to it (or create it,
    moving a store made without a witness, ``DATA/journal``, in), fsync ``DATA``; return
    it. OSError when the rename fails (another node sealed it first: its name is gone)."""
    target = data_dir / f"store-{epoch}"
    dirs = store_dirs(data_dir)
    current = dirs[-1][1] if dirs else None
    if dirs and dirs[-1][0] >= epoch:  # a name used once is never used again (the old master's path)
        raise FileExistsError(f"the store is at epoch {dirs[-1][0]} already ({current}), not older than {epoch}")
    if current is None:
        target.mkdir(mode=0o700)
    elif current != target:
        os.rename(current, target)
    legacy = data_dir / LEGACY
    if legacy.is_dir() and not (target / "journal").exists():
        os.rename(legacy, target / "journal")  # once: the first master with a witness
        log.warning("moved the store made without a witness, %s, into %s", legacy, target)
    if fsync:
        fsync_dir(data_dir)
        fsync_dir(target)
    return target


def disarm(journal: Path, *, fsync: bool = True) -> None:
    """What the old master still holds open in ``journal`` cannot reach the new master's
    files: unlink ``LOCK`` and ``*.tmp``; copy the newest segment and rename the copy over
    it (the old master's appends then go to a file with no name)."""
    if not journal.is_dir():
        return
    for name in ("LOCK", *(p.name for p in journal.glob("*.tmp"))):
        with contextlib.suppress(FileNotFoundError):
            (journal / name).unlink()
    segments = sorted((i, p) for p in journal.glob("seg-*.log") if (i := _segment_id(p)) is not None)
    if not segments:
        return
    newest = segments[-1][1]
    copy = journal / (newest.name + ".sealed")
    src = os.open(newest, os.O_RDONLY)
    try:
        dst = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            at = 0
            while chunk := os.read(src, _COPY_CHUNK):
                if chunk.count(0) != len(chunk):  # a preallocated segment's unwritten zeros: a hole
                    view = memoryview(chunk)
                    while view:
                        view = view[os.pwrite(dst, view, at + len(chunk) - len(view)):]
                at += len(chunk)
            os.ftruncate(dst, at)
            if fsync:
                os.fdatasync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    os.replace(copy, newest)
    if fsync:
        fsync_dir(journal)


def settle_delay(lock_interval: float) -> float:
    """How long a new master waits between the rename and reading the store."""
    return max(0.1, lock_interval)


class LeasedHost(SharedHost, Protocol):
    """What the leased role loop reads and changes on the node (:class:`.node.HaNode`)."""

    config: BrokerConfig
    witness: WitnessClient | None
    lease_until: float
    loop: asyncio.AbstractEventLoop | None
    demote_event: asyncio.Event | None  # set by the term (MasterRole) when its journal failed

    async def ask_witness(self, request: str, epoch: int, *, alone: bool = False) -> WitnessAnswer:
        """One request to the witness."""
        ...

    async def renew_lease(self, *, alone: bool) -> WitnessAnswer:
        """Renew the master's lease (updates :attr:`lease_until` when granted)."""
        ...


class LeasedStoreRole:
    """One node's role loop in a shared-store pair with a witness (the module docstring)."""

    def __init__(self, node: LeasedHost) -> None:
        self.node = node
        self.left = ""  # why the current term must end ("" it goes on)

    async def run(self) -> None:
        node = self.node
        assert node.witness is not None and node.loop is not None
        announce(node.data_dir, KnownNode(
            name=node.name, client=f"{node.host}:{node.port}", ha=f"{node.host}:{node.ha_port}",
            http=node.http.address if node.http is not None else "",
        ))
        logged = ""
        while not node.stopping:
            node.state = HaState.load(node.data_dir)
            if node.role != "slave":
                node.set_role("slave", f"waiting for the witness {node.witness.where} to grant the store")
            node.watch_master()  # --relay-port: relay to the master while it is seen (relay.py)
            asked = node.loop.time()
            dirs = store_dirs(node.data_dir)
            own = max(node.state.epoch, dirs[-1][0] if dirs else 0)  # the state file may lag a seal (a crash)
            answer = await node.ask_witness(TAKEOVER_HEADER, own + 1)
            if not answer.granted:
                if answer.reason != logged:
                    log.info("node %s: not master: %s", node.name, answer.reason)
                    logged = answer.reason
                left = answer.remaining
                lease = node.witness.lease
                wait = left + 0.05 if left is not None and 0 < left <= lease else max(node.opts.lock_interval, lease / 4)
                await node.sleep(wait)
                continue
            logged = ""
            node.lease_until = asked + node.witness.lease * (1 - LEASE_MARGIN)
            await node.unwatch_master(f"the witness granted this node the store at epoch {answer.epoch}")
            outcome = await self._term(answer.epoch)
            node.lease_until = 0.0
            if outcome == "stop":
                return
            node.set_role("fenced", f"left the master role: {self.left}")
            await node.sleep(node.opts.lock_interval)

    async def _term(self, epoch: int) -> str:
        """A term granted at ``epoch``: renew the lease from the grant on (opening a large
        store takes a while), seal the store, serve until the lease or the store is lost."""
        self.left = ""
        self.node.state.epoch = max(self.node.state.epoch, epoch)  # what the renewals say from now on
        keeper = asyncio.get_running_loop().create_task(self._keep_lease())
        try:
            return await self._serve(epoch)
        finally:
            await cancel_and_wait(keeper)

    async def _serve(self, epoch: int) -> str:
        node = self.node
        fsync = node.config.fsync
        try:
            store = await asyncio.to_thread(seal, node.data_dir, epoch, fsync=fsync)
            await node.sleep(settle_delay(node.opts.lock_interval))
            await asyncio.to_thread(disarm, store / "journal", fsync=fsync)
            previous = node.state.peer.get("master", "")
            node.state = HaState.load(node.data_dir)
            node.state.epoch = max(node.state.epoch, epoch)
            node.state.role = "master"
            node.state.synced = True
            node.state.peer["master"] = node.name
            node.state.save(node.data_dir)
        except OSError as exc:
            self.left = f"cannot seal the store at epoch {epoch}: {exc}"
            log.error("node %s: %s", node.name, self.left)
            await node.sleep(max(1.0, node.opts.lock_interval))
            return "retry"
        if not store.is_dir() or node.loop is None or node.loop.time() >= node.lease_until:
            # frozen since the grant: our lease ran out, so another node may have sealed the
            # store; opening it would create an empty one under our old name
            self.left = f"the lease ran out before the store {store} was opened"
            log.error("node %s: %s", node.name, self.left)
            return "retry"
        if previous and previous != node.name:
            node.takeovers += 1
        log.warning("node %s: the witness granted the store at epoch %d: sealed %s", node.name, epoch, store)
        try:
            await node.master.start(replicate=False, data_dir=store)
            return await self._hold(store)
        except (StoreLockedError, SegmentsLost, JournalError, OSError) as exc:
            self.left = f"cannot open the store {store}: {exc}"
            log.error("node %s: %s", node.name, self.left)
            return "fenced"
        finally:
            await node.master.stop()

    async def _keep_lease(self) -> None:
        """Renew the lease every third of ``--link-timeout`` (never "alone": the standby
        reads this very journal) on a thread of its own, until cancelled: a loop busy for
        longer than the lease (a new master swamped by every client failing over to it,
        found by the nemesis) must not lose it -- the standby would take over, and then
        lose it the same way. A frozen process renews nothing (the thread is frozen too);
        a witness that fences us ends the term."""
        node = self.node
        stop = threading.Event()
        threading.Thread(target=self._renewals, args=(stop, node.state.epoch), daemon=True,
                         name=f"witness-lease:{node.name}").start()
        try:
            await asyncio.Event().wait()
        finally:
            stop.set()

    def _renewals(self, stop: threading.Event, epoch: int) -> None:
        """The renewal thread (:meth:`_keep_lease`): ``lease_until`` counts, as the loop's
        clock does, ``time.monotonic()`` from the moment a granted renewal was sent."""
        node, witness = self.node, self.node.witness
        assert witness is not None
        every = max(0.05, node.opts.link_timeout / 3)
        timeout = max(0.5, min(1.0, node.opts.link_timeout))
        loop = asyncio.new_event_loop()
        try:
            while not stop.is_set():
                asked = time.monotonic()
                answer = loop.run_until_complete(witness.ask(RENEW_HEADER, epoch, alone=False, timeout=timeout))
                if stop.is_set():
                    return
                if answer.granted:
                    node.lease_until = max(node.lease_until, asked + witness.lease * (1 - LEASE_MARGIN))
                elif answer.fence:
                    self.left = f"the witness fenced us: {answer.reason}"
                    return
                else:
                    log.warning("node %s: witness lease not renewed: %s", node.name, answer.reason)
                stop.wait(every)
        finally:
            loop.close()

    async def _hold(self, store: Path) -> str:
        """Serve until stop ("stop") or the term ends ("fenced": :attr:`left` says why)."""
        node = self.node
        loop = asyncio.get_running_loop()
        identity = os.stat(store)
        demote = node.demote_event
        while True:
            if node.stopping:
                return "stop"
            if demote is not None and demote.is_set() and not self.left:
                self.left = "the journal failed"
            if not self.left and loop.time() >= node.lease_until:
                self.left = "the witness lease ran out unrenewed"
            if not self.left:
                try:
                    st = os.stat(store)
                    if (st.st_dev, st.st_ino) != (identity.st_dev, identity.st_ino):
                        self.left = f"{store} names another directory: another node sealed the store"
                except FileNotFoundError:
                    self.left = f"{store} is gone: another node sealed the store"
            if self.left:
                log.error("node %s: leaving the master role: %s", node.name, self.left)
                return "fenced"
            await node.sleep(node.opts.lock_interval)
