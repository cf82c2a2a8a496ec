"""A node's term as master: the broker, the receipt gate, a lost slave, a split brain.

Theory of operation
-------------------
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
will resync before it could take over) and the master goes on alone; a peer refusing on
every address counts as stopped only within the refusal window after the receipts began
to be held (:attr:`.replication.ReplicationMaster.suspect_since`; decide.py,
"Refusals"); no answer keeps the receipts held. While receipts are held the client port is closed (connections made
before stay; a CONNECT that reaches it anyway is refused): clients probing for a port
that accepts come back about one probe interval after it is reopened, instead of
backing off further with every refused CONNECT. With ``--shutdown-on-slave-failure`` the master stops instead
(receipts for unreplicated records are refused; from that moment its status no longer
says master, so the slave takes over); with ``--takeover-check`` a master that cannot
reach that address when it loses its synced slave fences itself. With ``--witness`` a
master renews its witness lease all term long (:meth:`MasterRole._keep_lease`), and a
suspect master asks the witness to renew it before it asks the peer to stand by (a peer
behind a link that drops packets answers nothing for the whole ask): while the witness
renews the lease it grants the slave nothing, so the master receipts alone until the
lease runs out unrenewed (decide.py, outcome ``lease``); a witness that says another node
was granted mastership fences it. A slave that
re-links over a connection the master still thinks open (half-open TCP) replaces it:
that is not a lost slave, and what waited for the old link waits for the new one's
full sync. With no slave attached it probes its known peer every second and demotes
itself if the peer is a master with a higher epoch (the end of a split brain); if the
peer is a master with a *lower* epoch (it came back knowing nothing of us, e.g. with a
wiped store), it sends it a demote request (``amq-ha-demote``) and the stale master --
once the requester's own HA port confirms that it is master at that newer epoch --
steps down, learns our address and joins us as slave (:mod:`.port` answers requests).

A term that ends on purpose -- the node stops (SIGTERM), or its journal failed and it
fences itself (:meth:`MasterRole._fenced`) -- with an in-sync slave attached hands over:
the link's last frame, after the last receipt, is a signed ``HANDOVER`` (:meth:`MasterRole.stop`),
and the slave takes over at once instead of probing twice as after a crash (decide.py,
"Handovers"). A term that ends because the peer is master, or may be (step-down, a
witness that granted it, a failed takeover check), hands nothing over.

:class:`MasterRole` reads and changes the node only through :class:`MasterHost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from ...tasks import cancel_and_wait
from ..server import BrokerServer
from ..store.chain import SegmentsLost
from .decide import (
    CHECK,
    CLEAR,
    DEMOTE_PEER,
    FENCE,
    FORGET,
    LEASE,
    MASTER,
    SLAVE_LOST,
    STEP_DOWN,
    STOP,
    DecideOptions,
    Decision,
    NodeState,
    Peers,
    decide,
)
from .host import RoleHost
from .port import HaRequests
from .replication import MasterLink, ReplicationMaster
from .wire import (
    DEMOTE_HEADER,
    HANDOVER_HEADER,
    LINK_CHALLENGE_HEADER,
    STANDBY_HEADER,
    ReplicationError,
    ask_peer,
    ha_request,
    pack_handover,
)
from .witness import WitnessAnswer, WitnessClient

__all__ = ["MasterHost", "MasterRole"]

log = logging.getLogger(__name__)


class MasterHost(RoleHost, Protocol):
    """What a term as master reads and changes on the node (:class:`.node.HaNode`)."""

    host: str
    port: int
    users: dict[str, str]
    rules: DecideOptions
    role: str
    server: BrokerServer | None
    repl: ReplicationMaster | None
    listening: bool
    became_master_at: float
    exit_code: int
    demote_event: asyncio.Event | None
    wake: asyncio.Event | None
    witness: WitnessClient | None
    lease_until: float
    lease_released: bool
    granted_epoch: int

    @property
    def requests(self) -> HaRequests: ...

    async def renew_lease(self, *, alone: bool) -> WitnessAnswer:
        """Renew the master's witness lease (updates :attr:`lease_until` when granted)."""
        ...

    async def release_lease(self) -> WitnessAnswer:
        """Give the witness lease back (handing over); no renewal after it."""
        ...

    def covered_by_lease(self) -> bool:
        """Master with a witness whose own count of its lease has not run out."""
        ...

    def stop(self) -> None:
        """Stop the node."""

    def demote(self) -> None:
        """Leave the master role (the role loop then decides again)."""


