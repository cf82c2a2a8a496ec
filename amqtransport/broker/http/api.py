"""The JSON of the ``/api/`` endpoints, and the parsing of action requests.

Every console page is drawn from the same dictionaries these functions return, so
the page and the API cannot disagree. The shapes are documented in
``docs/console.md`` (field by field); keep the two in step.

Action bodies are JSON objects (``Content-Type: application/json``) or HTML form
fields (``application/x-www-form-urlencoded``, what the console's forms send): a
field repeated in a form (``ids``) becomes a list, a ``headers`` textarea holds one
``name: value`` per line. :class:`BadRequest` names what is wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qsl

from amqtransport.errors import ServerError

from ..ops.admin import BrowsedMessage, BrowsePage, ConnectionStats
from ..ops.stats import HistogramSnapshot
from ..ops.view import DestinationStats, NodeStats, PeerStatus

__all__ = [
    "BadRequest",
    "Form",
    "connection_json",
    "destination_json",
    "message_json",
    "node_json",
    "nodes_json",
    "parse_body",
    "parse_headers",
    "totals_json",
]


class BadRequest(ServerError, ValueError):
    """An action request that cannot be understood (HTTP 400)."""


def _quantile(snap: HistogramSnapshot, q: float) -> float | None:
    return snap.quantile(q)


def node_json(s: NodeStats) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": s.name, "role": s.role, "mode": s.mode, "epoch": s.epoch, "pid": s.pid,
        "uptime": round(s.uptime, 1), "client": s.client, "http": s.http, "serving": s.serving,
        "ready": s.ready, "ready_reason": s.ready_reason, "detail": s.detail,
        "connections": s.connections, "connections_opened": s.connections_opened, "takeovers": s.takeovers,
        "counters": {"sent": s.sent, "duplicates": s.duplicates, "dead_lettered": s.dead_lettered,
                     "expired": s.expired},
        "memory": None, "store": None, "replication": None,
    }
    if s.memory is not None:
        m = s.memory
        out["memory"] = {"usage": m.usage, "limit": m.limit, "peak": m.peak, "transactions": m.transactions,
                         "flow_control": m.flow_control, "flow_control_seconds": round(m.flow_control_seconds, 1),
                         "engaged": m.engaged, "blocked_producers": m.blocked_producers}
    if s.journal is not None:
        j = s.journal
        out["store"] = {"messages": j.messages, "size": j.size, "limit": j.limit, "flow_control": j.flow_control,
                        "flow_control_seconds": round(j.flow_control_seconds, 1),
                        "segments": j.segments, "records": j.records, "batches": j.batches,
                        "bytes_written": j.bytes_written, "journal_failed": j.failed, "failing": j.failing,
                        "fsync_p50": _quantile(j.fsync, 0.5), "fsync_p99": _quantile(j.fsync, 0.99),
                        "batch_p50": _quantile(j.batch, 0.5)}
    if s.replication is not None:
        out["replication"] = asdict(s.replication)
    out["witness"] = asdict(s.witness) if s.witness is not None else None
    return out


def destination_json(d: DestinationStats) -> dict[str, Any]:
    return asdict(d)


def totals_json(dests: tuple[DestinationStats, ...]) -> dict[str, int]:
    """Sums the console's rate chart differentiates (durable copies counted once, as topic messages)."""
    return {
        "enqueued": sum(d.enqueued for d in dests if d.kind != "durable"),
        "dequeued": sum(d.dequeued for d in dests if d.kind != "topic"),
        "depth": sum(d.depth for d in dests if d.kind != "topic"),
    }


def witness_text(s: NodeStats) -> str:
    """The console's witness cell: its address and link, and a master's lease left."""
    w = s.witness
    if w is None:
        return ""
    lease = f", lease {w.lease_seconds:.1f} s" if w.lease_seconds is not None else ""
    return f"{w.address} {w.state}{lease}"


