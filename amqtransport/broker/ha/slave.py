"""The node's slave side of a replication pair: the handshake, the replica's store, and
what follows a lost link (the link itself is :mod:`.slave_link`, the theory :mod:`.replication`).

Theory of operation
-------------------
A slave connects (:func:`serve_slave`), wipes its store, and runs the
replication link's slave side (:class:`SlaveLink`: import the snapshot, ack,
then append, ack and apply every record). It starts no client connector. Its store counts as
a complete copy (``synced`` in ``ha-state.json``) from the end of the full sync until
it leaves with a goodbye or agrees to stand by; the takeover decision reads that flag
after its last await and raises the epoch with nothing awaited in between. When the
link breaks after it was in sync, ``--shutdown-on-master-failure`` makes it stop (a
cold backup holding a complete copy); otherwise it takes over only if the master is
unreachable on *every* address it knows (master connector, master client port, master
HA port) -- without a witness, at two probes :attr:`~.decide.DecideOptions.confirm_delay`
apart (a live master's ports may refuse for a moment: decide.py, "Refusals") -- *and*
the ``--takeover-check`` address (host:port, both nodes must be able to
reach it: the clients' gateway, a load balancer, a third host) answers a TCP connect,
and, with ``--witness``, the witness grants it mastership (:mod:`.witness`: only once the
master's lease ran out, and never when the master last said it receipted alone).

With ``--relay-port`` the slave relays clients to the master's client address (its
handshake's ``amq-ha-client``) while the link is up, and stops as the link ends, before
anything is decided (:mod:`.relay`).

What the node does after a loss is decided by :func:`.decide.decide` (phase
``link-lost``). :func:`serve_slave` reads and changes the node only through :class:`SlaveHost`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from ..config import BrokerConfig
from ..store import Callback, MessageStore, run_completions
from ..store.salvage import quarantine_journal
from .auth import RequestVerifier, new_challenge
from .decide import COLD_BACKUP, ISOLATED, LINK_LOST, RELINK, RETRY, says_master
from .host import RoleHost
from .relay import upstream_of
from .slave_link import SlaveLink
from .wire import (
    HANDOVER_HEADER,
    LINK_CHALLENGE_HEADER,
    REPLICA_HEADER,
    ReplicaRefused,
    ReplicationError,
    ask_peer,
    ha_request,
)

__all__ = ["SlaveHost", "SlaveLink", "fresh_replica_store", "handover_refusal", "link_lost_probe_timeout",
           "serve_slave"]

log = logging.getLogger(__name__)


def fresh_replica_store(data_dir: Path, config: BrokerConfig, loop: asyncio.AbstractEventLoop) -> MessageStore:
    """Wipe ``data_dir/journal`` and open an empty store there for a full sync; its
    journal completions run on ``loop``."""
    shutil.rmtree(data_dir / "journal", ignore_errors=True)

    def notify(items: list[tuple[Callback, BaseException | None]]) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(run_completions, items, time.perf_counter())

    store = MessageStore(
        data_dir / "journal",
        segment_size=config.segment_size,
        fsync=config.fsync,
        dedupe_max_keys=config.dedupe_window_size,
        dedupe_max_age=config.dedupe_window_seconds,
        notify=notify,
    )
    store.open()
    return store


def handover_refusal(verifier: RequestVerifier, headers: Mapping[str, str], challenge: str, master: str,
                     epoch: int, now: float) -> str | None:
    """Why the ``HANDOVER`` ``headers`` read on a link must not be acted on (None: it is
    authentic): signed with the cluster secret against this link's ``challenge``, from
    the link's ``master``, at the ``epoch`` the link synced at."""
    reason = verifier.check(HANDOVER_HEADER, headers, now, challenge=challenge)
    if reason is not None:
        return reason
    if headers.get(HANDOVER_HEADER) != master:
        return f"it comes from node {headers.get(HANDOVER_HEADER)!r}, not from this link's master {master!r}"
    if headers.get("amq-ha-epoch") != str(epoch):
        return f"its epoch {headers.get('amq-ha-epoch')!r} is not the link's ({epoch})"
    return None