class MasterRole:
    """A node's terms as master (see the module docstring); one per node."""

    def __init__(self, node: MasterHost) -> None:
        self.node = node
        self.held_since = 0.0  # receipts held for a peer check since (monotonic), 0: not held
        self.held_logged = 0.0
        self.port_closed_for_suspect = False  # the client port was closed by _on_suspect
        self.port_open_on_lease = False  # suspect, the port left open while the witness lease covers us
        self.renew_now: asyncio.Event | None = None  # set: renew the witness lease now (a slave synced)
        self.handing_over = ""  # why this term ends with a handover to the in-sync slave ("" it does not)

    async def start(self, *, replicate: bool, data_dir: Path | None = None) -> None:
        """Open the store (in ``data_dir``, default the node's) and the broker, install the
        receipt gate (``replicate``), bind the client port (with ``--wait-for-slave``: once
        a slave has synced)."""
        node = self.node
        t0 = time.monotonic()
        server = BrokerServer(node.config, data_dir=data_dir or node.data_dir, users=node.users)
        await server.open()
        server.connect_hook = node.requests  # status and role requests on the client port (port.py)
        server.on_fenced = self._fenced
        node.server = server
        node.demote_event = asyncio.Event()
        node.wake = asyncio.Event()
        self.handing_over = ""
        self.held_since = 0.0
        self.port_closed_for_suspect = False
        self.port_open_on_lease = False
        node.role = "master"
        if replicate:
            node.repl = ReplicationMaster(
                server,
                link_timeout=node.opts.link_timeout,
                shutdown_on_slave_failure=node.opts.shutdown_on_slave_failure,
                on_synced=self._on_slave_synced,
                on_lost=self._on_slave_lost,
                on_suspect=self._on_suspect,
                on_clear=self._on_clear,
            )
            if node.witness is not None:  # receipting alone only while the lease lasts, from the start
                node.repl.lease_until = node.lease_until
        node.set_role("master", f"epoch {node.state.epoch}")
        node.became_master_at = time.monotonic()
        if not (replicate and node.opts.wait_for_slave):
            await self.listen()
        else:
            log.info("node %s: --wait-for-slave: client port stays closed until a slave has synced", node.name)
        log.info("node %s: master ready in %.3f s", node.name, time.monotonic() - t0)

    async def listen(self) -> None:
        node = self.node
        if node.listening or node.server is None:
            return
        if node.repl is not None and node.repl.suspect is not None:
            self.port_closed_for_suspect = True  # bound once receipts resume (_on_clear)
            return
        await node.server.listen(node.host, node.port)
        node.listening = True
        node.say(f"listening on stomp://{node.server.host}:{node.server.port}")
        if node.server.ws_address is not None:
            node.say("listening on ws://{}:{}".format(*node.server.ws_address))

    async def stop(self) -> None:
        """Close the replication links, the client port and the store. A term that ends on
        purpose -- the node stops, or it fences itself (:meth:`_fenced`) -- hands over to an
        in-sync slave: the link ends with a signed handover after the last receipt."""
        node = self.node
        handover = self._handover(node.repl) if node.repl is not None else None
        if handover is not None and node.witness is not None:
            await self._release_lease()
        repl, node.repl = node.repl, None
        if repl is not None:
            repl.close(handover)
        server, node.server = node.server, None
        node.listening = False
        if server is not None:
            await server.stop()

    async def _release_lease(self) -> None:
        """Before the handover frame: give the witness lease back (:func:`.lease.release`),
        so the slave is granted mastership at once rather than after the lease we no
        longer use ran out (about 1.5 x ``--link-timeout``). Receipts alone stop first; with
        the slave in sync every receipt waits for its ack anyway."""
        node = self.node
        if node.repl is not None and node.repl.lease_until is not None:
            node.repl.lease_until = 0.0
        try:
            answer = await asyncio.wait_for(node.release_lease(), max(0.5, node.opts.link_timeout))
        except Exception as exc:  # the witness unreachable: the slave waits for the lease to run out
            log.warning("node %s: could not release the witness lease before handing over: %r", node.name, exc)
        else:
            log.info("node %s: witness lease: %s", node.name, answer.reason)

    def _handover(self, repl: ReplicationMaster) -> bytes | None:
        """The ``HANDOVER`` frame that ends this term's link (None: no handover): signed
        with the cluster secret against the challenge the slave gave in its replication
        ``CONNECT``, carrying our name and epoch (decide.py, "Handovers")."""
        node, link = self.node, repl.link
        why = self.handing_over or ("the node stops" if node.stopping else "")
        if not why or link is None or not link.synced:
            return None
        challenge = link.info.get(LINK_CHALLENGE_HEADER)
        request = node.request_headers(HANDOVER_HEADER)
        if not challenge or request.signer is None:
            log.warning("node %s: cannot hand over to slave %s (%s): it gave no link challenge", node.name,
                        link.slave, why)
            return None
        log.warning("node %s: %s: handing over to the in-sync slave %s at epoch %d", node.name, why, link.slave,
                    node.state.epoch)
        try:
            return pack_handover(request.signed(challenge))
        except ReplicationError as exc:
            log.error("node %s: cannot hand over to slave %s: %s", node.name, link.slave, exc)
            return None

    def _fenced(self, reason: str) -> None:
        """The master's journal failed (a full disk, an I/O error; the server has fenced
        itself): hand over to an in-sync slave -- this store missed writes, so it never
        claims master again before resyncing -- or, with none, stop (exit code 3; a
        shared-store master so releases the store lock to its standby)."""
        node = self.node
        link = node.repl.link if node.repl is not None else None
        if link is not None and link.synced and node.demote_event is not None:
            log.error("node %s: %s: handing over to the in-sync slave %s", node.name, reason, link.slave)
            node.state.synced = False
            with contextlib.suppress(OSError):  # the disk may be the full one
                node.state.save(node.data_dir)
            self.handing_over = f"fenced ({reason})"
            if node.witness is not None and node.loop is not None:
                node.loop.create_task(self._hand_over(node.demote_event))
            else:
                node.demote_event.set()
                if node.wake is not None:  # the term ends now, not at the next peer check
                    node.wake.set()
            return
        if node.opts.mode == "shared-store" and node.witness is not None and node.demote_event is not None:
            # a store under a witness lease (sealed.py): leave the role, stop renewing; the standby seals it
            log.error("node %s: %s: leaving the master role (the witness lease lapses)", node.name, reason)
            node.demote_event.set()
            return
        if node.opts.mode == "shared-store":  # exiting releases the store lock: the standby takes over
            log.error("node %s: %s: releasing the store lock to the standby: stopping (exit code 3)", node.name,
                      reason)
        else:
            log.error("node %s: %s: no in-sync slave to hand over to: stopping (exit code 3)", node.name, reason)
        node.exit_code = 3
        node.stop()

    async def _hand_over(self, demote: asyncio.Event) -> None:
        """Tell the witness we no longer receipt alone (the slave acked every receipt we
        gave), then leave: the witness refuses mastership to a slave while the lease's
        last word is "alone", so a master that fenced before its lease loop renewed since
        the slave synced left the pair with no master for good (found by the nemesis: a
        full disk 30 ms after a resync)."""
        node = self.node
        try:
            await asyncio.wait_for(node.renew_lease(alone=False), max(0.5, node.opts.link_timeout))
        except Exception as exc:  # the witness unreachable: the slave asks it again anyway
            log.warning("node %s: could not tell the witness before handing over: %r", node.name, exc)
        demote.set()
        if node.wake is not None:  # the term ends now, not at the next peer check
            node.wake.set()

    def _on_slave_synced(self, link: MasterLink) -> None:
        node = self.node
        if self.renew_now is not None:  # tell the witness at once that we no longer receipt alone
            self.renew_now.set()
        node.state.peer_may_be_master = True
        peer = {k: link.info[h] for k, h in (("client", "amq-ha-client"), ("ha", "amq-ha-port")) if h in link.info}
        node.state.peer.update(peer, name=link.slave)
        try:
            node.state.save(node.data_dir)
        except OSError as exc:  # a full disk: the journal fails on it too and fences
            log.error("node %s: cannot record that slave %s is in sync: %s", node.name, link.slave, exc)
        node.say(f"slave {link.slave} in sync")
        if not node.listening and node.loop is not None:
            node.loop.create_task(self.listen())

    def _on_slave_lost(self, link: MasterLink, reason: str, was_synced: bool) -> None:
        node = self.node
        node.say(f"slave {link.slave} lost: {reason}")
        d = decide(node.decision_state(SLAVE_LOST, goodbye=link.bye, slave_was_synced=was_synced), node.rules, Peers())
        if d.action == FORGET:
            # a clean slave shutdown: it will not take over, so we may restart alone
            node.state.peer_may_be_master = False
            node.state.save(node.data_dir)
        elif d.action == STOP:
            log.error("node %s: %s", node.name, d.reason)
            node.role = "stopping"  # from now on no probe sees a master here: the slave may take over
            node.exit_code = 3
            node.stop()
        elif d.action == CHECK and node.loop is not None:
            observed = node.decision_state(SLAVE_LOST, goodbye=link.bye, slave_was_synced=was_synced)
            node.loop.create_task(self._fence_check(observed))

    async def _fence_check(self, observed: NodeState) -> None:
        node = self.node
        d = await node.decide_observing(lambda: observed)
        if d.action == FENCE:
            log.error("node %s: %s", node.name, d.reason)
            node.demote()
        else:
            log.info("node %s: %s", node.name, d.reason)

    def _on_suspect(self, _reason: str) -> None:
        """Receipts are held until the peer stands by: close the client port meanwhile. A
        port that accepts and then refuses the CONNECT made clients' back-off grow (each
        probe saw it accept, each attempt failed: up to 25.6 s to come back once the pair
        was healthy); a refused port keeps their probes going, so they are back about one
        probe interval after :meth:`_on_clear` reopens it. Connections made before stay.

        With a witness and our lease still running (``covered_by_lease``: the peer cannot
        be master before it ends) the port stays open and clients may connect while the
        witness is asked first (decide.py, ``master`` row 1, a few milliseconds); it closes
        only if that round ends with the receipts still held. Closing it for those
        milliseconds sent the clients cut off with the lost slave's receipts to the other
        node's address -- the lost slave, whose host may drop their SYN for seconds
        (nemesis ``isolate-node`` of the slave: 4 empty windows, issue 24)."""
        node = self.node
        if node.covered_by_lease():
            self.port_open_on_lease = True
        else:
            self._close_port_for_suspect()
        if node.wake is not None:
            node.wake.set()

    def _close_port_for_suspect(self) -> None:
        node = self.node
        self.port_open_on_lease = False
        if node.server is not None and node.server.close_port():
            node.listening = False
            self.port_closed_for_suspect = True
            node.say("client port closed: receipts are held until the peer stands by")

    def _on_clear(self, _reason: str) -> None:
        """Receipts resume: reopen the client port :meth:`_on_suspect` closed."""
        node = self.node
        self.port_open_on_lease = False
        if self.port_closed_for_suspect and node.loop is not None:
            node.loop.create_task(self._reopen())

    async def _reopen(self) -> None:
        node = self.node
        server, repl = node.server, node.repl
        if not self.port_closed_for_suspect or server is None or repl is None or not repl.serving or node.listening:
            return
        try:
            await server.listen(node.host, node.port)
        except OSError as exc:  # the port was taken meanwhile: nothing to serve on; decide again
            log.error("node %s: cannot reopen the client port %s:%d: %s", node.name, node.host, node.port, exc)
            node.demote()
            return
        if node.server is not server or node.repl is not repl or not repl.serving:
            server.close_port()  # suspect again (or stopped) while binding
            return
        self.port_closed_for_suspect = False
        node.listening = True
        node.say(f"client port reopened on stomp://{server.host}:{server.port}")

    async def serve(self) -> None:
        """A replicated master's term: raise the epoch, serve, check the peer while no
        slave is attached or while receipts are held, until demoted or stopped."""
        node = self.node
        before = (node.state.epoch, node.state.role)
        # the epoch the witness granted, when newer than ours + 1 (lease.takeover_epoch)
        node.state.epoch = max(node.state.epoch + 1, node.granted_epoch)
        node.granted_epoch = 0
        node.state.role = "master"
        node.state.synced = True
        node.state.save(node.data_dir)
        node.lease_until = 0.0
        node.lease_released = False
        if node.witness is not None:
            # the term starts with no in-sync slave: receipting alone needs a lease whose
            # last word says so -- the grant that made us master recorded "not alone", and
            # a witness that grants past an unused grant (lease.takeover_epoch) relies on it.
            # Not granted: the lease is 0, the term starts suspect (start(), decide.py).
            await node.renew_lease(alone=True)
        try:
            await self.start(replicate=True)
        except SegmentsLost:  # the store refused to open (records lost): this was no term
            node.state.epoch, node.state.role = before
            node.state.save(node.data_dir)
            raise
        demote, wake = node.demote_event, node.wake
        assert demote is not None and wake is not None
        keeper = node.loop.create_task(self._keep_lease()) if node.witness is not None and node.loop else None
        try:
            while not node.stopping and not demote.is_set():
                repl = node.repl
                every = 1.0 if repl is None or repl.suspect is None else max(0.05, node.opts.link_timeout / 4)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), every)
                wake.clear()
                if node.stopping or demote.is_set() or node.repl is None:
                    break
                if node.repl.suspect is not None:
                    await self._confirm_peer()
                    if node.repl is not None and node.repl.suspect is not None and self.port_open_on_lease:
                        self._close_port_for_suspect()  # the witness did not renew: still held
                elif node.repl.link is None:
                    await self._check_peer_not_master()
        finally:
            if keeper is not None:
                await cancel_and_wait(keeper)
            await self.stop()
        if not node.stopping:
            node.set_role("fenced", "left the master role")

    async def _keep_lease(self) -> None:
        """Renew the witness lease every third of ``--link-timeout`` for the whole term,
        saying whether we receipt alone (no in-sync slave: that slave's copy is then stale,
        so the witness must never grant it mastership). A receipt-alone term on the lease
        (:attr:`.replication.ReplicationMaster.lease_until`) follows each renewal; a witness
        that says another node was granted mastership at our epoch or a newer one fences us."""
        node = self.node
        every = max(0.05, node.opts.link_timeout / 3)
        logged = ""
        self.renew_now = asyncio.Event()
        while not node.stopping:
            repl = node.repl
            if repl is None:
                return
            alone = not (repl.link is not None and repl.link.synced)
            answer = await node.renew_lease(alone=alone)
            if node.repl is not repl:
                return
            if answer.granted and repl.lease_until is not None:
                repl.lease_until = node.lease_until
            if answer.fence:
                log.error("node %s: leaving the master role: %s", node.name, answer.reason)
                node.demote()
                return
            state = "granted" if answer.granted else answer.reason
            if state != logged:
                (log.info if answer.granted else log.warning)("node %s: witness lease: %s", node.name,
                                                               answer.reason)
                logged = state
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.renew_now.wait(), every)
            self.renew_now.clear()

    async def _confirm_peer(self) -> None:
        """One round of asking the peer to stand by while receipts are held (decide.py,
        phase ``master``)."""
        node = self.node
        repl = node.repl
        assert repl is not None

        d = await node.decide_observing(lambda: node.decision_state(MASTER), lambda: ask_peer(
            node.peer_addresses(), lambda: node.request_headers(STANDBY_HEADER), min(1.0, node.opts.link_timeout)
        ))
        if node.repl is not repl or repl.suspect is None or node.stopping:
            return
        if d.action == CLEAR:
            repl.clear_suspect(d.reason)
            self.held_since = 0.0
        elif d.action == LEASE:
            repl.clear_suspect(d.reason, lease_until=node.lease_until)
            self.held_since = 0.0
        elif d.action in (STEP_DOWN, DEMOTE_PEER):
            await self._end_split_brain(d)
        else:
            now = time.monotonic()
            if not self.held_since:
                self.held_since = self.held_logged = now
                log.error("node %s: receipts held until the peer can be asked to stand by: %s", node.name,
                          d.reason)
            elif now - self.held_logged >= 10:
                self.held_logged = now
                log.error("node %s: receipts held for %.0f s: %s", node.name, now - self.held_since, d.reason)

    async def _check_peer_not_master(self) -> None:
        """With no slave attached: is the peer a master too (the end of a split brain)?"""
        node = self.node
        d = await node.decide_observing(lambda: node.decision_state(MASTER), lambda: ask_peer(node.peer_addresses(), None, 0.5))
        if node.repl is None or node.repl.link is not None or node.stopping:
            return
        await self._end_split_brain(d)

    async def _end_split_brain(self, d: Decision) -> None:
        """A master acts on ``step-down`` (leave the master role) and ``demote-peer``."""
        node = self.node
        if d.action == STEP_DOWN:
            log.error("node %s: %s: split brain ended; demoting to slave and resyncing "
                      "(our unreplicated writes are dropped)", node.name, d.reason)
            node.demote()
        elif d.action == DEMOTE_PEER:
            assert d.address is not None
            await self._ask_to_step_down(d.address, d.info)

    async def _ask_to_step_down(self, target: tuple[str, int], info: Mapping[str, str]) -> None:
        """A master with an older epoch (it came back without knowing about us, e.g. with a
        wiped store): ask it to step down and join us."""
        node = self.node
        headers = node.request_headers(DEMOTE_HEADER)
        try:
            _answer, _r, writer = await ha_request(*target, headers, timeout=1.0)
            writer.close()
            log.warning("node %s: stale master %s (epoch %s < %d) at %s:%d agreed to step down",
                        node.name, info.get("amq-ha-name"), info.get("amq-ha-epoch"), node.state.epoch, *target)
        except (OSError, TimeoutError, ReplicationError) as exc:
            log.error("node %s: a second master %s (epoch %s) at %s:%d refused to step down: %s",
                      node.name, info.get("amq-ha-name"), info.get("amq-ha-epoch"), *target, exc)
