"""The role loop of a shared-store pair: the store's file lock elects the master.

Theory of operation
-------------------
Both nodes use one data directory. The node polls the exclusive lock ``ha.lock``
every ``--lock-interval`` (default 0.1 s); once it holds it, it raises the epoch in ``ha-state.json``, recovers the journal (every
receipted message is in it: receipts follow fsync) and binds the client port. A clean
stop (SIGTERM) closes the store and releases the lock, so the other node takes over
within one poll interval (``failover-on-shutdown``). ``--allow-failback`` on a node
makes it yield to the pair's *primary* (the node that first took the lock on this
store, recorded in the state file): a restarted primary that finds the lock taken
drops a request file; a live node with ``--allow-failback`` sees it, stops cleanly and
releases the lock, and does not take it back until the primary is master. A request
file naming no node (created, its content lost to a power cut before it reached the
disk) asks nothing: before, both nodes waited for each other forever.

Who else is there. The lock says only that *someone* is master, so each node also
announces itself in ``<data-dir>/ha-nodes/<name>.json`` (its name and its client, HA and
HTTP addresses, rewritten at each start) and the console of either node reads that
directory (:func:`known_nodes`) and asks each other node's HA port for its status:
the master sees its standby waiting on the lock, the standby sees the master. A node
that left the pair for good is shown as unreachable until its file is deleted; give
the nodes distinct ``--name`` s (one file per name). A *takeover* is counted
(``takeovers``, as in a replicated pair) when a node gets the lock that another node
held while it waited; taking a free lock at start, or getting it back by a failback
request of its own, is not one.

With ``--relay-port`` a standby relays clients to the master while it sees it
(:func:`sight_master`: the other announced node's HA port says master; :mod:`.relay`):
the role loop watches while it waits for the lock and stops watching before it takes it.

:class:`SharedStoreRole` reads and changes the node only through :class:`SharedHost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..store import StoreLockedError
from ..store.files import replace_file, write_all
from .config import HaOptions
from .decide import says_master
from .epoch import HaState
from .lock import FileLock, is_locked, wait_for_lock
from .master import MasterRole
from .relay import Sighting, upstream_of
from .wire import probe

if TYPE_CHECKING:
    from ..http import HttpServer

__all__ = ["KnownNode", "SharedHost", "SharedStoreRole", "announce", "known_nodes", "sight_master", "store_dirs"]

log = logging.getLogger(__name__)

NODES_DIR = "ha-nodes"  # in the shared data directory: one <name>.json per node
_STORE = re.compile(r"store-(\d{1,18})")  # a store sealed with a witness (sealed.py)


def store_dirs(data_dir: Path) -> list[tuple[int, Path]]:
    """Every ``store-<epoch>`` directory in ``data_dir`` (a store run with a witness:
    :mod:`.sealed`), oldest epoch first."""
    out: list[tuple[int, Path]] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(data_dir):
            m = _STORE.fullmatch(entry.name)
            if m and entry.is_dir(follow_symlinks=False):
                out.append((int(m.group(1)), Path(entry.path)))
    return sorted(out)


@dataclass(frozen=True)
class KnownNode:
    """A node of a shared-store pair as it announced itself (``ha-nodes/<name>.json``)."""

    name: str
    client: str  # host:port
    ha: str  # host:port of its HA port (status requests)
    http: str = ""  # host:port of its HTTP side port, if any


def announce(data_dir: Path, me: KnownNode) -> None:
    """Write (replace) this node's file in ``ha-nodes/``; a failure is logged, never fatal."""
    directory = data_dir / NODES_DIR
    path = directory / f"{me.name}.json"
    data = json.dumps({"name": me.name, "client": me.client, "ha": me.ha, "http": me.http}).encode("utf-8")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # no fsync: every start announces again, and a lost announcement only hides a node from the console
        replace_file(directory, path.name, lambda fd: write_all(fd, data), fsync=False, mode=0o666,
                     tmp_name=f".{me.name}.json.tmp")
    except OSError as exc:
        log.warning("node %s: cannot announce itself in %s (%s): the other node's console will not list it",
                    me.name, directory, exc)