def nodes_json(me: NodeStats, peers: list[PeerStatus]) -> list[dict[str, Any]]:
    """This node and the others it knows, in one shape (the overview's node cards)."""
    repl = me.replication
    mine: dict[str, Any] = {
        "self": True, "reachable": True, "name": me.name, "role": me.role, "epoch": me.epoch,
        "address": me.client, "client": me.client, "http": me.http,
        "peer_state": repl.peer_state if repl is not None else "",
        "lag_records": repl.lag_records if repl is not None else None,
        "lag_bytes": repl.lag_bytes if repl is not None else None,
        "connections": me.connections if me.serving else None,
        "messages": me.journal.messages if me.journal is not None else None,
        "ready": me.ready,
        "witness": witness_text(me),
    }
    out = [mine]
    for p in peers:
        out.append({"self": False, "reachable": p.reachable, "name": p.name, "role": p.role, "epoch": p.epoch,
                    "address": p.address, "client": p.client, "http": p.http, "peer_state": p.peer_state,
                    "lag_records": p.lag_records, "lag_bytes": None, "connections": p.connections,
                    "messages": p.messages, "ready": p.role in ("master", "standalone")})
    return out


def message_json(m: BrowsedMessage) -> dict[str, Any]:
    out = asdict(m)
    out["headers"] = [list(h) for h in m.headers]
    if math.isfinite(m.timestamp):
        out["timestamp"] = round(m.timestamp, 3)
    return out


def browse_json(page: BrowsePage) -> dict[str, Any]:
    return {"queue": page.queue, "total": page.total, "in_flight": page.in_flight, "offset": page.offset,
            "messages": [message_json(m) for m in page.messages]}


def connection_json(c: ConnectionStats) -> dict[str, Any]:
    out = asdict(c)
    out["age"] = round(c.age, 1)
    out["subscriptions"] = list(c.subscriptions)
    return out


# ---------------------------------------------------------------------- request bodies
class Form:
    """An action's fields, from JSON or from a form."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = dict(fields)

    def text(self, name: str, default: str = "") -> str:
        value = self.fields.get(name, default)
        if isinstance(value, list):
            value = value[0] if value else default
        if value is None:
            return default
        if not isinstance(value, str | int | float):
            raise BadRequest(f"field {name!r} must be a string")
        return str(value)

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.fields.get(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, list):
            value = value[-1] if value else ""
        text = str(value).strip().lower()
        if text in ("1", "true", "on", "yes"):
            return True
        if text in ("0", "false", "off", "no", ""):
            return False
        raise BadRequest(f"field {name!r} must be true or false, got {value!r}")

    def strings(self, name: str) -> list[str] | None:
        value = self.fields.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise BadRequest(f"field {name!r} must be a list of strings")

    def headers(self) -> dict[str, str]:
        value = self.fields.get("headers")
        if value is None or value == "":
            return {}
        if isinstance(value, dict):
            if not all(isinstance(k, str) and isinstance(v, str | int | float | bool) for k, v in value.items()):
                raise BadRequest("headers must map names to strings")
            return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        if isinstance(value, list):
            value = "\n".join(str(v) for v in value)
        if isinstance(value, str):
            return parse_headers(value)
        raise BadRequest("headers must be an object or 'name: value' lines")


def parse_headers(text: str) -> dict[str, str]:
    """``name: value`` lines (blank lines ignored) -> dict; BadRequest names a bad line."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise BadRequest(f"headers line {n}: expected 'name: value', got {line[:60]!r}")
        out[name.strip()] = value.strip()
    return out


def parse_body(content_type: str, body: bytes) -> Form:
    ctype = content_type.split(";", 1)[0].strip().lower()
    if not body.strip():
        return Form({})
    if ctype == "application/json":
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object")
        return Form(data)
    if ctype in ("application/x-www-form-urlencoded", ""):
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise BadRequest("form body is not UTF-8") from None
        fields: dict[str, Any] = {}
        for k, v in pairs:
            if k in fields:
                prev = fields[k]
                fields[k] = [*prev, v] if isinstance(prev, list) else [prev, v]
            else:
                fields[k] = v
        return Form(fields)
    raise BadRequest(f"unsupported Content-Type {content_type!r}: send application/json or a form")
