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

Shared store (``--ha shared-store``): the store's file lock elects the master; the
role loop of that mode is :class:`~.shared.SharedStoreRole`.

Replicated, shared nothing (``--ha replicated``). A node with ``--master-connector``
is configured as slave; one without is configured as master. What the node is --
master, slave of whom, waiting -- and what it does when it loses its master, its
slave, or meets a second master is decided by :func:`.decide.decide`, a pure function
whose docstring holds the whole table (with the partition cases it answers); this
module observes what the table asks for (:meth:`HaNode.decide_observing`: probes, stand-by
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

A slave's side -- joining a master, and what it does when that link breaks -- is
:func:`~.slave.serve_slave`.
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
from ..store import MessageStore
from .auth import AUTH_HEADER, RequestSigner, RequestVerifier, load_secret
from .config import HaOptions, parse_address
from .decide import (
    ASK,
    BECOME_MASTER,
    CHECK,
    CLEAR,
    DEMOTE_PEER,
    FENCE,
    FORGET,
    JOIN,
    MASTER,
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
from .port import HaPortProtocol, HaRequests
from .replication import MasterLink, ReplicationMaster
from .shared import SharedStoreRole
from .slave import SlaveLink, serve_slave
from .wire import (
    DEMOTE_HEADER,
    REPLICA_HEADER,
    STANDBY_HEADER,
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
        self._ha_server: asyncio.Server | None = None
        self.waiting_reason = ""
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
                await SharedStoreRole(self).run()
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
    def stop_event(self) -> asyncio.Event:
        """Set when the node stops (a signal, or a decision to stop)."""
        return self._stop

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

    async def sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        if self._stop.is_set():
            raise _Stop()

    def set_role(self, role: str, detail: str = "") -> None:
        self.role = role
        self.say(f"role {role}" + (f" {detail}" if detail else ""))
        log.info("node %s: role %s %s", self.name, role, detail)

    def set_waiting(self, reason: str) -> None:
        if reason != self.waiting_reason:
            self.waiting_reason = reason
            self.set_role("waiting", reason)

    async def _teardown(self) -> None:
        await self.stop_master()
        self.close_slave_store()
        if self._ha_server is not None:
            self._ha_server.close()
            self._ha_server = None
        if self.http is not None:
            await self.http.stop()
            self.http = None
        log.info("node %s stopped", self.name)

    # ------------------------------------------------------------------ master role
    async def start_master(self, *, replicate: bool) -> None:
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
        self.set_role("master", f"epoch {self.state.epoch}")
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

    async def stop_master(self) -> None:
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
        d = await self.decide_observing(lambda: moment)
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
        await self.start_master(replicate=True)
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
            await self.stop_master()
        if self.stopping:
            raise _Stop()
        self.set_role("fenced", "left the master role")

    async def _confirm_peer(self) -> None:
        """One round of asking the peer to stand by while receipts are held (decide.py,
        phase ``master``)."""
        repl = self.repl
        assert repl is not None

        d = await self.decide_observing(lambda: self.moment(MASTER), lambda: ask_peer(
            self.peer_addresses(), lambda: self.request_headers(STANDBY_HEADER), min(1.0, self.opts.link_timeout)
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
        d = await self.decide_observing(lambda: self.moment(MASTER), lambda: ask_peer(self.peer_addresses(), None, 0.5))
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
        headers = self.request_headers(DEMOTE_HEADER)
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
                self.set_role("waiting", f"I/O error: {exc}")
                await self.sleep(1.0)
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
            return await serve_slave(self, join), join
        if action == "wait":
            await self.sleep(max(self.opts.lock_interval, 0.2))
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

    async def decide_observing(
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
        d = await self.decide_observing(lambda: self.moment(START), lambda: ask_peer(
            self.peer_addresses(), None, min(1.0, self.opts.link_timeout), until=lambda _a: False
        ))
        if d.action == JOIN:
            return "slave", d.address
        if d.action == BECOME_MASTER:
            log.log(logging.WARNING if self.state.role == "slave" else logging.INFO, "node %s: %s", self.name,
                    d.reason)
            return "master", None
        self.set_waiting(d.reason)
        return "wait", None

    def request_headers(self, request_header: str) -> dict[str, str]:
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

    def close_slave_store(self) -> None:
        store, self.slave_store = self.slave_store, None
        if store is not None:
            store.close()


def run_node(config: BrokerConfig, users: Mapping[str, str] | None, options: HaOptions) -> int:
    """Run one HA node in the foreground until SIGTERM/SIGINT; returns the exit code."""
    node = HaNode(config, users, options)
    try:
        return asyncio.run(node.run())
    except KeyboardInterrupt:
        return 0
