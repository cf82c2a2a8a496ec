"""The operator's seam: what the HTTP side port may read from a node, and may ask it to do.

Theory of operation
-------------------
The HTTP side port (``amqtransport/broker/http/``) never reaches into the broker's
objects. It talks to a :class:`NodeView`, which answers with immutable snapshots
(:class:`NodeStats`, :class:`DestinationStats`, :class:`PeerStatus`) taken on the
event loop in one go, and hands out a :class:`~.admin.BrokerAdmin` -- the operations
that change state (purge, move, delete, send, close a connection) -- only while the
node serves clients. Two views implement it: :class:`ServerView` here, for a plain
``amq broker run`` (role ``standalone``), and ``HaNodeView`` in
``amqtransport/broker/ha/view.py``, for a node of a pair, whose
:class:`~.server.BrokerServer` exists only while it is master.

Everything that describes a serving broker (destinations, connections, memory, store,
journal, readiness) is computed once, here, from a ``BrokerServer`` by
:func:`serving_stats`; the HA view adds role, epoch, peer and replication lag to it.

Readiness (``/readyz``). A node is ready when it serves clients: its client port is
bound and accepting, its journal has not failed (the broker has not fenced itself),
and producer flow control -- the memory limit's or the store limit's -- has not held
for ``http_ready_flow_control_seconds`` in a row (a broker that cannot take a message
for that long is as good as down to a producer; the orchestrator should route
elsewhere). Readiness is computed at each
request from that live state, so a slave that takes over is ready as soon as its
client port accepts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from amqtransport.destinations import QUEUE_PREFIX, TOPIC_PREFIX

from ..dispatch.names import DURABLE_PREFIX, dead_letter_name
from .stats import RECEIPT_PATH, HistogramSnapshot

if TYPE_CHECKING:
    from ..server import BrokerServer
    from ..store import MessageStore
    from .admin import BrokerAdmin

__all__ = [
    "DestinationStats",
    "JournalStats",
    "MemoryStats",
    "NodeStats",
    "NodeView",
    "PeerStatus",
    "ReplicationStats",
    "ServerView",
    "journal_stats",
    "readiness",
    "serving_stats",
]

ROLES = ("standalone", "master", "slave", "waiting", "fenced", "cold-backup", "starting")


@dataclass(frozen=True)
class DestinationStats:
    """One destination. ``kind`` is ``queue``, ``topic`` or ``durable`` (a durable topic
    subscription's queue); ``name`` is what labels and URLs use (``orders`` for
    ``/queue/orders``; the whole key for the others)."""

    kind: str
    name: str
    key: str
    depth: int
    enqueued: int
    dequeued: int
    consumers: int
    in_flight: int
    expired: int = 0
    memory: int = 0
    is_dlq: bool = False
    dlq: str | None = None  # the queue's dead-letter queue (its name)
    dlq_depth: int = 0
    durable_subscriptions: int = 0  # topics


@dataclass(frozen=True)
class MemoryStats:
    usage: int
    limit: int
    peak: int
    transactions: int
    flow_control: bool
    flow_control_seconds: float  # how long the global flag has held (0 when off)
    engaged: int
    blocked_producers: int
    preauth: int = 0  # of usage: bytes buffered by connections not logged in yet


@dataclass(frozen=True)
class JournalStats:
    records: int
    batches: int
    bytes_written: int
    segments: int
    messages: int  # live persistent messages in the store
    size: int  # bytes of segments on disk
    limit: int  # store_limit (0: none)
    flow_control: bool
    failed: str | None
    fsync: HistogramSnapshot
    batch: HistogramSnapshot
    flow_control_seconds: float = 0.0  # how long the store limit has held (0 when off)
    failing: str | None = None  # why a background storage task's last attempt failed (a checkpoint)
    task_failures: tuple[tuple[str, int], ...] = ()  # (task, failed attempts): checkpoint, compaction
    damaged_regions: int = 0  # damaged journal regions the last recovery skipped (store/salvage.py)
    unreadable: int = 0  # live messages whose records could not be read back (paging, a full sync)


@dataclass(frozen=True)
class ReplicationStats:
    peer: str
    peer_state: str  # none | syncing | in-sync
    seq: int  # records numbered for the stream
    acked: int  # the highest the slave has on its disk
    lag_records: int | None  # None while no slave is attached
    lag_bytes: int | None


@dataclass(frozen=True)
class WitnessStats:
    """A replicated node's link to its pair's witness (ha/witness.py)."""

    address: str
    state: str  # up | down | unknown (not asked yet)
    last_answer: str  # what the witness said last (or why it could not be asked)
    lease_seconds: float | None  # a master: its lease left by its own count; else None


@dataclass(frozen=True)
class PeerStatus:
    """The other node of a pair as its HA port describes itself (public status only)."""

    address: str
    reachable: bool
    name: str = ""
    role: str = "down"
    epoch: int = 0
    peer_state: str = ""
    client: str = ""
    http: str = ""
    messages: int | None = None
    connections: int | None = None
    lag_records: int | None = None


@dataclass(frozen=True)
class NodeStats:
    name: str
    role: str
    mode: str  # standalone | replicated | shared-store
    epoch: int
    pid: int
    uptime: float
    client: str
    http: str
    serving: bool
    ready: bool
    ready_reason: str
    connections: int = 0
    connections_opened: int = 0
    websocket_connections: int = 0  # of ``connections``, those on the WebSocket port
    memory: MemoryStats | None = None
    journal: JournalStats | None = None
    replication: ReplicationStats | None = None
    witness: WitnessStats | None = None
    takeovers: int = 0
    sent: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    expired: int = 0
    scheduled: int = 0  # AMQ_SCHEDULED_* jobs waiting to fire
    destinations: tuple[DestinationStats, ...] = ()
    # a slave: messages per destination in its replica of the master's store (the
    # console shows them; /metrics does not, the master counts them)
    replica: tuple[tuple[str, int], ...] = ()
    otel_exported: int | None = None  # server spans exported to otel_endpoint (None: off)
    otel_dropped: int | None = None  # and dropped (queue full, POST failed)
    detail: str = ""  # e.g. why a node waits
    #: an HA node with --relay-port: client connections it relays to its master now (None: no option)
    relayed_connections: int | None = None
    #: (stage, help, histogram) of this process's receipt path (stats.RECEIPT_PATH), taken with the rest
    receipt_path: tuple[tuple[str, str, HistogramSnapshot], ...] = field(default_factory=RECEIPT_PATH.snapshot)
    extra: dict[str, str] = field(default_factory=dict)


class NodeView(Protocol):
    """What the HTTP side port reads and asks of a node (implemented by :class:`ServerView`
    and ``HaNodeView``). Every method runs on the node's event loop."""

    #: where the side port listens (host:port), set once it is bound
    http_address: str

    def stats(self) -> NodeStats: ...

    def admin(self) -> BrokerAdmin | None:
        """The admin operations, or None when this node serves no clients."""
        ...

    async def peers(self) -> list[PeerStatus]:
        """The other nodes this node knows (its pair's other node), as they describe themselves."""
        ...


