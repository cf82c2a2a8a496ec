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
role loop of that mode is :class:`~.shared.SharedStoreRole` -- with ``--witness``, the
witness's lease does and the store is sealed by a rename (:class:`~.sealed.LeasedStoreRole`).

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

A master's term -- the broker, the receipt gate, the lost slave, the split brain -- is
:class:`~.master.MasterRole`.

A slave's side -- joining a master, and what it does when that link breaks -- is
:func:`~.slave.serve_slave`.

With ``--relay-port`` a node that is not master but knows a live master (a
replicated slave while its link is up; a shared-store standby while it sees the
master answer) binds that port -- never its client port -- and relays each client to
the master (:mod:`.relay`): a client cut from the master, not from its slave, that
lists the relay ports after the client ports in its failover URI is served through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from amqtransport.errors import ConfigError
from amqtransport.tasks import cancel_and_wait

from ..config import BrokerConfig
from ..server import BrokerServer, stop_on_signals
from ..store import MessageStore
from ..store.salvage import verify as verify_journal
from .auth import HaRequest, RequestSigner, RequestVerifier, load_secret
from .config import HaOptions, parse_address
from .decide import (
    ASK,
    ASK_WITNESS,
    BECOME_MASTER,
    CHECK,
    CONFIRM,
    JOIN,
    LINK_LOST,
    START,
    DecideOptions,
    Decision,
    NodeState,
    PeerAnswer,
    Peers,
    Phase,
    decide,
    says_master,
)
from .epoch import HaState
from .master import MasterRole
from .port import HaPortProtocol, HaRequests
from .relay import ClientRelay, MasterWatch
from .replication import ReplicationMaster
from .sealed import LeasedStoreRole
from .shared import SharedStoreRole, sight_master
from .slave import SlaveLink, serve_slave
from .wire import (
    REPLICA_HEADER,
    ask_peer,
    reachable,
)
from .witness import (
    LEASE_MARGIN,
    RELEASE_HEADER,
    RENEW_HEADER,
    TAKEOVER_HEADER,
    WitnessAnswer,
    WitnessClient,
    lease_seconds,
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
        self.demote_event: asyncio.Event | None = None
        self.wake: asyncio.Event | None = None
        self._ha_server: asyncio.Server | None = None
        self.waiting_reason = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.takeovers = 0
        self.store_failures = 0  # slave: its replica store failed this many times in a row
        self.became_master_at = 0.0
        self.http: HttpServer | None = None  # the HTTP side port (--http), in every role
        self.journal_damage = ""  # what reading the journal before claiming found wrong ("" nothing)
        self._ha_waiting: set[HaPortProtocol] = set()
        self.signer: RequestSigner | None = None
        self.verifier: RequestVerifier | None = None
        #: the pair's witness (--witness), and until when (loop time) it renewed our lease as master
        self.witness: WitnessClient | None = None
        self.lease_until = 0.0
        #: this term released its lease (handing over): it renews nothing more
        self.lease_released = False
        self._lease_requests: set[asyncio.Future[WitnessAnswer]] = set()
        #: the epoch the witness granted mastership at (0: none): the next term raises to it
        self.granted_epoch = 0
        if options.mode == "replicated" or options.witness:
            secret = load_secret(options.cluster_password, options.cluster_password_file)
            if options.mode == "replicated":
                self.signer, self.verifier = RequestSigner(secret), RequestVerifier(secret)
            if options.witness:
                self.witness = WitnessClient(parse_address(options.witness, "--witness"), secret, self.name,
                                             lease_seconds(options.link_timeout))
        self.rules = DecideOptions.of(self.name, options)  # what decide.py reads of the options
        self.requests = HaRequests(self)  # the answer to every HA request (port.py)
        self.master = MasterRole(self)  # a term as master (master.py)
        #: --relay-port: the port on which a node that is not master relays to it (relay.py)
        self.relay: ClientRelay | None = None
        self.master_watch: MasterWatch | None = None  # a shared-store standby's look at its master
        if options.relay_port is not None:
            self.relay = ClientRelay(self.name, self.host, options.relay_port, options.port_limits, self.requests,
                                     connect_timeout=max(0.25, min(1.0, options.link_timeout)),
                                     client_port=self.port)
            if options.mode == "shared-store":
                self.master_watch = MasterWatch(
                    self.relay, lambda: sight_master(self.data_dir, self.name, self.own_addresses(),
                                                     min(1.0, options.link_timeout / 2)),
                    every=max(0.1, options.link_timeout / 4), stale=options.link_timeout)

    # ------------------------------------------------------------------ entry
    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():  # a node run in a test's thread: no signals
            stop_on_signals(self.loop, self.stop, lambda: self.exit_code or 1)
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
            if self.opts.mode == "shared-store" and self.witness is not None:
                await LeasedStoreRole(self).run()
            elif self.opts.mode == "shared-store":
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
        if self.wake is not None:
            self.wake.set()

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
        if self.demote_event is not None:
            self.demote_event.set()

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

    # ------------------------------------------------------------------ --relay-port
    async def relay_clients_to(self, master: str, upstream: tuple[str, int]) -> None:
        """A replicated slave whose link to ``master`` is up relays clients to its client
        address ``upstream`` (with --relay-port; else nothing)."""
        if self.relay is not None:
            await self.relay.relay_to(master, upstream)

    def stop_relaying(self, why: str) -> None:
        """The knowledge of a live master is gone: close the relay (its port is closed
        at once unless a bind is under way: :meth:`ClientRelay.settled`)."""
        if self.relay is not None:
            self.relay.stop(why)

    def watch_master(self) -> None:
        """A shared-store standby: relay while it sees a live master (with --relay-port)."""
        if self.master_watch is not None:
            self.master_watch.watch()

    async def unwatch_master(self, why: str) -> None:
        """A shared-store standby that takes the store (or stops): relay no more."""
        if self.master_watch is not None:
            await self.master_watch.unwatch(why)

    def relaying(self) -> tuple[str, int, str] | None:
        """(the master's client address the node relays to, connections relayed now, the
        relay's own address), or None."""
        relay = self.relay
        if relay is None or not relay.active:
            return None
        return relay.where(), relay.relayed, relay.address

    def own_addresses(self) -> set[str]:
        own = {f"{self.host}:{self.port}", f"{self.host}:{self.ha_port}"}
        if self.relay is not None:
            own.add(self.relay.address)
        return own

    async def _teardown(self) -> None:
        if self.master_watch is not None:
            await self.master_watch.unwatch("the node stops")
        if self.relay is not None:
            self.relay.stop("the node stops")
            await self.relay.settled()
        await self.master.stop()
        self.close_slave_store()
        if self._ha_server is not None:
            self._ha_server.close()
            self._ha_server = None
        if self.http is not None:
            await self.http.stop()
            self.http = None
        log.info("node %s stopped", self.name)

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
        await self._check_journal()
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

    async def _check_journal(self) -> None:
        """Read the journal before claiming anything (``amq broker verify``'s reading, on a
        thread): a synced store whose journal reads back damaged or missing records claims
        less than a peer's undamaged copy of the same epoch (decide.py), so the peer serves
        and this node resyncs from it. A store that is not synced is wiped anyway."""
        journal = self.data_dir / "journal"
        if not self.state.synced or not journal.is_dir():
            return
        try:
            report = await asyncio.to_thread(verify_journal, journal)
        except OSError as exc:
            self.journal_damage = f"the journal cannot be read: {exc}"
        else:
            if report.ok:
                return
            self.journal_damage = report.summary()
        log.error("node %s: journal damaged: %s. While its peer holds an undamaged copy of the same epoch this node "
                  "does not serve it: it resyncs from the peer (`amq broker verify %s` reports)", self.name,
                  self.journal_damage, self.data_dir)

    async def _replicated_step(self, action: str, join: tuple[str, int] | None) -> tuple[str, tuple[str, int] | None]:
        """One step of the replicated role loop; returns the next (action, master address)."""
        if action == "decide":
            action, join = await self._decide_role()
        if action == "master":
            # decide() read state.synced after its last await: from there to the epoch
            # raise in MasterRole.serve nothing awaits, so no stand-by request slips between.
            # A replica store left open by a slave link that ended in a re-link (the master
            # answered, then was gone before the next decision) holds the journal's lock:
            # the term would fail to open it at every retry, forever
            self.close_slave_store()
            await self.master.serve()
            if self.stopping:
                raise _Stop()
            return "decide", None
        if action == "slave":
            assert join is not None
            return await serve_slave(self, join), join
        if action == "wait":
            await self.sleep(max(self.opts.lock_interval, 0.2))
            return "decide", None
        return action, join

    def decision_state(self, phase: Phase, *, goodbye: bool = False, slave_was_synced: bool = False) -> NodeState:
        """What decide.py reads of this node now (``goodbye``, ``slave_was_synced``: of
        the slave link that just ended)."""
        st, link, repl = self.state, self.slave_link, self.repl
        linked_to = None
        if link is not None and link.up and link.synced:
            linked_to = st.peer.get("name")
        elif repl is not None and repl.link is not None and repl.link.synced:
            linked_to = repl.link.slave
        held_for = 0.0
        if repl is not None and repl.suspect is not None and self.loop is not None:
            held_for = max(0.0, self.loop.time() - repl.suspect_since)
        return NodeState(phase, epoch=st.epoch, synced=st.synced, last_role=st.role,
                         peer_may_be_master=st.peer_may_be_master, master_strict=st.master_strict, role=self.role,
                         linked_to=linked_to, goodbye=goodbye, slave_was_synced=slave_was_synced,
                         handed_over=link is not None and link.handed_over,
                         damaged=bool(self.journal_damage), held_for=held_for)

    async def decide_observing(
        self, read_state: Callable[[], NodeState], ask: Callable[[], Awaitable[list[PeerAnswer]]] | None = None
    ) -> Decision:
        """Decide (decide.py), making each observation the table asks for; the node's
        state is read again after every await."""
        peers = Peers()
        while True:
            d = decide(read_state(), self.rules, peers)
            if d.action == ASK:
                assert ask is not None, "this phase observes no answers"
                if self.witness is not None and read_state().phase == LINK_LOST:
                    peers = await self._probe_beside_the_witness(ask, peers)
                else:
                    peers = replace(peers, answers=tuple(await ask()))
            elif d.action == CONFIRM:  # a refusal proves a dead master only when it persists (decide.py)
                assert ask is not None, "this phase observes no answers"
                log.warning("node %s: %s", self.name, d.reason)
                await self.sleep(self.rules.confirm_delay)
                peers = replace(peers, again=tuple(await ask()))
            elif d.action == CHECK:
                assert self.rules.takeover_check is not None
                peers = replace(peers, check=await reachable(self.rules.takeover_check, 1.0))
            elif d.action == ASK_WITNESS:
                if read_state().phase in (START, LINK_LOST):  # mastership at the epoch it would raise to
                    answer = await self.ask_witness(TAKEOVER_HEADER, self.state.epoch + 1)
                    if read_state().phase == LINK_LOST:
                        answer = await self._ask_again_when_the_lease_ends(answer)
                    self.granted_epoch = answer.epoch if answer.granted else 0
                else:  # a master renewing its lease while its receipts are held
                    alone = read_state().linked_to is None  # as MasterRole._keep_lease says it
                    answer = await self.renew_lease(alone=alone)
                    if answer.granted and not alone and read_state().linked_to is None:
                        # we told the witness an in-sync slave covers our receipts and it left
                        # meanwhile: this renewal does not let us receipt alone
                        answer = WitnessAnswer(False, "the in-sync slave left while the witness renewed our "
                                                      "lease (saying we do not receipt alone)")
                peers = replace(peers, witness=answer.granted, witness_reason=answer.reason)
            else:
                return d

    async def _probe_beside_the_witness(self, ask: Callable[[], Awaitable[list[PeerAnswer]]],
                                        peers: Peers) -> Peers:
        """``link-lost`` with a witness: probe the master's addresses and ask the witness for
        mastership side by side (asked again when the master's lease ends). A master that
        answers the probe wins (the table re-links; a grant made meanwhile goes unused, and
        the witness lets the pair past it). A grant that comes while the probe is still
        unanswered ends the probe: the witness grants only once the master's lease ran out,
        so that master receipts nothing alone any more, whether it would have answered or
        not. Asked one after the other, a frozen or cut-off master's probe timeout came on
        top of its lease: the takeover came 0.5 s after the lease ended, 1.5-2 s after
        the fault (the nemesis's lost ``t+1`` windows, docs/chaos.md)."""
        probing = asyncio.ensure_future(ask())
        asking = asyncio.ensure_future(self._takeover_answer())
        try:
            await asyncio.wait((probing, asking), return_when=asyncio.FIRST_COMPLETED)
            if asking.done() and asking.result().granted and not probing.done():  # (finally: the probe ends)
                answer = asking.result()
                log.info("node %s: the witness granted mastership while the master's addresses were still "
                         "unanswered: not waiting for them", self.name)
                self.granted_epoch = answer.epoch
                return replace(peers, answers=(), witness=True, witness_reason=answer.reason)
            answers = tuple(await probing)
            if any(says_master(a.info) for a in answers):
                return replace(peers, answers=answers)  # re-link (decide.py), whatever the witness says
            answer = await asking
            self.granted_epoch = answer.epoch if answer.granted else 0
            return replace(peers, answers=answers, witness=answer.granted, witness_reason=answer.reason)
        finally:
            await cancel_and_wait(probing, asking)

    async def _takeover_answer(self) -> WitnessAnswer:
        """The witness's answer to a takeover at the next epoch, asked again (once) when the
        master's lease ends (:meth:`_ask_again_when_the_lease_ends`)."""
        return await self._ask_again_when_the_lease_ends(await self.ask_witness(TAKEOVER_HEADER, self.state.epoch + 1))

    async def _ask_again_when_the_lease_ends(self, answer: WitnessAnswer) -> WitnessAnswer:
        """A slave that lost its master, refused mastership because the master's lease has
        ``remaining`` seconds left (the witness says how many): ask again just when it
        ends (once), rather than probe a silent master for a second more and pause
        first. The witness alone decides; the master's own count of its lease runs out
        before the witness's (:mod:`.lease`), so it receipts nothing alone by then."""
        assert self.witness is not None
        left = answer.remaining
        if answer.granted or answer.fence or not answer.reached or left is None or not 0 < left <= self.witness.lease:
            return answer
        log.warning("node %s: %s; asking the witness again when that lease ends", self.name, answer.reason)
        await self.sleep(left + 0.05)
        return await self.ask_witness(TAKEOVER_HEADER, self.state.epoch + 1)

    async def _decide_role(self) -> tuple[str, tuple[str, int] | None]:
        """Master, slave of whom, or wait (decide.py, phase ``start``)."""
        d = await self.decide_observing(lambda: self.decision_state(START), lambda: ask_peer(
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

    def covered_by_lease(self) -> bool:
        """A master with a witness whose own count of its lease has not run out: the
        witness grants the peer nothing before that lease ends by its clock, later than
        ours (:mod:`.lease`), so the peer cannot be master meanwhile. A suspect master so
        covered keeps its client port open while it asks the witness (:mod:`.master`)."""
        return (self.witness is not None and self.loop is not None and self.role == "master"
                and not self.lease_released and self.lease_until > self.loop.time())

    def accepts_clients(self) -> bool:
        """A client's CONNECT on the client port starts a session: the node serves, or it
        is suspect but :meth:`covered_by_lease` (the session's receipts wait like any other's);
        a shared-store master, unless :meth:`store_lease_lapsed`."""
        repl = self.repl
        if repl is None:  # a shared store: not once a witness lease ran out (sealed.py)
            return not self.store_lease_lapsed()
        return repl.serving or (repl.suspect is not None and self.covered_by_lease())

    def store_lease_lapsed(self) -> bool:
        """A shared-store master with a witness whose own count of its lease ran out: it
        answers no client CONNECT (:meth:`accepts_clients`) and leaves the role at its next
        poll (sealed.py)."""
        return (self.opts.mode == "shared-store" and self.witness is not None and self.role == "master"
                and self.loop is not None and self.loop.time() >= self.lease_until)

    def lease_left(self) -> float | None:
        if self.witness is None or self.role != "master" or self.loop is None:
            return None
        return max(0.0, self.lease_until - self.loop.time())

    async def ask_witness(self, request: str, epoch: int, *, alone: bool = False) -> WitnessAnswer:
        """One request to the witness (there must be one: --witness)."""
        assert self.witness is not None
        return await self.witness.ask(request, epoch, alone=alone, timeout=max(0.5, min(1.0, self.opts.link_timeout)))

    async def renew_lease(self, *, alone: bool) -> WitnessAnswer:
        """A master renews its witness lease; once granted, :attr:`lease_until` is the loop
        time it runs out by our count (from the moment we asked, minus a margin). A
        renewal is never cut off half-way (a caller cancelled meanwhile leaves it running):
        :meth:`release_lease` waits for it, so the release is the witness's last word."""
        assert self.loop is not None and self.witness is not None
        if self.lease_released:
            return WitnessAnswer(False, "this term released its lease (it hands over)")
        asked = self.loop.time()
        request = asyncio.ensure_future(self.ask_witness(RENEW_HEADER, self.state.epoch, alone=alone))
        self._lease_requests.add(request)
        request.add_done_callback(self._lease_requests.discard)
        answer = await asyncio.shield(request)
        if answer.granted and not self.lease_released:
            self.lease_until = max(self.lease_until, asked + self.witness.lease * (1 - LEASE_MARGIN))
        return answer

    async def release_lease(self) -> WitnessAnswer:
        """A master handing over to its in-sync slave gives its lease back (:func:`.lease.release`):
        it counts on the lease no more, lets a renewal under way reach the witness first,
        then releases, so the slave is granted mastership at once."""
        assert self.witness is not None
        self.lease_released = True
        self.lease_until = 0.0
        pending = [r for r in self._lease_requests if not r.done()]
        if pending:
            await asyncio.wait(pending)
        return await self.ask_witness(RELEASE_HEADER, self.state.epoch)

    def request_headers(self, request_header: str) -> HaRequest:
        """A request to another node (``request_header``: replica, demote or stand-by):
        our name, epoch and addresses, to be signed with the cluster secret against the
        receiver's challenge (:func:`.wire.ha_request` does), and the replication
        credentials (``--master-user``) when configured."""
        headers = {
            request_header: self.name,
            "amq-ha-epoch": str(self.state.epoch),
            "amq-ha-client": f"{self.host}:{self.port}",
            "amq-ha-port": f"{self.host}:{self.ha_port}",
        }
        if self.opts.master_user is not None and request_header == REPLICA_HEADER:
            headers["login"] = self.opts.master_user
            headers["passcode"] = self.opts.master_password or ""
        return HaRequest(request_header, headers, self.signer)

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