class SlaveHost(RoleHost, Protocol):
    """What the slave's side of the role loop reads and changes on the node (:class:`.node.HaNode`)."""

    master_address: str
    slave_link: SlaveLink | None
    slave_store: MessageStore | None
    waiting_reason: str
    takeovers: int
    store_failures: int  # the replica's store failed this many times in a row (back-off)
    verifier: RequestVerifier | None  # checks the master's handover (the cluster secret)

    @property
    def stop_event(self) -> asyncio.Event: ...

    def set_waiting(self, reason: str) -> None:
        """Take the role ``waiting`` (said once per reason)."""

    async def sleep(self, seconds: float) -> None:
        """Sleep, or end the role loop if the node stops meanwhile."""

    def close_slave_store(self) -> None:
        """Close the replica's store, if open."""

    async def relay_clients_to(self, master: str, upstream: tuple[str, int]) -> None:
        """Relay clients to the master's client address (--relay-port; else nothing)."""

    def stop_relaying(self, why: str) -> None:
        """Relay no more: close the relay port and every relayed connection."""


async def serve_slave(node: SlaveHost, addr: tuple[str, int]) -> str:
    """Replicate from the master at ``addr``; returns the next action."""
    challenge = new_challenge()  # the master's handover on this link must answer it (auth.py)
    request = node.request_headers(REPLICA_HEADER)
    headers = dataclasses.replace(request, headers={**request.headers, LINK_CHALLENGE_HEADER: challenge})
    where = f"tcp://{addr[0]}:{addr[1]}"
    try:
        answer, reader, writer = await ha_request(*addr, headers, timeout=max(1.0, node.opts.link_timeout))
    except ReplicaRefused as exc:
        log.error(
            "replication link to master %s refused by the master: %s "
            "(check the cluster secret and --master-user/--master-password)", where, exc,
        )
        node.set_waiting(f"refused by master {where}: {exc}")
        await node.sleep(2.0)
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
    node.master_address = info.get("amq-ha-client", where)
    node.state.peer = {k: info[h] for k, h in (("client", "amq-ha-client"), ("ha", "amq-ha-port"),
                                               ("name", "amq-ha-name")) if h in info}
    node.state.master_strict = info.get("amq-ha-strict") == "true"
    node.waiting_reason = ""
    node.set_role("slave", f"of {where} (master {info.get('amq-ha-name')} epoch {master_epoch})")
    # a full sync starts from nothing: until the snapshot is durable we are not a copy
    node.state.synced = False
    node.state.role = "slave"
    node.state.save(node.data_dir)
    node.slave_link = None
    node.close_slave_store()
    assert node.loop is not None
    if node.journal_damage:  # never destroy what could be read: the damaged journal is kept aside
        kept = quarantine_journal(node.data_dir)
        log.warning("node %s: resyncing from master %s over a damaged journal (%s); it is kept in %s",
                    node.name, info.get("amq-ha-name"), node.journal_damage, kept)
    store = fresh_replica_store(node.data_dir, node.config, node.loop)
    node.slave_store = store
    node.journal_damage = ""  # the damaged journal is gone: what comes now is the master's copy

    def synced() -> None:
        node.state.epoch = master_epoch
        node.state.synced = True
        node.state.role = "slave"
        node.state.save(node.data_dir)
        node.store_failures = 0
        node.say(f"synced {len(store.live)} messages at epoch {master_epoch}")

    def check_handover(headers: Mapping[str, str]) -> str | None:
        if node.verifier is None:
            return "this node has no cluster secret"
        return handover_refusal(node.verifier, headers, challenge, info.get("amq-ha-name", "?"), master_epoch,
                                time.monotonic())

    link = node.slave_link = SlaveLink(store, reader, writer, link_timeout=node.opts.link_timeout,
                                       on_synced=synced, check_handover=check_handover)
    master_name = info.get("amq-ha-name", "?")
    upstream = upstream_of(info.get("amq-ha-client", ""), addr[0])
    outcome = "ended"
    try:
        if upstream is not None:
            await node.relay_clients_to(master_name, upstream)
        outcome = await link.run(node.stop_event)
    finally:
        node.stop_relaying(f"the replication link to master {master_name} ended ({outcome})")
    if store.journal.failed is not None:
        outcome = "failed"
    if outcome == "failed":
        writer.close()
        return await _after_store_failure(node, store)
    if outcome == "stop" and node.state.synced:
        # the master goes on without us after a goodbye: this copy is stale from
        # its next receipt on, so it must resync before it could serve
        node.state.synced = False
        node.state.save(node.data_dir)
    writer.close()
    if outcome == "stop":
        return "stop"
    return await _after_master_loss(node, addr, where)