# ---------------------------------------------------------------------- helpers
def _label(key: str) -> tuple[str, str]:
    if key.startswith(QUEUE_PREFIX):
        return "queue", key[len(QUEUE_PREFIX):]
    if key.startswith(DURABLE_PREFIX):
        return "durable", key
    return "queue", key


def readiness(server: BrokerServer, grace: float, now: float | None = None) -> tuple[bool, str]:
    """(ready, why) for a serving broker; see the module docstring."""
    if server.fenced is not None:
        return False, f"fenced: {server.fenced}"
    store = server.store
    if store is None or server.core is None:
        return False, "the store is not open"
    failed = store.journal.failed
    if failed is not None:
        return False, f"journal failed: {failed}"
    if not server.serving:
        return False, "the client port is not accepting connections"
    now = time.monotonic() if now is None else now
    mem = server.core.memory
    if mem.full and mem.full_since is not None and now - mem.full_since >= grace:
        return False, (f"producer flow control has held for {now - mem.full_since:.0f} s "
                       f"(memory {mem.usage} of {mem.limit} bytes)")
    if store.full and store.full_since is not None and now - store.full_since >= grace:
        return False, (f"producer flow control has held for {now - store.full_since:.0f} s (store limit: "
                       f"{store.journal.size} bytes of journal, store_limit={store.limit})")
    return True, "serving clients"


def journal_stats(store: MessageStore) -> JournalStats:
    journal = store.journal
    st = store.stats()
    failed = journal.failed
    return JournalStats(
        records=st.records,
        batches=st.batches,
        bytes_written=journal.bytes_written,
        segments=st.segments,
        messages=st.live_messages,
        size=journal.size,
        limit=store.limit,
        flow_control=store.full,
        failed=None if failed is None else str(failed),
        fsync=journal.fsync_seconds.snapshot(),
        batch=journal.batch_records.snapshot(),
        flow_control_seconds=(time.monotonic() - store.full_since) if store.full and store.full_since is not None
        else 0.0,
        failing=store.checkpoints.failing or None,
        task_failures=(("checkpoint", store.checkpoints.failures), ("compaction", store.compaction_failures)),
        damaged_regions=len(journal.damage),
        unreadable=store.unreadable,
    )


