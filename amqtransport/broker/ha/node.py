"""One node of an HA pair: the role state machine (master / slave / cold backup).

Theory of operation
-------------------
A node is a process with two listening sockets. The *HA port* (``--ha-port``) is bound
from the start in every role: it answers status requests (a STOMP ``CONNECT`` carrying
``amq-ha-status``; the ``CONNECTED`` frame carries ``amq-ha-*`` headers: role, epoch,
peer, message counts) and accepts replication links when the node is master. The
*client port* (``--port``) is bound only while the node is master, so clients see
"connection refused" everywhere except on the master and their ``failover:`` URI
finds it. Both ports accept the same HA requests (a master's client port also answers
``amq-ha-status`` and replication ``CONNECT`` frames, as ActiveMQ's master connector
points at the master's transport connector). Every request that changes a role or a
store -- replication link, demote, stand-by -- is signed with the pair's cluster
secret and checked (:mod:`.auth`); the HA port is bounded (:mod:`.port`).

Shared store (``--ha shared-store``). Both nodes use one data directory. The node
polls the exclusive lock ``ha.lock`` every ``--lock-interval`` (default 0.1 s); once
it holds it, it raises the epoch in ``ha-state.json``, recovers the journal (every
receipted message is in it: receipts follow fsync) and binds the client port. A clean
stop (SIGTERM) closes the store and releases the lock, so the other node takes over
within one poll interval (``failover-on-shutdown``). ``--allow-failback`` on a node
makes it yield to the pair's *primary* (the node that first took the lock on this
store, recorded in the state file): a restarted primary that finds the lock taken
drops a request file; a live node with ``--allow-failback`` sees it, stops cleanly and
releases the lock, and does not take it back until the primary is master.

Replicated, shared nothing (``--ha replicated``). A node with ``--master-connector``
is configured as slave; one without is configured as master. What the node is --
master, slave of whom, waiting -- and what it does when it loses its master, its
slave, or meets a second master is decided by :func:`.decide.decide`, a pure function
whose docstring holds the whole table (with the partition cases it answers); this
module observes what the table asks for (:meth:`HaNode._decide`: probes, stand-by
requests, the takeover check) and acts. In short:

1. At start and after every lost link the node probes every address it knows for its
   peer (the master connector, and the peer's client/HA addresses learnt in an earlier
   handshake and kept in ``ha-state.json``). A live master anywhere wins: this node
   becomes its slave and resynchronises from scratch, whatever its own epoch (never
   two masters; an old master coming back therefore rejoins as slave automatically).
2. If the peer answers but is not master either (both starting), the better claim
   wins: the higher epoch of a synced store, then the node that was master at that
   epoch, then the configured master, then the lower name.
3. If the peer is unreachable: an unsynced store never becomes master; a node that was
   a slave last waits for its master (the master may have receipted messages this copy
   lacks) -- unless that master runs with ``--shutdown-on-slave-failure`` (learnt in
   the handshake, ``master_strict``): it never receipts without this copy, so the
   node takes over; a node whose state says a slave had synced from it (``peer_may_be_master``)
   waits -- that slave may have taken over and hold newer data; otherwise the
   configured master (or a node that was master last) becomes master; a configured
   slave waits for its master. With ``--takeover-check`` a node becomes master only
   while that address answers.

A master raises the epoch before binding, installs the
:class:`~.replication.ReplicationMaster` (store listener + journal gate: a receipt
waits for the slave's fsync while a slave is attached), and binds the client port --
at once, or with ``--wait-for-slave`` only when a slave has synced. When a synced slave
is lost without a goodbye, or the master's event loop stalled for longer than
``--link-timeout`` (it was frozen: the slave may have taken over meanwhile), the
receipts that waited for the slave are never sent (their client connections are cut;
the clients replay to whichever node is master and idempotency keys drop the copies)
and the master receipts nothing more until its peer has answered a *stand-by* request
(phase ``master`` of the table): a peer that is master at a newer epoch makes it step
down; a peer that agrees to stand by marks its store as no longer a complete copy (it
will resync before it could take over) and the master goes on alone; no answer keeps
the receipts held. With ``--shutdown-on-slave-failure`` the master stops instead
(receipts for unreplicated records are refused; from that moment its status no longer
says master, so the slave takes over); with ``--takeover-check`` a master that cannot
reach that address when it loses its synced slave fences itself. A slave that
re-links over a connection the master still thinks open (half-open TCP) replaces it:
that is not a lost slave, and what waited for the old link waits for the new one's
full sync. With no slave attached it probes its known peer every second and demotes
itself if the peer is a master with a higher epoch (the end of a split brain); if the
peer is a master with a *lower* epoch (it came back knowing nothing of us, e.g. with a
wiped store), it sends it a demote request (``amq-ha-demote``) and the stale master --
once the requester's own HA port confirms that it is master at that newer epoch --
steps down, learns our address and joins us as slave (:mod:`.port` answers requests).

A slave connects (:meth:`HaNode._serve_slave`), wipes its store, and runs the
replication link's slave side (:class:`~.slave.SlaveLink`: import the snapshot, ack,
then apply and ack every record). It starts no client connector. Its store counts as
a complete copy (``synced`` in ``ha-state.json``) from the end of the full sync until
it leaves with a goodbye or agrees to stand by; the takeover decision reads that flag
after its last await and raises the epoch with nothing awaited in between. When the
link breaks after it was in sync, ``--shutdown-on-master-failure`` makes it stop (a
cold backup holding a complete copy); otherwise it takes over only if the master is
unreachable on *every* address it knows (master connector, master client port, master
HA port) *and* the ``--takeover-check`` address (host:port, both nodes must be able to
reach it: the clients' gateway, a load balancer, a third host) answers a TCP connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from amqtransport.errors import ConfigError

from ..config import BrokerConfig
from ..server import BrokerServer
from ..store import MessageStore, StoreLockedError
from .auth import AUTH_HEADER, RequestSigner, RequestVerifier, load_secret
from .config import HaOptions, parse_address
from .decide import (
    ASK,
    BECOME_MASTER,
    CHECK,
    CLEAR,
    COLD_BACKUP,
    DEMOTE_PEER,
    FENCE,
    FORGET,
    ISOLATED,
    JOIN,
    LINK_LOST,
    MASTER,
    RELINK,
    RETRY,
    SLAVE_LOST,
    START,
    STEP_DOWN,
    STOP,
    DecideOptions,
    Decision,
    NodeState,
    PeerAnswer,
    Peers,
    decide,
)
from .epoch import HaState
from .lock import FileLock, is_locked, wait_for_lock
from .port import HaPortProtocol, HaRequests
from .replication import MasterLink, ReplicationMaster
from .slave import SlaveLink, fresh_replica_store
from .wire import (
    DEMOTE_HEADER,
    REPLICA_HEADER,
    STANDBY_HEADER,
    ReplicaRefused,
    ReplicationError,
    ask_peer,
    ha_request,
    reachable,
)

if TYPE_CHECKING:
    from ..http import HttpServer

__all__ = ["HaNode", "run_node"]

log = logging.getLogger(__name__)

def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _Stop(Exception):
    """The node is stopping (signal)."""


class HaNode:
    def __init__(
        self,
        config: BrokerConfig,
        users: Mapping[str, str] | None,
        options: HaOptions,
        *,
        say: Callable[[str], None] = _say,
    ) -> None:
        options.validate()
        if config.data_dir is None:
            raise ConfigError("an HA node needs --data-dir", path="data_dir")
        if config.port == 0:
            raise ConfigError("an HA node needs a fixed --port (clients list both nodes' ports)", path="port")
        self.config = config
        self.users = dict(users or {})
        self.opts = options
        self.say = say
        self.name = config.name
        self.data_dir = Path(config.data_dir)
        self.host = config.host
        self.port = config.port
        self.ha_port = options.ha_port
        self.role = "starting"
        self.state = HaState()
        self.server: BrokerServer | None = None
        self.repl: ReplicationMaster | None = None
        self.slave_store: MessageStore | None = None
        self.slave_link: SlaveLink | None = None  # slave: the current (or last) replication link
        self.master_address = ""
        self.listening = False
        self.exit_code = 0
        self._stop = asyncio.Event()
        self._demote: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._held_since = 0.0
        self._held_logged = 0.0
        self._lock_conflicts = 0  # shared store: ha.lock taken while the journal was locked
        self._ha_server: asyncio.Server | None = None
        self._waiting_reason = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.takeovers = 0
        self.became_master_at = 0.0
        self.http: HttpServer | None = None  # the HTTP side port (--http), in every role
        self._ha_waiting: set[HaPortProtocol] = set()
        self.signer: RequestSigner | None = None
        self.verifier: RequestVerifier | None = None
        if options.mode == "replicated":
            secret = load_secret(options.cluster_password, options.cluster_password_file)
            self.signer, self.verifier = RequestSigner(secret), RequestVerifier(secret)
        self.rules = DecideOptions.of(self.name, options)  # what decide.py reads of the options
        self.requests = HaRequests(self)  # the answer to every HA request (port.py)

    # ------------------------------------------------------------------ entry
    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self.loop.add_signal_handler(sig, self.stop)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._ha_server = await self.loop.create_server(
            lambda: HaPortProtocol(self.requests, self.opts.port_limits, self._ha_waiting), self.host, self.ha_port,
            reuse_address=True,
        )
        self.ha_port = self._ha_server.sockets[0].getsockname()[1]
        if self.config.http:  # the HTTP side port (metrics, probes, console): in every role
            from ..http import start_side_port
            from .view import HaNodeView

            try:
                self.http = await start_side_port(HaNodeView(self), self.config.http, self.users)
            except OSError as exc:
                self._ha_server.close()
                sys.stderr.write(f"error: cannot listen on http {self.config.http}: {exc.strerror or exc}\n")
                return 1
        self.say(f"ha node {self.name} mode {self.opts.mode} ha-port tcp://{self.host}:{self.ha_port} pid {os.getpid()}")
        if self.http is not None:
            self.say(f"http console {self.http.url}/")
        argv = list(sys.argv[1:])
        for i, arg in enumerate(argv[:-1]):
            if arg in ("--master-password", "--cluster-password"):
                argv[i + 1] = "***"
        log.info("node %s: started as: amq %s", self.name, " ".join(argv))
        try:
            if self.opts.mode == "shared-store":
                await self._run_shared_store()
            else:
                await self._run_replicated()
        except _Stop:
            pass
        finally:
            await self._teardown()
        return self.exit_code

    def stop(self) -> None:
        self._stop.set()
        if self._wake is not None:
            self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def save_state(self) -> None:
        self.state.save(self.data_dir)

    def demote(self) -> None:
        """Leave the master role: the role loop stops the master and decides again."""
        if self._demote is not None:
            self._demote.set()

    @property
    def slave_synced(self) -> bool:
        """Slave: the full sync of the current (or last) link is durable here."""
        return self.slave_link is not None and self.slave_link.synced

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        if self._stop.is_set():
            raise _Stop()

    def _set_role(self, role: str, detail: str = "") -> None:
        self.role = role
        self.say(f"role {role}" + (f" {detail}" if detail else ""))
        log.info("node %s: role %s %s", self.name, role, detail)

    def _wait(self, reason: str) -> None:
        if reason != self._waiting_reason:
            self._waiting_reason = reason
            self._set_role("waiting", reason)

    async def _teardown(self) -> None:
        await self._stop_master()
        self._close_slave_store()
        if self._ha_server is not None:
            self._ha_server.close()
            self._ha_server = None
        if self.http is not None:
            await self.http.stop()
            self.http = None
        log.info("node %s stopped", self.name)

    # ------------------------------------------------------------------ shared store
    async def _run_shared_store(self) -> None:
        lock = FileLock(self.data_dir / "ha.lock")
        request = self.data_dir / "ha-failback-request"
        journal_lock = self.data_dir / "journal" / "LOCK"
        try:
            while not self.stopping:
                self.state = HaState.load(self.data_dir)
                if self.role != "slave":
                    self._set_role("slave", f"waiting for the store lock {lock.path}")
                primary = self.state.peer.get("primary")
                if primary == self.name and lock.is_locked_by_other():
                    request.write_text(self.name)
                    log.info("node %s: primary is back; asking the live node to fail back", self.name)

                def may_take() -> bool:
                    # a node that yielded waits until the requester has the lock
                    if not request.exists():
                        return True
                    with contextlib.suppress(OSError):
                        return request.read_text().strip() == self.name
                    return True

                got = await wait_for_lock(lock, self.opts.lock_interval, stop=self._stop, may_take=may_take)
                if not got:
                    return
                if is_locked(journal_lock):
                    # we hold ha.lock but another process still holds the journal: the lock
                    # file was deleted or replaced under a live master. Never raise the epoch
                    # or open the store: let go and stay slave (the master re-takes the lock).
                    lock.release()
                    self._lock_conflicts += 1
                    if self._lock_conflicts == 1 or self._lock_conflicts % 100 == 0:
                        log.warning(
                            "node %s: took %s but the journal is locked by another process: the lock file "
                            "was deleted or replaced while a master runs; staying slave (%d times)",
                            self.name, lock.path, self._lock_conflicts,
                        )
                    await self._sleep(self.opts.lock_interval)
                    continue
                with contextlib.suppress(OSError):
                    if request.exists() and request.read_text().strip() == self.name:
                        request.unlink()
                try:
                    self.state = HaState.load(self.data_dir)
                    self.state.epoch += 1
                    self.state.role = "master"
                    self.state.synced = True
                    self.state.peer.setdefault("primary", self.name)
                    self.state.save(self.data_dir)
                except OSError as exc:
                    # e.g. the shared disk is full (the master before us fenced for it): never
                    # die for that; let go of the lock and try again, as a replicated node does
                    lock.release()
                    log.error("node %s: cannot record the new epoch in %s: %s; retrying in %s s",
                              self.name, self.data_dir, exc, max(1.0, self.opts.lock_interval))
                    self._set_role("waiting", f"I/O error: {exc}")
                    await self._sleep(max(1.0, self.opts.lock_interval))
                    continue
                is_primary = self.state.peer.get("primary") == self.name
                try:
                    await self._start_master(replicate=False)
                    outcome = await self._hold_shared_store(request, is_primary, lock)
                except StoreLockedError as exc:
                    # the journal was taken between our check and the open: never die for it
                    log.error("node %s: %s; staying slave", self.name, exc)
                    outcome = "fenced"
                finally:
                    await self._stop_master()
                    lock.release()
                if outcome == "stop":
                    return
                if outcome == "fenced":
                    self._set_role("fenced", "left the master role")
                    await self._sleep(self.opts.lock_interval)
                    continue
                # give the returning primary the lock before we poll again
                deadline = time.monotonic() + max(10.0, 20 * self.opts.lock_interval)
                while request.exists() and time.monotonic() < deadline:
                    await self._sleep(self.opts.lock_interval)
        finally:
            lock.release()

    async def _hold_shared_store(self, request: Path, is_primary: bool, lock: FileLock) -> str:
        """Serve until stop ("stop"), a failback request we honour ("yield"), or a lock
        file we lost and cannot take back ("fenced")."""
        lost_at = 0.0
        grace = max(2.0, 10 * self.opts.lock_interval)
        while True:
            await self._sleep(self.opts.lock_interval)
            if self.opts.allow_failback and not is_primary and request.exists():
                log.info("node %s: failback requested by the primary; handing the store over", self.name)
                return "yield"
            if lock.still_ours():
                continue
            # ha.lock was deleted or replaced: we hold a lock on a file nobody can see
            if lock.relock():
                log.warning("node %s: %s was deleted or replaced while we were master; locked the file "
                            "that has the name now", self.name, lock.path)
                lost_at = 0.0
                continue
            now = time.monotonic()
            if not lost_at:
                lost_at = now
                log.error("node %s: %s was replaced by a file another process holds; trying to take it back "
                          "for %.1f s before fencing", self.name, lock.path, grace)
            elif now - lost_at >= grace:
                log.error("node %s: cannot take %s back: fencing (closing the client port and the store) so "
                          "that whoever holds it can be master alone", self.name, lock.path)
                return "fenced"

    # ------------------------------------------------------------------ master role
    async def _start_master(self, *, replicate: bool) -> None:
        t0 = time.monotonic()
        server = BrokerServer(self.config, data_dir=self.data_dir, users=self.users)
        await server.open()
        server.connect_hook = self.requests  # status and role requests on the client port (port.py)
        server.on_fenced = self._master_fenced
        self.server = server
        self._demote = asyncio.Event()
        self._wake = asyncio.Event()
        self._held_since = 0.0
        self.role = "master"
        if replicate:
            self.repl = ReplicationMaster(
                server,
                link_timeout=self.opts.link_timeout,
                shutdown_on_slave_failure=self.opts.shutdown_on_slave_failure,
                on_synced=self._on_slave_synced,
                on_lost=self._on_slave_lost,
                on_suspect=self._on_suspect,
            )
        self._set_role("master", f"epoch {self.state.epoch}")
        self.became_master_at = time.monotonic()
        if not (replicate and self.opts.wait_for_slave):
            await self._listen()
        else:
            log.info("node %s: --wait-for-slave: client port stays closed until a slave has synced", self.name)
        log.info("node %s: master ready in %.3f s", self.name, time.monotonic() - t0)

    async def _listen(self) -> None:
        if self.listening or self.server is None:
            return
        await self.server.listen(self.host, self.port)
        self.listening = True
        self.say(f"listening on stomp://{self.server.host}:{self.server.port}")

    async def _stop_master(self) -> None:
        repl, self.repl = self.repl, None
        if repl is not None:
            repl.close()
        server, self.server = self.server, None
        self.listening = False
        if server is not None:
            await server.stop()

    def _master_fenced(self, reason: str) -> None:
        """The master's journal failed (a full disk, an I/O error; the server has fenced
        itself): hand over to an in-sync slave -- this store missed writes, so it never
        claims master again before resyncing -- or, with none, stop (exit code 3)."""
        link = self.repl.link if self.repl is not None else None
        if link is not None and link.synced and self._demote is not None:
            log.error("node %s: %s: handing over to the in-sync slave %s", self.name, reason, link.slave)
            self.state.synced = False
            with contextlib.suppress(OSError):  # the disk may be the full one
                self.state.save(self.data_dir)
            self._demote.set()
            return
        log.error("node %s: %s: no in-sync slave to hand over to: stopping (exit code 3)", self.name, reason)
        self.exit_code = 3
        self.stop()

    def _on_slave_synced(self, link: MasterLink) -> None:
        self.state.peer_may_be_master = True
        peer = {k: link.info[h] for k, h in (("client", "amq-ha-client"), ("ha", "amq-ha-port")) if h in link.info}
        self.state.peer.update(peer, name=link.slave)
        self.state.save(self.data_dir)
        self.say(f"slave {link.slave} in sync")
        if not self.listening and self.loop is not None:
            self.loop.create_task(self._listen())

    def _on_slave_lost(self, link: MasterLink, reason: str, was_synced: bool) -> None:
        self.say(f"slave {link.slave} lost: {reason}")
        d = decide(self.moment(SLAVE_LOST, goodbye=link.bye, slave_was_synced=was_synced), self.rules, Peers())
        if d.action == FORGET:
            # a clean slave shutdown: it will not take over, so we may restart alone
            self.state.peer_may_be_master = False
            self.state.save(self.data_dir)
        elif d.action == STOP:
            log.error("node %s: %s", self.name, d.reason)
            self.role = "stopping"  # from now on no probe sees a master here: the slave may take over
            self.exit_code = 3
            self.stop()
        elif d.action == CHECK and self.loop is not None:
            moment = self.moment(SLAVE_LOST, goodbye=link.bye, slave_was_synced=was_synced)
            self.loop.create_task(self._fence_check(moment))

    async def _fence_check(self, moment: NodeState) -> None:
        d = await self._decide(lambda: moment)
        if d.action == FENCE:
            log.error("node %s: %s", self.name, d.reason)
            self.demote()
        else:
            log.info("node %s: %s", self.name, d.reason)

    def _on_suspect(self, _reason: str) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _serve_master(self) -> None:
        self.state.epoch += 1
        self.state.role = "master"
        self.state.synced = True
        self.state.save(self.data_dir)
        await self._start_master(replicate=True)
        demote, wake = self._demote, self._wake
        assert demote is not None and wake is not None
        try:
            while not self.stopping and not demote.is_set():
                repl = self.repl
                every = 1.0 if repl is None or repl.suspect is None else max(0.05, self.opts.link_timeout / 4)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), every)
                wake.clear()
                if self.stopping or demote.is_set() or self.repl is None:
                    break
                if self.repl.suspect is not None:
                    await self._confirm_peer()
                elif self.repl.link is None:
                    await self._check_peer_not_master()
        finally:
            await self._stop_master()
        if self.stopping:
            raise _Stop()
        self._set_role("fenced", "left the master role")

    async def _confirm_peer(self) -> None:
        """One round of asking the peer to stand by while receipts are held (decide.py,
        phase ``master``)."""
        repl = self.repl
        assert repl is not None

        d = await self._decide(lambda: self.moment(MASTER), lambda: ask_peer(
            self._peer_addresses(), lambda: self._request_headers(STANDBY_HEADER), min(1.0, self.opts.link_timeout)
        ))
        if self.repl is not repl or repl.suspect is None or self.stopping:
            return
        if d.action == CLEAR:
            repl.clear_suspect(d.reason)
            self._held_since = 0.0
        elif d.action in (STEP_DOWN, DEMOTE_PEER):
            await self._end_split_brain(d)
        else:
            now = time.monotonic()
            if not self._held_since:
                self._held_since = self._held_logged = now
                log.error("node %s: receipts held until the peer can be asked to stand by: %s", self.name,
                          d.reason)
            elif now - self._held_logged >= 10:
                self._held_logged = now
                log.error("node %s: receipts held for %.0f s: %s", self.name, now - self._held_since, d.reason)

    async def _check_peer_not_master(self) -> None:
        """With no slave attached: is the peer a master too (the end of a split brain)?"""
        d = await self._decide(lambda: self.moment(MASTER), lambda: ask_peer(self._peer_addresses(), None, 0.5))
        if self.repl is None or self.repl.link is not None or self.stopping:
            return
        await self._end_split_brain(d)

    async def _end_split_brain(self, d: Decision) -> None:
        """A master acts on ``step-down`` (leave the master role) and ``demote-peer``."""
        if d.action == STEP_DOWN:
            log.error("node %s: %s: split brain ended; demoting to slave and resyncing "
                      "(our unreplicated writes are dropped)", self.name, d.reason)
            self.demote()
        elif d.action == DEMOTE_PEER:
            assert d.address is not None
            await self._ask_to_step_down(d.address, d.info)

    async def _ask_to_step_down(self, target: tuple[str, int], info: Mapping[str, str]) -> None:
        """A master with an older epoch (it came back without knowing about us, e.g. with a
        wiped store): ask it to step down and join us."""
        headers = self._request_headers(DEMOTE_HEADER)
        try:
            _answer, _r, writer = await ha_request(*target, headers, timeout=1.0)
            writer.close()
            log.warning("node %s: stale master %s (epoch %s < %d) at %s:%d agreed to step down",
                        self.name, info.get("amq-ha-name"), info.get("amq-ha-epoch"), self.state.epoch, *target)
        except (OSError, TimeoutError, ReplicationError) as exc:
            log.error("node %s: a second master %s (epoch %s) at %s:%d refused to step down: %s",
                      self.name, info.get("amq-ha-name"), info.get("amq-ha-epoch"), *target, exc)

    # ------------------------------------------------------------------ replicated
    def peer_addresses(self) -> list[tuple[str, int]]:
        """Every address this node knows for its peer (the console probes them)."""
        return self._peer_addresses()

    def _peer_addresses(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        texts = [self.opts.master_connector, self.state.peer.get("ha"), self.state.peer.get("client")]
        for text in texts:
            if not text:
                continue
            try:
                addr = parse_address(text)
            except ConfigError:
                continue
            if addr not in out and addr not in ((self.host, self.port), (self.host, self.ha_port)):
                out.append(addr)
        return out

    async def _run_replicated(self) -> None:
        self.state = HaState.load(self.data_dir)
        action = "decide"
        join: tuple[str, int] | None = None
        while not self.stopping:
            try:
                action, join = await self._replicated_step(action, join)
            except OSError as exc:
                # e.g. the state file cannot be written (a full disk): never die for that,
                # try again (the journal's own failures are fenced by the broker)
                log.error("node %s: %s failed: %s; retrying in 1 s", self.name, action, exc)
                self._set_role("waiting", f"I/O error: {exc}")
                await self._sleep(1.0)
                action, join = "decide", None
            if action == "stop":
                return

    async def _replicated_step(self, action: str, join: tuple[str, int] | None) -> tuple[str, tuple[str, int] | None]:
        """One step of the replicated role loop; returns the next (action, master address)."""
        if action == "decide":
            action, join = await self._decide_role()
        if action == "master":
            # decide() read state.synced after its last await: from there to the epoch
            # raise in _serve_master nothing awaits, so no stand-by request slips between
            await self._serve_master()
            return "decide", None
        if action == "slave":
            assert join is not None
            return await self._serve_slave(join), join
        if action == "wait":
            await self._sleep(max(self.opts.lock_interval, 0.2))
            return "decide", None
        return action, join

    def moment(self, phase: str, *, goodbye: bool = False, slave_was_synced: bool = False) -> NodeState:
        """What decide.py reads of this node now (``goodbye``, ``slave_was_synced``: of
        the slave link that just ended)."""
        st, link, repl = self.state, self.slave_link, self.repl
        linked_to = None
        if link is not None and link.up and link.synced:
            linked_to = st.peer.get("name")
        elif repl is not None and repl.link is not None and repl.link.synced:
            linked_to = repl.link.slave
        return NodeState(phase, epoch=st.epoch, synced=st.synced, last_role=st.role,
                         peer_may_be_master=st.peer_may_be_master, master_strict=st.master_strict, role=self.role,
                         linked_to=linked_to, goodbye=goodbye, slave_was_synced=slave_was_synced)

    async def _decide(
        self, moment: Callable[[], NodeState], ask: Callable[[], Awaitable[list[PeerAnswer]]] | None = None
    ) -> Decision:
        """Decide (decide.py), making each observation the table asks for; the node's
        state is read again after every await."""
        peers = Peers()
        while True:
            d = decide(moment(), self.rules, peers)
            if d.action == ASK:
                assert ask is not None, "this phase observes no answers"
                peers = replace(peers, answers=tuple(await ask()))
            elif d.action == CHECK:
                assert self.rules.takeover_check is not None
                peers = replace(peers, check=await reachable(self.rules.takeover_check, 1.0))
            else:
                return d

    async def _decide_role(self) -> tuple[str, tuple[str, int] | None]:
        """Master, slave of whom, or wait (decide.py, phase ``start``)."""
        d = await self._decide(lambda: self.moment(START), lambda: ask_peer(
            self._peer_addresses(), None, min(1.0, self.opts.link_timeout), until=lambda _a: False
        ))
        if d.action == JOIN:
            return "slave", d.address
        if d.action == BECOME_MASTER:
            log.log(logging.WARNING if self.state.role == "slave" else logging.INFO, "node %s: %s", self.name,
                    d.reason)
            return "master", None
        self._wait(d.reason)
        return "wait", None

    def _request_headers(self, request_header: str) -> dict[str, str]:
        """Headers of a request to another node (``request_header``: replica or demote):
        our name, epoch and addresses, signed with the cluster secret, and the
        replication credentials (``--master-user``) when configured."""
        headers = {
            request_header: self.name,
            "amq-ha-epoch": str(self.state.epoch),
            "amq-ha-client": f"{self.host}:{self.port}",
            "amq-ha-port": f"{self.host}:{self.ha_port}",
        }
        if self.signer is not None:
            headers[AUTH_HEADER] = self.signer.sign(request_header, headers, time.time())
        if self.opts.master_user is not None and request_header == REPLICA_HEADER:
            headers["login"] = self.opts.master_user
            headers["passcode"] = self.opts.master_password or ""
        return headers

    def _close_slave_store(self) -> None:
        store, self.slave_store = self.slave_store, None
        if store is not None:
            store.close()

    async def _serve_slave(self, addr: tuple[str, int]) -> str:
        """Replicate from the master at ``addr``; returns the next action."""
        headers = self._request_headers(REPLICA_HEADER)
        where = f"tcp://{addr[0]}:{addr[1]}"
        try:
            answer, reader, writer = await ha_request(*addr, headers, timeout=max(1.0, self.opts.link_timeout))
        except ReplicaRefused as exc:
            log.error(
                "replication link to master %s refused by the master: %s "
                "(check the cluster secret and --master-user/--master-password)", where, exc,
            )
            self._wait(f"refused by master {where}: {exc}")
            await self._sleep(2.0)
            return "decide"
        except (OSError, TimeoutError, ReplicationError) as exc:
            log.info("replication link to %s failed: %s", where, exc)
            return "wait"
        info = dict(answer.headers)
        if info.get("amq-ha-role") != "master":
            log.error("%s is not an HA master (role %r); is it started with --ha replicated?", where,
                      info.get("amq-ha-role"))
            writer.close()
            return "wait"
        master_epoch = int(info.get("amq-ha-epoch", "0") or 0)
        self.master_address = info.get("amq-ha-client", where)
        self.state.peer = {k: info[h] for k, h in (("client", "amq-ha-client"), ("ha", "amq-ha-port"),
                                                   ("name", "amq-ha-name")) if h in info}
        self.state.master_strict = info.get("amq-ha-strict") == "true"
        self._waiting_reason = ""
        self._set_role("slave", f"of {where} (master {info.get('amq-ha-name')} epoch {master_epoch})")
        # a full sync starts from nothing: until the snapshot is durable we are not a copy
        self.state.synced = False
        self.state.role = "slave"
        self.state.save(self.data_dir)
        self.slave_link = None
        self._close_slave_store()
        assert self.loop is not None
        store = fresh_replica_store(self.data_dir, self.config, self.loop)
        self.slave_store = store

        def synced() -> None:
            self.state.epoch = master_epoch
            self.state.synced = True
            self.state.role = "slave"
            self.state.save(self.data_dir)
            self.say(f"synced {len(store.live)} messages at epoch {master_epoch}")

        link = self.slave_link = SlaveLink(store, reader, writer, link_timeout=self.opts.link_timeout,
                                           on_synced=synced)
        outcome = await link.run(self._stop)
        if outcome == "stop" and self.state.synced:
            # the master goes on without us after a goodbye: this copy is stale from
            # its next receipt on, so it must resync before it could serve
            self.state.synced = False
            self.state.save(self.data_dir)
        writer.close()
        if outcome == "stop":
            return "stop"
        return await self._after_master_loss(addr, where)

    async def _after_master_loss(self, addr: tuple[str, int], where: str) -> str:
        """The link to the master at ``addr`` is gone: take over, or not (decide.py,
        phase ``link-lost``); returns the next action."""
        candidates = [addr] + [a for a in self._peer_addresses() if a != addr]
        isolated = False
        while not self.stopping:
            d = await self._decide(lambda: self.moment(LINK_LOST), lambda: ask_peer(
                candidates, None, min(1.0, self.opts.link_timeout), until=_is_master
            ))
            if d.action == RETRY:
                log.warning("replication link to %s lost: %s", where, d.reason)
                return "wait"
            if d.action == COLD_BACKUP:
                log.warning("node %s: master %s lost; %s", self.name, where, d.reason)
                self._close_slave_store()
                self._set_role("cold-backup", f"store {self.data_dir}")
                return "stop"
            if d.action == RELINK:
                log.warning("node %s: %s", self.name, d.reason)
                self._set_role("slave", "link lost; master alive; re-linking")
                await self._sleep(max(self.opts.lock_interval, 0.2))
                return "decide"
            if d.action == ISOLATED:
                if not isolated:
                    log.error("node %s: %s", self.name, d.reason)
                    self._set_role("slave", "isolated: master and takeover check unreachable")
                isolated = True
                await self._sleep(max(self.opts.lock_interval, 0.2))
                continue
            log.warning("node %s: master %s:%d lost: taking over", self.name, *addr)
            self._close_slave_store()
            self.takeovers += 1
            return "master"
        return "stop"


def _is_master(answer: PeerAnswer) -> bool:
    return answer.info is not None and answer.info.get("amq-ha-role") == "master"


def run_node(config: BrokerConfig, users: Mapping[str, str] | None, options: HaOptions) -> int:
    """Run one HA node in the foreground until SIGTERM/SIGINT; returns the exit code."""
    node = HaNode(config, users, options)
    try:
        return asyncio.run(node.run())
    except KeyboardInterrupt:
        return 0