async def _after_store_failure(node: SlaveHost, store: MessageStore) -> str:
    """The replica's journal failed: never a complete copy again; resync after a back-off
    (1 s, doubling up to 30 s while it fails again before a sync completes)."""
    node.state.synced = False
    try:
        node.state.save(node.data_dir)
    except OSError as exc:
        log.error("node %s: cannot record that its store is not a copy any more: %s", node.name, exc)
    node.slave_link = None
    node.close_slave_store()
    node.set_waiting(f"its store failed ({store.journal.failed}); resyncing from the master")
    node.store_failures += 1
    await node.sleep(min(30.0, 2.0 ** (node.store_failures - 1)))
    return "decide"


async def _after_master_loss(node: SlaveHost, addr: tuple[str, int], where: str) -> str:
    """The link to the master at ``addr`` is gone: take over, or not (decide.py,
    phase ``link-lost``); returns the next action."""
    candidates = [addr] + [a for a in node.peer_addresses() if a != addr]
    isolated = False
    timeout = link_lost_probe_timeout(node.opts.link_timeout, witness=bool(node.opts.witness))
    while not node.stopping:
        d = await node.decide_observing(lambda: node.decision_state(LINK_LOST), lambda: ask_peer(
            candidates, None, timeout, until=lambda a: says_master(a.info)
        ))
        if d.action == RETRY:
            log.warning("replication link to %s lost: %s", where, d.reason)
            return "wait"
        if d.action == COLD_BACKUP:
            log.warning("node %s: master %s lost; %s", node.name, where, d.reason)
            node.close_slave_store()
            node.set_role("cold-backup", f"store {node.data_dir}")
            return "stop"
        if d.action == RELINK:
            log.warning("node %s: %s", node.name, d.reason)
            node.set_role("slave", "link lost; master alive; re-linking")
            await node.sleep(max(node.opts.lock_interval, 0.2))
            return "decide"
        if d.action == ISOLATED:
            if not isolated:
                log.error("node %s: %s", node.name, d.reason)
                node.set_role("slave", "isolated: master unreachable; " + (
                    "the witness does not grant mastership yet" if "witness" in d.reason
                    else "takeover check unreachable"))
            isolated = True
            await node.sleep(max(node.opts.lock_interval, 0.2))
            continue
        log.warning("node %s: master %s:%d lost: taking over (%s)", node.name, *addr, d.reason)
        node.close_slave_store()
        node.takeovers += 1
        return "master"
    return "stop"


def link_lost_probe_timeout(link_timeout: float, *, witness: bool) -> float:
    """How long a slave that lost its link waits for its master's addresses to answer a
    status probe: ``min(1 s, --link-timeout)``, halved with a witness. Without one a
    refusal on every address is the proof of a dead master, so a slow master must have
    time to answer; with one only the witness's grant lets the slave take over, and the
    probe only finds a live master to re-link to (one that answers within milliseconds
    unless it is frozen or cut off, and then the witness grants once its lease ran out).
    A silent master's probe lasted as long as its lease had left (issue 24)."""
    timeout = min(1.0, link_timeout)
    return timeout / 2 if witness else timeout

