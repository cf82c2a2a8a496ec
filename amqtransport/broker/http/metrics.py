"""``/metrics``: a node's :class:`~..view.NodeStats` in the Prometheus text format 0.0.4.

Naming follows Prometheus: the ``amq_`` prefix, base units (bytes, seconds), ``_total``
on counters; per-destination series carry a ``queue`` or ``topic`` label (the name
without ``/queue/`` / ``/topic/``). ``docs/metrics.md`` lists every family with a
sample query. Families that do not apply to a node's role are left out (a slave has
no destinations of its own and no memory gauge); role, epoch and readiness are always
there.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..ops.stats import HistogramSnapshot
from ..ops.view import ROLES, DestinationStats, NodeStats

__all__ = ["render_metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = dict[str, str]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, rows: Iterable[tuple[Labels, float]]) -> None:
        rows = list(rows)
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in rows:
            self.lines.append(f"{name}{_labels(labels)} {_num(value)}")

    def one(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.family(name, kind, help_text, [({}, value)])

    def histogram(self, name: str, help_text: str, snap: HistogramSnapshot) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} histogram")
        for bound, count in snap.buckets:
            self.lines.append(f'{name}_bucket{{le="{_num(bound)}"}} {count}')
        self.lines.append(f'{name}_bucket{{le="+Inf"}} {snap.count}')
        self.lines.append(f"{name}_sum {_num(snap.sum)}")
        self.lines.append(f"{name}_count {snap.count}")


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


_QUEUE_FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("depth", "gauge", "depth", "Messages waiting in the queue for a consumer."),
    ("enqueued_total", "counter", "enqueued", "Messages put on the queue: sends, and moves into it (dead-lettering, retries)."),
    ("dequeued_total", "counter", "dequeued", "Messages consumers took off the queue and acknowledged."),
    ("consumers", "gauge", "consumers", "Consumers subscribed to the queue."),
    ("in_flight", "gauge", "in_flight", "Messages delivered to consumers and not yet acknowledged."),
    ("expired_total", "counter", "expired", "Messages dropped from the queue because their expires time passed."),
    ("memory_bytes", "gauge", "memory", "Bytes the queue's messages are charged against the memory limit."),
    ("dlq_depth", "gauge", "dlq_depth", "Messages waiting in the queue's dead-letter queue (DLQ.<name>)."),
)
_TOPIC_FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("depth", "gauge", "depth", "Messages buffered for slow non-durable subscribers of the topic."),
    ("enqueued_total", "counter", "enqueued", "Messages published to the topic while it had subscribers."),
    ("consumers", "gauge", "consumers", "Live subscriptions of the topic."),
    ("in_flight", "gauge", "in_flight", "Topic messages delivered and not yet acknowledged."),
    ("durable_subscriptions", "gauge", "durable_subscriptions", "Durable subscriptions of the topic."),
)


def _destinations(out: _Out, dests: tuple[DestinationStats, ...]) -> None:
    queues = [d for d in dests if d.kind == "queue"]
    topics = [d for d in dests if d.kind == "topic"]
    durables = [d for d in dests if d.kind == "durable"]
    for suffix, kind, attr, help_text in _QUEUE_FAMILIES:
        rows = [({"queue": d.name}, float(getattr(d, attr))) for d in queues]
        if suffix == "dlq_depth":
            rows = [r for r, d in zip(rows, queues, strict=True) if not d.is_dlq]
        out.family(f"amq_queue_{suffix}", kind, help_text, rows)
    for suffix, kind, attr, help_text in _TOPIC_FAMILIES:
        out.family(f"amq_topic_{suffix}", kind, help_text, (({"topic": d.name}, float(getattr(d, attr)))
                                                              for d in topics))
    out.family("amq_durable_subscription_depth", "gauge",
               "Messages waiting in a durable topic subscription (durable:<client-id>:<name>).",
               (({"subscription": d.name}, float(d.depth)) for d in durables))


def render_metrics(stats: NodeStats) -> str:
    out = _Out()
    out.family("amq_node_info", "gauge", "The node: name, mode and role (always 1).",
               [({"name": stats.name, "mode": stats.mode, "role": stats.role}, 1)])
    out.family("amq_ha_role", "gauge", "The node's role: 1 for the current one, 0 for the others.",
               (({"role": r}, 1.0 if r == stats.role else 0.0) for r in ROLES))
    out.one("amq_ha_epoch", "gauge", "The store's epoch: raised each time a node of the pair becomes master.",
            stats.epoch)
    out.one("amq_ha_takeovers_total", "counter",
            "Times this node became master in another node's place (replicated: its master was lost; "
            "shared store: it got the store lock another node held).", stats.takeovers)
    out.one("amq_ready", "gauge", "1 when the node serves clients (what /readyz answers 200 for).",
            1 if stats.ready else 0)
    out.one("amq_uptime_seconds", "gauge", "Seconds since the node process started.", stats.uptime)
    if stats.otel_exported is not None:
        out.one("amq_otel_spans_exported_total", "counter",
                "Server spans of sampled SENDs exported to otel_endpoint (OTLP/HTTP).", stats.otel_exported)
    if stats.otel_dropped is not None:
        out.one("amq_otel_spans_dropped_total", "counter",
                "Server spans dropped: the export queue was full or their POST failed (a send never waits for "
                "the collector).", stats.otel_dropped)
    witness = stats.witness
    if witness is not None:
        out.one("amq_ha_witness_up", "gauge", "1 when the pair's witness answered this node's last request.",
                1 if witness.state == "up" else 0)
        if witness.lease_seconds is not None:
            out.one("amq_ha_witness_lease_seconds", "gauge",
                    "A master's witness lease left, by its own count (0: run out; receipting alone then waits).",
                    witness.lease_seconds)
    if stats.relayed_connections is not None:
        out.one("amq_ha_relayed_connections", "gauge",
                "A node with --relay-port that is not master: client connections it relays to its live master "
                "now.", stats.relayed_connections)
    repl = stats.replication
    if repl is not None:
        out.family("amq_replication_peer_state", "gauge",
                   "The slave's state as the master sees it: 1 for the current one.",
                   (({"state": s}, 1.0 if s == repl.peer_state else 0.0) for s in ("none", "syncing", "in-sync")))
        out.one("amq_replication_records_total", "counter", "Journal records numbered for the replication stream.",
                repl.seq)
        if repl.lag_records is not None:
            out.one("amq_replication_lag_records", "gauge",
                    "Records streamed to the slave and not yet on its disk.", repl.lag_records)
        if repl.lag_bytes is not None:
            out.one("amq_replication_lag_bytes", "gauge",
                    "Bytes of records streamed to the slave and not yet on its disk.", repl.lag_bytes)
    if stats.serving or stats.memory is not None:
        out.one("amq_connections", "gauge", "Open client connections.", stats.connections)
        out.one("amq_connections_opened_total", "counter", "Client connections accepted.", stats.connections_opened)
        out.one("amq_websocket_connections", "gauge", "Open client connections on the WebSocket port.",
                stats.websocket_connections)
        out.one("amq_messages_sent_total", "counter", "Messages accepted from producers.", stats.sent)
        out.one("amq_messages_duplicate_total", "counter",
                "Sends dropped as duplicates (idempotency key seen in the window).", stats.duplicates)
        out.one("amq_messages_dead_lettered_total", "counter",
                "Messages moved to a dead-letter queue after too many deliveries.", stats.dead_lettered)
        out.one("amq_messages_expired_total", "counter", "Messages dropped because they expired.", stats.expired)
        out.one("amq_scheduled_messages", "gauge", "Scheduled messages (AMQ_SCHEDULED_*) waiting to be delivered.",
                stats.scheduled)
    mem = stats.memory
    if mem is not None:
        out.one("amq_memory_usage_bytes", "gauge", "Bytes of queued messages held in memory.", mem.usage)
        out.one("amq_memory_limit_bytes", "gauge", "memory_limit: producers are flow-controlled at it.", mem.limit)
        out.one("amq_memory_peak_bytes", "gauge", "Highest memory usage since start.", mem.peak)
        out.one("amq_memory_transactions_bytes", "gauge", "Bytes held by open transactions (part of usage).",
                mem.transactions)
        out.one("amq_memory_preauth_bytes", "gauge", "Bytes buffered by connections not logged in yet (part of "
                "usage; max_unauthenticated_bytes bounds them).", mem.preauth)
        out.one("amq_memory_flow_control", "gauge", "1 while producer flow control holds SENDs (memory).",
                1 if mem.flow_control else 0)
        out.one("amq_memory_flow_control_seconds", "gauge", "How long flow control has held without a break.",
                mem.flow_control_seconds)
        out.one("amq_memory_flow_control_engaged_total", "counter",
                "Times flow control engaged (global or per destination).", mem.engaged)
        out.one("amq_memory_blocked_producers", "gauge", "Connections with SENDs parked by flow control.",
                mem.blocked_producers)
    journal = stats.journal
    if journal is not None:
        out.one("amq_store_messages", "gauge", "Live persistent messages in the store.", journal.messages)
        out.one("amq_store_usage_bytes", "gauge", "Bytes of journal segments on disk.", journal.size)
        out.one("amq_store_limit_bytes", "gauge", "store_limit (0: no limit).", journal.limit)
        out.one("amq_store_flow_control", "gauge", "1 while the store limit holds persistent producers.",
                1 if journal.flow_control else 0)
        out.one("amq_store_flow_control_seconds", "gauge", "How long the store limit has held without a break.",
                journal.flow_control_seconds)
        out.one("amq_store_segments", "gauge", "Journal segment files.", journal.segments)
        out.one("amq_journal_healthy", "gauge", "0 once a journal write or fsync has failed.",
                0 if journal.failed else 1)
        out.one("amq_store_failing", "gauge",
                "1 while the store cannot keep its promise: the journal failed (a write or fsync error, its "
                "data directory deleted, replaced or read-only: the node fences) or a background storage "
                "task's last attempt failed (a checkpoint that cannot be written; it backs off and retries).",
                1 if journal.failed or journal.failing else 0)
        out.one("amq_journal_damaged_regions", "gauge",
                "Damaged journal regions the last recovery skipped: their records are lost (the log names "
                "them; `amq broker verify` reports, `amq broker repair` salvages).", journal.damaged_regions)
        out.one("amq_store_unreadable_messages_total", "counter",
                "Live messages whose journal records could not be read back (bits changed on the disk): "
                "lost, or sent to a replica from memory; the log names each.", journal.unreadable)
        out.family("amq_store_background_failures_total", "counter",
                   "Background storage tasks that failed, by task (checkpoint, compaction).",
                   (({"task": task}, n) for task, n in journal.task_failures))
        out.one("amq_journal_records_total", "counter", "Records appended to the journal.", journal.records)
        out.one("amq_journal_written_bytes_total", "counter", "Bytes written to the journal.", journal.bytes_written)
        out.one("amq_journal_batches_total", "counter", "Group commits (one fsync each).", journal.batches)
        out.histogram("amq_journal_fsync_duration_seconds",
                      "Time to write and fdatasync one group commit.", journal.fsync)
        out.histogram("amq_journal_batch_records", "Records per group commit (the batch one fsync covers).",
                      journal.batch)
    for stage, help_text, snap in stats.receipt_path:
        out.histogram(f"amq_receipt_{stage}_seconds", f"Receipt path: {help_text}", snap)
    if stats.destinations:
        _destinations(out, stats.destinations)
    return "\n".join(out.lines) + "\n"
