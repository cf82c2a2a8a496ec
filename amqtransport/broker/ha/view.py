"""The operator's view of an HA node (:class:`~..view.NodeView` for the HTTP side port).

A node of a pair serves clients only while it is master: then its
:class:`~..server.BrokerServer` exists and the view reports what a plain broker
reports (:func:`~..view.serving_stats`) plus the replication link (the slave's
state, lag in records and bytes). As a slave it reports its role, epoch, master and
the replica it holds; it hands out no admin operations (an action would change a
copy that the next record from the master overwrites). The other node is described
by its own answer to a status request on its HA port (:func:`.wire.probe`:
public counters, no login), cached for a second so that several open consoles cost
one probe. A replicated node finds that port among the addresses it knows for its
peer; a shared-store node in the directory where the nodes of its store announce
themselves (:func:`.shared.known_nodes`: every other node, each its own card). The view reads the node through :class:`.port.NodeReadout` and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import TYPE_CHECKING

from amqtransport.errors import ConfigError

from ..ops.admin import BrokerAdmin, ServerAdmin
from ..ops.view import (
    NodeStats,
    PeerStatus,
    ReplicationStats,
    WitnessStats,
    journal_stats,
    serving_stats,
)
from .config import parse_address
from .port import NodeReadout
from .shared import known_nodes
from .wire import probe

if TYPE_CHECKING:
    from ..server import BrokerServer

__all__ = ["HaNodeView"]

PEER_CACHE_SECONDS = 1.0
PEER_TIMEOUT = 0.5
REPLICA_DETAIL_MAX = 50_000  # live messages above which a slave does not count them per destination

WHY_NOT_READY = {
    "slave": "it is the slave, holding a copy of the master's store, and takes over if the master is lost",
    "waiting": "waiting to become master or slave",
    "fenced": "fenced: it left the master role",
    "cold-backup": "cold backup: stopped after its master was lost",
    "starting": "starting",
}


SHARED_STANDBY = ("it is the standby of a shared store, waiting for the store lock, and takes over "
                  "when the master releases it")


def _int(info: dict[str, str], key: str) -> int | None:
    value = info.get(key, "")
    return int(value) if value.isdigit() else None


def _peer(address: str, info: dict[str, str]) -> PeerStatus:
    """A node as its answer to a status request describes it."""
    seq, acked = _int(info, "amq-ha-seq"), _int(info, "amq-ha-acked")
    role = info.get("amq-ha-role", "?")
    peer_state = info.get("amq-ha-peer-state", "")
    if info.get("amq-ha-mode") == "shared-store" and role == "slave":
        peer_state = "waiting for the store lock"
    return PeerStatus(
        address=address, reachable=True, name=info.get("amq-ha-name", ""),
        role=role, epoch=_int(info, "amq-ha-epoch") or 0,
        peer_state=peer_state, client=info.get("amq-ha-client", ""),
        http=info.get("amq-ha-http", ""), messages=_int(info, "amq-ha-messages"),
        connections=_int(info, "amq-ha-connections"),
        lag_records=(seq - acked) if seq is not None and acked is not None and
        info.get("amq-ha-peer-state") == "in-sync" else None,
    )


class HaNodeView:
    def __init__(self, node: NodeReadout) -> None:
        self.node = node
        self.http_address = ""
        self._started = time.monotonic()
        self._admin: tuple[BrokerServer, BrokerAdmin] | None = None
        self._peers: tuple[float, list[PeerStatus]] | None = None
        self._probing: asyncio.Task[list[PeerStatus]] | None = None

    def _master_server(self) -> BrokerServer | None:
        node = self.node
        server = node.server
        if node.role != "master" or server is None or server.core is None:
            return None
        return server

    def stats(self) -> NodeStats:
        node = self.node
        base: dict[str, object] = {
            "name": node.name, "role": node.role, "mode": node.opts.mode, "epoch": node.state.epoch,
            "pid": os.getpid(), "uptime": time.monotonic() - self._started, "http": self.http_address,
            "client": f"{node.host}:{node.port}", "takeovers": node.takeovers,
            "extra": {"ha_port": f"{node.host}:{node.ha_port}"},
        }
        if node.witness is not None:
            base["witness"] = WitnessStats(address=node.witness.where, state=node.witness.state,
                                           last_answer=node.witness.last_reason, lease_seconds=node.lease_left())
        server = self._master_server()
        if server is not None:
            base.update(serving_stats(server, node.config.http_ready_flow_control_seconds))
            repl = node.repl
            if repl is not None:
                link = repl.link
                lag = repl.lag
                base["replication"] = ReplicationStats(
                    peer=(link.info.get("amq-ha-client", link.peer) if link is not None
                          else node.state.peer.get("client", "")),
                    peer_state="none" if link is None else "in-sync" if link.synced else "syncing",
                    seq=repl.seq, acked=repl.acked,
                    lag_records=lag[0] if lag is not None else None,
                    lag_bytes=lag[1] if lag is not None else None,
                )
            return NodeStats(**base)  # type: ignore[arg-type]
        why = WHY_NOT_READY.get(node.role, node.role)
        if node.role == "slave" and node.opts.mode == "shared-store":
            why = SHARED_STANDBY
        if node.role == "master":
            why = "master, but its broker is not open yet"
        base.update(serving=False, ready=False, ready_reason=why)
        relay = node.relaying()
        if node.opts.relay_port is not None:
            base["relayed_connections"] = relay[1] if relay is not None else 0
        store = node.slave_store
        if store is not None:
            base["journal"] = journal_stats(store)
            base["detail"] = f"replicating from {node.master_address}" if node.master_address else ""
            if len(store.live) <= REPLICA_DETAIL_MAX:
                counts: dict[str, int] = {}
                for m in store.live.values():
                    counts[m.destination] = counts.get(m.destination, 0) + 1
                base["replica"] = tuple(sorted(counts.items()))
        if relay is not None:
            relaying = f"relaying clients on {relay[2]} to the master at {relay[0]}"
            base["detail"] = f"{base['detail']}; {relaying}" if base.get("detail") else relaying
        return NodeStats(**base)  # type: ignore[arg-type]

    def admin(self) -> BrokerAdmin | None:
        server = self._master_server()
        if server is None or not server.serving:
            return None
        if self._admin is None or self._admin[0] is not server:
            self._admin = (server, ServerAdmin(server))
        return self._admin[1]

    async def peers(self) -> list[PeerStatus]:
        cached = self._peers
        if cached is not None and time.monotonic() - cached[0] < PEER_CACHE_SECONDS:
            return cached[1]
        if self._probing is None or self._probing.done():
            self._probing = asyncio.get_running_loop().create_task(self._probe())
        return await asyncio.shield(self._probing)

    async def _probe(self) -> list[PeerStatus]:
        found = await (self._probe_shared() if self.node.opts.mode == "shared-store" else self._probe_replicated())
        self._peers = (time.monotonic(), found)
        return found

    async def _probe_replicated(self) -> list[PeerStatus]:
        """The peer, at the first of its known addresses that answers."""
        first = ""
        for host, port in self.node.peer_addresses():
            info = await probe(host, port, PEER_TIMEOUT)
            first = first or f"{host}:{port}"
            if info is not None:
                return [_peer(f"{host}:{port}", info)]  # one answer describes the peer
        if not first:
            return []
        return [PeerStatus(address=first, reachable=False, name=self.node.state.peer.get("name", ""), role="down")]

    async def _probe_shared(self) -> list[PeerStatus]:
        """Every other node announced on the shared store; one that does not answer (or
        whose port now answers with another name) is shown as down."""
        node = self.node
        own = {f"{node.host}:{node.ha_port}", f"{node.host}:{node.port}"}
        found: list[PeerStatus] = []
        for other in known_nodes(node.data_dir, exclude=node.name):
            if other.ha in own:
                continue
            info = None
            with contextlib.suppress(ConfigError):
                info = await probe(*parse_address(other.ha), PEER_TIMEOUT)
            if info is not None and info.get("amq-ha-name") == other.name:
                found.append(_peer(other.ha, info))
            else:
                found.append(PeerStatus(address=other.ha, reachable=False, name=other.name, role="down",
                                        client=other.client))
        return found