def known_nodes(data_dir: Path, *, exclude: str = "") -> list[KnownNode]:
    """Every node announced in ``ha-nodes/`` (sorted by name), but ``exclude``; files
    that are not such a record are skipped."""
    out: list[KnownNode] = []
    with contextlib.suppress(OSError):
        for path in sorted((data_dir / NODES_DIR).glob("*.json")):
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                node = KnownNode(name=str(raw["name"]), client=str(raw["client"]), ha=str(raw["ha"]),
                                 http=str(raw.get("http") or ""))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if node.name != exclude:
                out.append(node)
    return out


async def sight_master(data_dir: Path, name: str, own: set[str], timeout: float) -> Sighting:
    """A standby's look for its master: (name, client address) of the first other node
    announced in ``ha-nodes/`` whose HA port answers, under its announced name, that it is
    master; else why not (a str: a node answered and none is master) or None (nobody answered)."""
    answered = ""
    for other in known_nodes(data_dir, exclude=name):
        if other.ha in own or other.client in own:
            continue
        host, _sep, port = other.ha.rpartition(":")
        if not port.isdigit():
            continue
        info = await probe(host.strip("[]"), int(port), timeout)
        if info is None or info.get("amq-ha-name") != other.name:
            continue
        if says_master(info):
            upstream = upstream_of(info.get("amq-ha-client") or other.client, host.strip("[]"))
            if upstream is not None:
                return other.name, upstream
        answered = answered or f"node {other.name} answers as {info.get('amq-ha-role')}, not master"
    return answered or None


class SharedHost(Protocol):
    """What the shared-store role loop reads and changes on the node (:class:`.node.HaNode`)."""

    name: str
    data_dir: Path
    opts: HaOptions
    role: str
    state: HaState
    host: str
    port: int
    ha_port: int
    takeovers: int

    @property
    def http(self) -> HttpServer | None: ...

    @property
    def stop_event(self) -> asyncio.Event: ...
    @property
    def stopping(self) -> bool: ...

    def set_role(self, role: str, detail: str = "") -> None:
        """Take ``role`` and say so."""

    async def sleep(self, seconds: float) -> None:
        """Sleep, or end the role loop if the node stops meanwhile."""

    @property
    def master(self) -> MasterRole: ...

    def watch_master(self) -> None:
        """Relay clients to the master while it is seen (--relay-port; else nothing)."""

    async def unwatch_master(self, why: str) -> None:
        """Relay no more; the relay port is closed when this returns."""