def _destinations(server: BrokerServer) -> tuple[DestinationStats, ...]:
    core = server.core
    prefix = core.config.dlq_prefix
    in_flight: dict[str, int] = {}
    topic_in_flight: dict[str, int] = {}
    for conn in server.connections:
        for sub in conn.subs.values():
            if not sub.unacked:
                continue
            if sub.children is not None or sub.pattern is not None:  # wildcards: per message
                for m in sub.unacked.values():
                    target = in_flight if sub.kind == "queue" else topic_in_flight
                    dest = m.destination
                    if dest.startswith(TOPIC_PREFIX):
                        dest = dest[len(TOPIC_PREFIX):]
                    target[dest] = target.get(dest, 0) + 1
            elif sub.kind == "queue":
                in_flight[sub.name] = in_flight.get(sub.name, 0) + len(sub.unacked)
            else:
                topic_in_flight[sub.name] = topic_in_flight.get(sub.name, 0) + len(sub.unacked)
    by_dest = core.memory.by_destination
    out: list[DestinationStats] = []
    for key, q in core.queues.items():
        kind, name = _label(key)
        is_dlq = kind == "queue" and name.startswith(prefix)
        dlq_name: str | None = None
        dlq_depth = 0
        if not is_dlq:
            dlq_name = prefix + dead_letter_name(key)
            dq = core.queues.get(QUEUE_PREFIX + dlq_name)
            dlq_depth = dq.depth if dq is not None else 0
        out.append(DestinationStats(
            kind=kind, name=name, key=key, depth=q.depth, enqueued=q.enqueued, dequeued=q.dequeued,
            consumers=len(q.consumers), in_flight=in_flight.get(key, 0), expired=q.expired,
            memory=by_dest.get(key, 0), is_dlq=is_dlq, dlq=dlq_name, dlq_depth=dlq_depth,
        ))
    for name, t in core.topics.items():
        out.append(DestinationStats(
            kind="topic", name=name, key=TOPIC_PREFIX + name,
            depth=sum(len(s.backlog) for s in t.subs), enqueued=t.enqueued, dequeued=0,
            consumers=len(t.subs), in_flight=topic_in_flight.get(name, 0),
            durable_subscriptions=len(t.durable),
        ))
    out.sort(key=lambda d: (d.kind, d.name))
    return tuple(out)


def serving_stats(server: BrokerServer, grace: float) -> dict[str, object]:
    """The fields of :class:`NodeStats` that a serving broker fills in (a dict, to be
    completed by the caller with name, role and the rest)."""
    core = server.core
    mem = core.memory
    now = time.monotonic()
    ready, why = readiness(server, grace, now)
    return {
        "serving": server.serving,
        "ready": ready,
        "ready_reason": why,
        "client": f"{server.host}:{server.port}",
        "connections": len(server.connections),
        "connections_opened": server.connections_opened,
        "websocket_connections": sum(1 for c in server.connections if c.over_websocket),
        "memory": MemoryStats(
            usage=mem.usage, limit=mem.limit, peak=mem.peak, transactions=mem.reserved, flow_control=mem.full,
            flow_control_seconds=(now - mem.full_since) if mem.full and mem.full_since is not None else 0.0,
            engaged=mem.engaged, blocked_producers=mem.blocked_count(), preauth=mem.preauth,
        ),
        "journal": journal_stats(server.store) if server.store is not None else None,
        "sent": core.sent,
        "duplicates": core.duplicates,
        "dead_lettered": core.dead_lettered,
        "expired": core.expired,
        "scheduled": len(core.scheduler),
        "destinations": _destinations(server),
        "otel_exported": server.tracer.exported if server.tracer is not None else None,
        "otel_dropped": server.tracer.dropped if server.tracer is not None else None,
    }


class ServerView:
    """The view of a plain broker (``amq broker run`` without ``--ha``): role ``standalone``."""

    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.http_address = ""
        self._started = time.monotonic()
        self._admin: BrokerAdmin | None = None

    def stats(self) -> NodeStats:
        server = self.server
        base: dict[str, object] = {
            "name": server.config.name, "role": "standalone", "mode": "standalone", "epoch": 0,
            "pid": os.getpid(), "uptime": time.monotonic() - self._started, "http": self.http_address,
        }
        if server.core is None:
            base.update(client=f"{server.host}:{server.port}", serving=False, ready=False,
                        ready_reason="the broker is starting")
        else:
            base.update(serving_stats(server, server.config.http_ready_flow_control_seconds))
        return NodeStats(**base)  # type: ignore[arg-type]

    def admin(self) -> BrokerAdmin | None:
        if self.server.core is None or not self.server.serving:
            return None
        if self._admin is None:
            from .admin import ServerAdmin

            self._admin = ServerAdmin(self.server)
        return self._admin

    async def peers(self) -> list[PeerStatus]:
        return []
