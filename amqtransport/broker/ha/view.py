"""The operator's view of an HA node (:class:`~..view.NodeView` for the HTTP side port).

A node of a pair serves clients only while it is master: then its
:class:`~..server.BrokerServer` exists and the view reports what a plain broker
reports (:func:`~..view.serving_stats`) plus the replication link (the slave's
state, lag in records and bytes). As a slave it reports its role, epoch, master and
the replica it holds; it hands out no admin operations (an action would change a
copy that the next record from the master overwrites). The other node is described
by its own answer to a status request on its HA port (:func:`.wire.probe`:
public counters, no login), cached for a second so that several open consoles cost
one probe. The view reads the node through :class:`.port.NodeReadout` and changes nothing.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING

from ..admin import BrokerAdmin, ServerAdmin
from ..view import NodeStats, PeerStatus, ReplicationStats, journal_stats, serving_stats
from .port import NodeReadout
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


def _int(info: dict[str, str], key: str) -> int | None:
    value = info.get(key, "")
    return int(value) if value.isdigit() else None


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
        if node.role == "master":
            why = "master, but its broker is not open yet"
        base.update(serving=False, ready=False, ready_reason=why)
        store = node.slave_store
        if store is not None:
            base["journal"] = journal_stats(store)
            base["detail"] = f"replicating from {node.master_address}" if node.master_address else ""
            if len(store.live) <= REPLICA_DETAIL_MAX:
                counts: dict[str, int] = {}
                for m in store.live.values():
                    counts[m.destination] = counts.get(m.destination, 0) + 1
                base["replica"] = tuple(sorted(counts.items()))
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
        addresses = self.node.peer_addresses()
        found: list[PeerStatus] = []
        first = ""
        for host, port in addresses:
            info = await probe(host, port, PEER_TIMEOUT)
            first = first or f"{host}:{port}"
            if info is None:
                continue
            seq, acked = _int(info, "amq-ha-seq"), _int(info, "amq-ha-acked")
            found.append(PeerStatus(
                address=f"{host}:{port}", reachable=True, name=info.get("amq-ha-name", ""),
                role=info.get("amq-ha-role", "?"), epoch=_int(info, "amq-ha-epoch") or 0,
                peer_state=info.get("amq-ha-peer-state", ""), client=info.get("amq-ha-client", ""),
                http=info.get("amq-ha-http", ""), messages=_int(info, "amq-ha-messages"),
                connections=_int(info, "amq-ha-connections"),
                lag_records=(seq - acked) if seq is not None and acked is not None and
                info.get("amq-ha-peer-state") == "in-sync" else None,
            ))
            break  # one answer describes the peer
        if not found and first:
            name = self.node.state.peer.get("name", "")
            found.append(PeerStatus(address=first, reachable=False, name=name, role="down"))
        self._peers = (time.monotonic(), found)
        return found
