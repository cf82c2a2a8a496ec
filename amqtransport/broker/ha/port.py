"""The HA port, and the answer to every HA request (on the HA port or a master's client port).

Theory of operation
-------------------
Every node binds its HA port in every role. Each connection may send exactly one
STOMP ``CONNECT`` (a status request, a replication link, a demote, stand-by or
release request); :class:`HaPortProtocol` parses it and hands it to
:meth:`HaRequests.handle`, which answers, closes, or hands the socket on (a
replication link: :meth:`.replication.ReplicationMaster.attach`). A master's client
port passes HA requests to the same handler (:meth:`HaRequests.intercept_connect`, the
master's connect hook).
Garbage is answered with an ``ERROR`` frame and the connection is closed. Because
this port is open in every role and before any authentication, it is bounded
(:class:`~.config.HaPortLimits`): at most ``max_connections`` connections waiting for
their request (more are closed at once), ``idle_timeout`` seconds to deliver the
request, ``max_frame`` bytes for it. Refusals are logged with the remote address by a
:class:`RefusalLog`, which keeps a flood of them from filling the log.

The requests. A status request (``amq-ha-status``) needs no secret: it changes
nothing, and the ``CONNECTED`` answer carries the node's ``amq-ha-*`` status headers
(:func:`status_headers`). Every request that changes a role or a store is signed
with the pair's cluster secret against a challenge this port issued in an earlier
status answer (:mod:`.auth`), must not claim to come from this node,
and carries a numeric epoch; a demote or stand-by request must come from the known
peer. Then:

``amq-ha-replica`` (a slave links up)
    the users-file check of ActiveMQ's master connector credentials, if there are
    users; accepted by a master only, never from a store with a newer epoch, never
    replacing an in-sync slave of another name.
``amq-ha-demote`` (a master with a newer epoch asks a stale master to step down)
    accepted by a master only, for an epoch strictly newer than ours, once the
    requester's own HA port confirms that it is master at that epoch; we learn its
    addresses and leave the master role (then join it as slave).
``amq-ha-standby`` (a suspect master asks its peer to stand by)
    answered ``refused``, ``in-sync`` or ``ok`` (the ``stand-by`` rows of the table in
    :mod:`.decide`); agreeing marks this store as no longer a complete copy, in this one
    loop step.
``amq-ha-release`` (an operator: the peer is gone for good)
    a suspect master receipts alone again.

:class:`HaRequests` reads and changes the node only through :class:`PortHost`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from amqtransport.errors import ConfigError
from amqtransport.stomp import Frame, Limits, serialize
from amqtransport.stomp.session import ServerSession

from ..config import BrokerConfig, check_login
from ..connection.context import HookedConnection
from .auth import AUTH_HEADER, CHALLENGE_HEADER, SIGNED_HEADERS, RequestVerifier
from .config import HaOptions, HaPortLimits, parse_address
from .decide import OK, OK_UNSYNCED, STAND_BY, DecideOptions, NodeState, Phase, standby
from .epoch import HaState
from .replication import ReplicationMaster
from .wire import (
    DEMOTE_HEADER,
    RELEASE_HEADER,
    REPLICA_HEADER,
    STANDBY_ANSWER,
    STANDBY_HEADER,
    STANDBY_REASON,
    STATUS_HEADER,
    probe,
)

if TYPE_CHECKING:
    from ..http import HttpServer
    from ..server import BrokerServer
    from ..store import MessageStore

__all__ = ["HaPortProtocol", "HaRequests", "RequestHandler", "NodeReadout", "PortHost", "RefusalLog", "ROLE_REQUESTS", "answer_error", "status_headers"]

log = logging.getLogger(__name__)

#: requests that change a node's role or state: signed with the cluster secret (auth.py)
ROLE_REQUESTS = (REPLICA_HEADER, DEMOTE_HEADER, STANDBY_HEADER, RELEASE_HEADER)
REQUEST_NAMES = {REPLICA_HEADER: "replication link", DEMOTE_HEADER: "demote request",
                 STANDBY_HEADER: "stand-by request", RELEASE_HEADER: "release request"}


class RefusalLog:
    """Logs refused HA requests with the remote address: at most ``burst`` lines per
    ``window`` seconds, then one line saying how many were left out."""

    def __init__(
        self, logger: logging.Logger, *, burst: int = 20, window: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst = burst
        self.window = window
        self.clock = clock
        self._start = -window
        self._count = 0
        self._dropped = 0
        self.total = 0

    def __call__(self, peer: str, what: str, reason: str) -> None:
        self.total += 1
        now = self.clock()
        if now - self._start >= self.window:
            if self._dropped:
                self.logger.warning("HA port: %d more refusals not logged in the last %.0f s", self._dropped,
                                    self.window)
            self._start, self._count, self._dropped = now, 0, 0
        if self._count >= self.burst:
            self._dropped += 1
            return
        self._count += 1
        self.logger.warning("HA port: refused %s from %s: %s", what, peer, reason)


class WitnessLink(Protocol):
    """A node's link to its pair's witness, as status and console read it
    (:class:`.witness.WitnessClient`)."""

    @property
    def where(self) -> str: ...
    @property
    def state(self) -> str:
        """``up`` (it answered the last request), ``down`` or ``unknown`` (not asked yet)."""
        ...
    @property
    def last_reason(self) -> str: ...


class NodeReadout(Protocol):
    """What a node's status headers (:func:`status_headers`) and its console
    (:class:`.view.HaNodeView`) read of the node (:class:`.node.HaNode`)."""

    @property
    def name(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def ha_port(self) -> int: ...
    @property
    def data_dir(self) -> Path: ...
    @property
    def config(self) -> BrokerConfig: ...
    @property
    def opts(self) -> HaOptions: ...
    @property
    def role(self) -> str: ...
    @property
    def state(self) -> HaState: ...
    @property
    def takeovers(self) -> int: ...
    @property
    def listening(self) -> bool: ...
    @property
    def journal_damage(self) -> str: ...
    @property
    def http(self) -> HttpServer | None: ...
    @property
    def server(self) -> BrokerServer | None: ...
    @property
    def repl(self) -> ReplicationMaster | None: ...
    @property
    def slave_store(self) -> MessageStore | None: ...
    @property
    def master_address(self) -> str: ...
    @property
    def slave_synced(self) -> bool: ...
    @property
    def witness(self) -> WitnessLink | None: ...

    def lease_left(self) -> float | None:
        """A master with a witness: seconds its lease lasts by its own count (else None)."""
        ...

    def peer_addresses(self) -> list[tuple[str, int]]:
        """Every address the node knows for its peer."""
        ...

    def relaying(self) -> tuple[str, int, str] | None:
        """--relay-port: (the master's client address it relays to, connections relayed
        now, the relay's own ``HOST:PORT``) while the node relays (:mod:`.relay`), else None."""
        ...


class PortHost(NodeReadout, Protocol):
    """What answering HA requests reads and changes on the node (:class:`.node.HaNode`)."""

    @property
    def users(self) -> dict[str, str]: ...
    @property
    def verifier(self) -> RequestVerifier | None: ...

    @property
    def rules(self) -> DecideOptions: ...

    def decision_state(self, phase: Phase) -> NodeState:
        """What :func:`.decide.decide` reads of the node now."""
        ...

    def save_state(self) -> None:
        """Write ``ha-state.json``."""

    def demote(self) -> None:
        """Leave the master role (the role loop then decides again)."""

    def accepts_clients(self) -> bool:
        """A client's CONNECT may start a session now (the node serves, or its witness
        lease covers it while it is suspect)."""
        ...


def status_headers(node: NodeReadout) -> dict[str, str]:
    """The ``amq-ha-*`` headers of the ``CONNECTED`` answer to a status request (and of
    every other answer a node sends on its HA port)."""
    st: dict[str, str] = {
        "amq-ha-role": node.role,
        "amq-ha-mode": node.opts.mode,
        "amq-ha-name": node.name,
        "amq-ha-epoch": str(node.state.epoch),
        "amq-ha-synced": "true" if node.state.synced else "false",
        "amq-ha-last-role": node.state.role,
        "amq-ha-configured": "slave" if node.opts.master_connector else "master",
        "amq-ha-strict": "true" if node.opts.shutdown_on_slave_failure else "false",
        "amq-ha-client": f"{node.host}:{node.port}",
        "amq-ha-port": f"{node.host}:{node.ha_port}",
        "amq-ha-pid": str(os.getpid()),
        "amq-ha-listening": "true" if node.listening else "false",
        "amq-ha-damaged": "true" if node.journal_damage else "false",
    }
    if node.http is not None:
        st["amq-ha-http"] = node.http.address
    if node.witness is not None:
        st["amq-ha-witness"] = node.witness.where
        st["amq-ha-witness-state"] = node.witness.state
        left = node.lease_left()
        if left is not None:
            st["amq-ha-lease"] = f"{left:.1f}"
    relay = node.relaying()
    if relay is not None:
        st["amq-ha-relay"], st["amq-ha-relayed"], st["amq-ha-relay-port"] = relay[0], str(relay[1]), relay[2]
    if node.role == "master" and node.server is not None and node.server.store is not None:
        # messages, sent, queues, topics, connections, memory-*, uptime (no queue names)
        st.update(node.server.status_stats(names=False))
        repl = node.repl
        if repl is not None:
            st["amq-ha-seq"] = str(repl.seq)
            st["amq-ha-acked"] = str(repl.acked)
            st["amq-ha-held"] = str(repl.held)
            st["amq-ha-refused-receipts"] = str(repl.refused_receipts)
            if repl.suspect is not None:
                st["amq-ha-suspect"] = repl.suspect
            link = repl.link
            if link is None:
                st["amq-ha-peer"] = node.state.peer.get("client", "")
                st["amq-ha-peer-state"] = "none"
            else:
                st["amq-ha-peer"] = link.info.get("amq-ha-client", link.peer)
                st["amq-ha-peer-state"] = "in-sync" if link.synced else "syncing"
    elif node.slave_store is not None:
        st["amq-ha-messages"] = str(len(node.slave_store.live))
        st["amq-ha-peer"] = node.master_address
        st["amq-ha-peer-state"] = "in-sync" if node.slave_synced else "syncing"
    elif node.opts.mode == "shared-store":
        st["amq-ha-peer"] = str(node.data_dir / "ha.lock")
    return st


class HaRequests:
    """Answers the one request of an HA connection (see the module docstring)."""

    def __init__(self, node: PortHost) -> None:
        self.node = node
        self.refused = RefusalLog(log)
        self._tasks: set[asyncio.Task[None]] = set()

    def intercept_connect(self, conn: HookedConnection, frame: Frame) -> bool:
        """The master's :class:`~..context.ConnectHook`, called by the client-port STOMP
        handler for every CONNECT frame: HA requests are handed to :meth:`handle`; while
        the master is suspect (it may have been replaced while frozen) a client's CONNECT
        is refused, so no client starts a session on a node that may be about to step down
        -- unless its own witness lease still runs (the peer cannot be master before it
        ends: ``accepts_clients``; the session's receipts wait for the decision).
        A stall is checked first: a CONNECT read right after a freeze must not be answered
        before the node notices that it was frozen."""
        repl = self.node.repl
        if repl is not None:
            repl.check_stall()
        is_request = frame.get(STATUS_HEADER) is not None or any(frame.get(h) is not None for h in ROLE_REQUESTS)
        if not is_request and self.node.accepts_clients():
            return False
        transport = conn.detach()  # the HA code owns this socket from now on
        if transport is None:
            return True
        if is_request:
            self.handle(transport, frame, conn.peer)
        else:
            answer_error(transport, f"node {self.node.name} is not accepting clients right now: it is checking "
                                    "whether its peer took over; retry (or fail over)")
        return True

    def handle(self, transport: asyncio.Transport, frame: Frame, peer: str) -> None:
        """Answer the one CONNECT ``frame`` of an HA connection (either port) from ``peer``."""
        if frame.command not in ("CONNECT", "STOMP"):
            self.refused(peer, f"a {frame.command} frame", "expected CONNECT")
            answer_error(transport, f"expected CONNECT on the HA port of node {self.node.name}, got {frame.command}")
            return
        request = next((h for h in ROLE_REQUESTS if frame.get(h) is not None), None)
        if request is not None:
            what = f"{REQUEST_NAMES[request]} from node {frame.get(request)!r}"
            reason = self._check(request, frame)
            if reason is not None:
                self.refused(peer, what, reason)
                answer_error(transport, f"{REQUEST_NAMES[request]} refused by node {self.node.name}: {reason}")
                return
            if request == REPLICA_HEADER:
                self._replica(transport, frame, peer)
            elif request == DEMOTE_HEADER:
                task = asyncio.get_running_loop().create_task(self._demote(transport, frame, peer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif request == STANDBY_HEADER:
                self._standby(transport, frame)
            else:
                self._release(transport, frame, peer)
            return
        if frame.get(STATUS_HEADER) is not None:
            headers = status_headers(self.node)
            if self.node.verifier is not None:  # what a signed request must answer next (auth.py)
                headers[CHALLENGE_HEADER] = self.node.verifier.challenge(time.monotonic())
            answer = Frame.make("CONNECTED", [("version", "1.2"), *headers.items()])
            transport.write(serialize(answer))
            transport.close()
            return
        answer_error(transport, f"this is the HA port of node {self.node.name}; clients connect to tcp://{self.node.host}:{self.node.port}")

    def _check(self, request: str, frame: Frame) -> str | None:
        """Why a role-changing request must be refused (None: it is authentic and from our peer)."""
        if self.node.verifier is None:
            return f"node {self.node.name} is in a {self.node.opts.mode} pair (no replication requests)"
        signed = {h: v for h in (request, AUTH_HEADER, *SIGNED_HEADERS) if (v := frame.get(h)) is not None}
        reason = self.node.verifier.check(request, signed, time.monotonic())
        if reason is not None:
            return reason
        who = frame.get(request) or ""
        if who == self.node.name:
            return f"the request claims to come from node {who!r}, which is this node"
        epoch = frame.get("amq-ha-epoch") or ""
        if not epoch.isdigit():
            return f"bad amq-ha-epoch {epoch!r}"
        known = self.node.state.peer.get("name")
        if request in (DEMOTE_HEADER, STANDBY_HEADER) and known and who != known:
            return f"node {who!r} is not this node's peer ({known!r})"
        return None

    def _authorized(self, transport: asyncio.Transport, frame: Frame, what: str, peer: str) -> bool:
        """The users-file check of a replication link (ActiveMQ's master connector credentials)."""
        if not self.node.users:
            return True
        login = frame.get("login")
        if not check_login(self.node.users, login, frame.get("passcode")):
            log.error(
                "%s refused: bad credentials for login %r "
                "(the peer's --master-user/--master-password must be a user of this broker)", what, login,
            )
            self.refused(peer, what, f"bad credentials for login {login!r}")
            answer_error(transport, f"{what.split(' ')[0]} refused: authentication failed: bad login or passcode")
            return False
        return True

    async def _demote(self, transport: asyncio.Transport, frame: Frame, peer: str) -> None:
        """A master with a newer epoch asks us (a stale master) to step down. Accepted only
        when we are master, its epoch is strictly newer than ours, and its own HA port
        confirms that it is master at that epoch."""
        who = frame.get(DEMOTE_HEADER) or "?"
        what = f"demote request from node {who!r}"
        theirs = int(frame.get("amq-ha-epoch") or 0)
        ours = self.node.state.epoch
        reason = None
        if self.node.role != "master":
            reason = f"node {self.node.name} is not master (role {self.node.role})"
        elif theirs <= ours:
            reason = f"its epoch {theirs} is not newer than ours ({ours})"
        else:
            try:
                where = parse_address(frame.get("amq-ha-port") or "", "amq-ha-port")
            except ConfigError as exc:
                reason = str(exc)
            else:
                info = await probe(*where, timeout=min(1.0, self.node.opts.link_timeout))
                if info is None:
                    reason = f"its HA port {where[0]}:{where[1]} does not answer"
                elif (info.get("amq-ha-role"), info.get("amq-ha-name"), info.get("amq-ha-epoch")) != (
                    "master", who, str(theirs)
                ):
                    reason = (f"its HA port {where[0]}:{where[1]} says node {info.get('amq-ha-name')!r} is "
                              f"{info.get('amq-ha-role')} at epoch {info.get('amq-ha-epoch')}, not master at {theirs}")
        if reason is None and (self.node.role != "master" or self.node.state.epoch != ours):
            reason = "this node changed role meanwhile"
        if reason is not None:
            self.refused(peer, what, reason)
            answer_error(transport, f"not demoting: {reason}")
            return
        log.error(
            "node %s: master %s at epoch %d > ours %d asks us to step down (split brain or a wiped "
            "store): demoting to slave and resyncing from it", self.node.name, who, theirs, ours,
        )
        self.node.state.peer = {k: v for k, h in (("client", "amq-ha-client"), ("ha", "amq-ha-port"))
                           if (v := frame.get(h) or "")}
        self.node.state.peer["name"] = who
        self.node.state.peer_may_be_master = True
        self.node.save_state()
        transport.write(serialize(Frame.make("CONNECTED", [("version", "1.2"), *status_headers(self.node).items()])))
        transport.close()
        self.node.demote()

    def _replica(self, transport: asyncio.Transport, frame: Frame, peer: str) -> None:
        slave = frame.get(REPLICA_HEADER) or "?"
        what = f"replication link from slave {slave} ({peer})"
        if not self._authorized(transport, frame, what, peer):
            return
        reason = None
        theirs = int(frame.get("amq-ha-epoch") or 0)
        link = self.node.repl.link if self.node.repl is not None else None
        if self.node.role != "master" or self.node.repl is None:
            reason = f"node {self.node.name} is not the master (role {self.node.role})"
        elif theirs > self.node.state.epoch:
            reason = (f"the slave's store has epoch {theirs}, newer than ours ({self.node.state.epoch}): "
                      "it must not be overwritten by ours")
            log.error("node %s: %s refused: %s", self.node.name, what, reason)
        elif link is not None and link.synced and link.slave != slave:
            reason = f"slave {link.slave} is attached and in sync"
        if reason is not None:
            self.refused(peer, what, reason)
            answer_error(transport, f"replication refused: {reason}")
            return
        assert self.node.repl is not None
        info = dict(frame.headers)
        answer = serialize(Frame.make("CONNECTED", [("version", "1.2"), *status_headers(self.node).items()]))
        self.node.repl.attach(transport, slave, answer, info)

    def _standby(self, transport: asyncio.Transport, frame: Frame) -> None:
        """Our peer is master, lost us (or froze) and asks us to stand by before it
        receipts alone. Agreeing means: this store is no longer a complete copy, so we
        never take over before resyncing from it (the rule: :func:`.decide.standby`).
        This runs on the loop, like the takeover decision (which reads ``state.synced``
        after its last await and raises the epoch with nothing awaited in between), so
        the two cannot interleave."""
        node = self.node
        who = frame.get(STANDBY_HEADER) or "?"
        theirs = int(frame.get("amq-ha-epoch") or 0)
        d = standby(node.decision_state(STAND_BY), node.rules, who, theirs)
        if d.action == OK_UNSYNCED:
            node.state.synced = False
            node.save_state()
            log.warning(
                "node %s: master %s (epoch %d) is alive and goes on without us: this store is no longer "
                "a complete copy; it will not take over before it has resynced", node.name, who, theirs,
            )
        answer = OK if d.action == OK_UNSYNCED else d.action
        headers = [("version", "1.2"), *status_headers(node).items(), (STANDBY_ANSWER, answer), (STANDBY_REASON, d.reason)]
        transport.write(serialize(Frame.make("CONNECTED", headers)))
        transport.close()

    def _release(self, transport: asyncio.Transport, frame: Frame, peer: str) -> None:
        """An operator (``amq broker release``, signed with the cluster secret) says the
        peer is gone for good -- its host is dead, so it can neither answer nor refuse:
        a suspect master receipts alone again. If the peer is in fact alive and took
        over, this makes two masters; that is the operator's call."""
        repl = self.node.repl
        if self.node.role != "master" or repl is None or repl.suspect is None:
            self.refused(peer, "release request", f"node {self.node.name} holds no receipts (role {self.node.role})")
            answer_error(transport, f"node {self.node.name} is not holding receipts for a peer check (role {self.node.role})")
            return
        log.warning("node %s: an operator at %s (%s) released the receipts held since: %s", self.node.name, peer,
                    frame.get(RELEASE_HEADER), repl.suspect)
        repl.clear_suspect(f"released by an operator from {peer}: the peer was declared gone")
        transport.write(serialize(Frame.make("CONNECTED", [("version", "1.2"), *status_headers(self.node).items()])))
        transport.close()


class RequestHandler(Protocol):
    """What answers the one request of a connection (:class:`HaRequests`; the witness's
    :class:`.witness.Witness`)."""

    refused: RefusalLog

    def handle(self, transport: asyncio.Transport, frame: Frame, peer: str) -> None: ...


class HaPortProtocol(asyncio.Protocol):
    """One connection to the HA port (or a witness port), until its request is handed on."""

    def __init__(self, requests: RequestHandler, limits: HaPortLimits, waiting: set[HaPortProtocol]) -> None:
        self.requests = requests
        self.limits = limits
        self.waiting = waiting
        self.session = ServerSession(
            Limits(max_frame_size=limits.max_frame, max_headers=64, max_header_line=min(8192, limits.max_frame))
        )
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        p = transport.get_extra_info("peername")
        self.peer = f"{p[0]}:{p[1]}" if isinstance(p, tuple) else str(p)
        if len(self.waiting) >= self.limits.max_connections:
            self.requests.refused(self.peer, "a connection",
                              f"{len(self.waiting)} connections already wait for their request (limit)")
            answer_error(transport, "too many connections to the HA port")
            return
        self.waiting.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.limits.idle_timeout, self._idle)

    def _idle(self) -> None:
        self._timer = None
        if self.transport is not None and self in self.waiting:
            self.requests.refused(self.peer, "a connection", f"no request within {self.limits.idle_timeout:g} s")
            self._done()
            answer_error(self.transport, f"no CONNECT frame within {self.limits.idle_timeout:g} s")

    def _done(self) -> None:
        self.waiting.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self not in self.waiting:
            return
        try:
            event = self.session.feed(data)
        except Exception as exc:  # noqa: BLE001 - garbage on the HA port: answer and close
            self.requests.refused(self.peer, "a frame", f"malformed: {exc}")
            self._done()
            answer_error(self.transport, f"malformed frame on the HA port: {exc}")
            return
        if event is None:
            return
        self._done()
        self.transport.pause_reading()
        self.requests.handle(self.transport, event, self.peer)


def answer_error(transport: asyncio.Transport, message: str) -> None:
    frame = Frame.make("ERROR", [("message", message.replace("\n", " "))], message)
    transport.write(serialize(frame))
    transport.close()