class SharedStoreRole:
    """One node's role loop in a shared-store pair (see the module docstring)."""

    def __init__(self, node: SharedHost) -> None:
        self.node = node
        self.lock_conflicts = 0  # ha.lock taken while the journal was locked

    async def run(self) -> None:
        """Poll for the lock, serve as master while holding it, until the node stops."""
        node = self.node
        lock = FileLock(node.data_dir / "ha.lock")
        request = node.data_dir / "ha-failback-request"
        journal_lock = node.data_dir / "journal" / "LOCK"
        announce(node.data_dir, KnownNode(
            name=node.name, client=f"{node.host}:{node.port}", ha=f"{node.host}:{node.ha_port}",
            http=node.http.address if node.http is not None else "",
        ))
        taking_over = False  # another node held the lock while we waited (kept across retries)
        try:
            while not node.stopping:
                node.state = HaState.load(node.data_dir)
                if node.role != "slave":
                    node.set_role("slave", f"waiting for the store lock {lock.path}")
                primary = node.state.peer.get("primary")
                held = lock.is_locked_by_other()
                taking_over = taking_over or held
                if primary == node.name and held:
                    taking_over = False  # a failback we ask for is not a takeover
                    request.write_text(node.name)
                    log.info("node %s: primary is back; asking the live node to fail back", node.name)

                def may_take() -> bool:
                    # a node that yielded waits until the requester has the lock; a request
                    # naming no node (created, but its write lost to a power cut) asks nothing
                    if not request.exists():
                        return True
                    with contextlib.suppress(OSError):
                        return request.read_text().strip() in ("", node.name)
                    return True

                node.watch_master()
                got = await wait_for_lock(lock, node.opts.lock_interval, stop=node.stop_event, may_take=may_take)
                await node.unwatch_master("this node took the store lock" if got else "the node stops")
                if not got:
                    return
                if store_dirs(node.data_dir):
                    # the store was run with a witness (sealed.py): its journal is in store-<epoch>/,
                    # and a node without one would serve an empty DATA/journal beside it
                    lock.release()
                    self.lock_conflicts += 1
                    if self.lock_conflicts == 1 or self.lock_conflicts % 100 == 0:
                        log.error("node %s: %s holds a store run with a witness (store-<epoch>/): start this node "
                                  "with the pair's --witness too; staying slave", node.name, node.data_dir)
                    await node.sleep(max(1.0, node.opts.lock_interval))
                    continue
                if is_locked(journal_lock):
                    # we hold ha.lock but another process still holds the journal: the lock
                    # file was deleted or replaced under a live master. Never raise the epoch
                    # or open the store: let go and stay slave (the master re-takes the lock).
                    lock.release()
                    self.lock_conflicts += 1
                    if self.lock_conflicts == 1 or self.lock_conflicts % 100 == 0:
                        log.warning(
                            "node %s: took %s but the journal is locked by another process: the lock file "
                            "was deleted or replaced while a master runs; staying slave (%d times)",
                            node.name, lock.path, self.lock_conflicts,
                        )
                    await node.sleep(node.opts.lock_interval)
                    continue
                with contextlib.suppress(OSError):
                    if request.exists() and request.read_text().strip() == node.name:
                        request.unlink()
                try:
                    node.state = HaState.load(node.data_dir)
                    node.state.epoch += 1
                    node.state.role = "master"
                    node.state.synced = True
                    node.state.peer.setdefault("primary", node.name)
                    node.state.save(node.data_dir)
                except OSError as exc:
                    # e.g. the shared disk is full (the master before us fenced for it): never
                    # die for that; let go of the lock and try again, as a replicated node does
                    lock.release()
                    log.error("node %s: cannot record the new epoch in %s: %s; retrying in %s s",
                              node.name, node.data_dir, exc, max(1.0, node.opts.lock_interval))
                    node.set_role("waiting", f"I/O error: {exc}")
                    await node.sleep(max(1.0, node.opts.lock_interval))
                    continue
                is_primary = node.state.peer.get("primary") == node.name
                if taking_over:
                    node.takeovers += 1
                    taking_over = False
                try:
                    await node.master.start(replicate=False)
                    outcome = await self._hold(request, is_primary, lock)
                except StoreLockedError as exc:
                    # the journal was taken between our check and the open: never die for it
                    log.error("node %s: %s; staying slave", node.name, exc)
                    outcome = "fenced"
                finally:
                    await node.master.stop()
                    lock.release()
                if outcome == "stop":
                    return
                if outcome == "fenced":
                    node.set_role("fenced", "left the master role")
                    await node.sleep(node.opts.lock_interval)
                    continue
                # give the returning primary the lock before we poll again
                deadline = time.monotonic() + max(10.0, 20 * node.opts.lock_interval)
                while request.exists() and time.monotonic() < deadline:
                    await node.sleep(node.opts.lock_interval)
        finally:
            lock.release()

    async def _hold(self, request: Path, is_primary: bool, lock: FileLock) -> str:
        """Serve until stop ("stop"), a failback request we honour ("yield"), or a lock
        file we lost and cannot take back ("fenced")."""
        node = self.node
        lost_at = 0.0
        grace = max(2.0, 10 * node.opts.lock_interval)
        while True:
            await node.sleep(node.opts.lock_interval)
            if node.opts.allow_failback and not is_primary and request.exists():
                log.info("node %s: failback requested by the primary; handing the store over", node.name)
                return "yield"
            if lock.still_ours():
                continue
            # ha.lock was deleted or replaced: we hold a lock on a file nobody can see
            if lock.relock():
                log.warning("node %s: %s was deleted or replaced while we were master; locked the file "
                            "that has the name now", node.name, lock.path)
                lost_at = 0.0
                continue
            now = time.monotonic()
            if not lost_at:
                lost_at = now
                log.error("node %s: %s was replaced by a file another process holds; trying to take it back "
                          "for %.1f s before fencing", node.name, lock.path, grace)
            elif now - lost_at >= grace:
                log.error("node %s: cannot take %s back: fencing (closing the client port and the store) so "
                          "that whoever holds it can be master alone", node.name, lock.path)
                return "fenced"
