"""Per-bridge status, and the HTTP endpoint that serves it.

This is the seed's "look at the bridge MBean's RemoteAddress" check, without JMX. The
important property is where ``remote`` comes from: a bridge that is up registers a
*probe*, a callable reading ``Connection.connected_uri`` of its remote connection, and
every snapshot calls it. So the status never shows a configured URI, nor the address a
bridge was built for, nor an address cached at build time: it shows the leaf the
connection is on at the moment of the request (``None`` while it is between
brokers). ``service`` is the identity the bridge was built for (what ActiveMQ puts in
the MBean name); with a failover that reconnects by itself it goes stale, which is the
seed's pitfall, and the two fields side by side make that visible.

Endpoints (stdlib ``http.server`` in a daemon thread):

- ``GET /status``  -> ``{"bridges": [{"name", "state", "remote", "forwarded", "failed",
  "rebuilds", "last_error", ...}]}`` (extra keys: connector, service, local, suppressed,
  destinations, since)
- ``GET /metrics`` -> Prometheus text format 0.0.4.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from amqtransport.broker.ops.stats import LATENCY_BUCKETS, Histogram, HistogramSnapshot

__all__ = ["UP", "DOWN", "CONNECTING", "BridgeStatus", "StatusRegistry", "StatusServer", "render_table"]

log = logging.getLogger(__name__)

UP = "up"
DOWN = "down"
CONNECTING = "connecting"
STATES = (UP, DOWN, CONNECTING)

Probe = Callable[[], "str | None"]


def _safe_probe(probe: Probe | None) -> str | None:
    if probe is None:
        return None
    try:
        value = probe()
    except Exception:  # noqa: BLE001 - a status request must never fail because of a probe
        return None
    return None if value is None else str(value)


@dataclass
class BridgeStatus:
    """Mutable status of one bridge; all writes go through the methods (thread-safe)."""

    name: str
    connector: str
    service: str
    state: str = DOWN
    forwarded: int = 0
    failed: int = 0
    suppressed: int = 0
    rebuilds: int = 0
    builds: int = 0
    last_error: str | None = None
    since: float = field(default_factory=time.time)
    destinations: set[str] = field(default_factory=set)
    by_destination: dict[str, int] = field(default_factory=dict)  # forwarded per source destination
    in_flight: int = 0  # sent to the far broker, receipt awaited
    failovers: int = 0  # the remote connection resumed after a failover
    forward_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS), repr=False)
    _remote_probe: Probe | None = None
    _local_probe: Probe | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def connecting(self) -> None:
        with self._lock:
            self.state = CONNECTING
            self.since = time.time()

    def up(self, remote_probe: Probe, local_probe: Probe | None = None) -> int:
        """Mark up; returns the build number (1 for the first build, 2 after one rebuild...)."""
        with self._lock:
            self.builds += 1
            if self.builds > 1:
                self.rebuilds += 1
            self.state = UP
            self.since = time.time()
            self._remote_probe = remote_probe
            self._local_probe = local_probe
            return self.builds

    def down(self, error: BaseException | str | None = None) -> None:
        with self._lock:
            self.state = DOWN
            self.since = time.time()
            self._remote_probe = None
            self._local_probe = None
            self.destinations.clear()
            if error is not None:
                self.last_error = _describe(error)

    def error(self, error: BaseException | str) -> None:
        with self._lock:
            self.last_error = _describe(error)

    def add_forwarded(self, n: int = 1, destination: str | None = None) -> None:
        with self._lock:
            self.forwarded += n
            if destination is not None:
                self.by_destination[destination] = self.by_destination.get(destination, 0) + n

    def add_in_flight(self, n: int) -> None:
        """``n`` messages sent to the far broker (negative: their receipts are in, or failed)."""
        with self._lock:
            self.in_flight = max(0, self.in_flight + n)

    def failover(self) -> None:
        with self._lock:
            self.failovers += 1

    def add_failed(self, n: int = 1) -> None:
        with self._lock:
            self.failed += n

    def add_suppressed(self, n: int = 1) -> None:
        with self._lock:
            self.suppressed += n

    def set_destination(self, destination: str, active: bool) -> None:
        with self._lock:
            if active:
                self.destinations.add(destination)
            else:
                self.destinations.discard(destination)

    @property
    def remote(self) -> str | None:
        """The address the remote connection is on *now* (never a configured URI)."""
        with self._lock:
            probe = self._remote_probe if self.state == UP else None
        return _safe_probe(probe)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            state = self.state
            rprobe = self._remote_probe if state == UP else None
            lprobe = self._local_probe if state == UP else None
            out: dict[str, Any] = {
                "by_destination": dict(self.by_destination),
                "in_flight": self.in_flight,
                "failovers": self.failovers,
                "forward_seconds": _histogram_json(self.forward_seconds.snapshot()),
                "name": self.name,
                "state": state,
                "remote": None,
                "forwarded": self.forwarded,
                "failed": self.failed,
                "rebuilds": self.rebuilds,
                "last_error": self.last_error,
                "connector": self.connector,
                "service": self.service,
                "local": None,
                "suppressed": self.suppressed,
                "destinations": sorted(self.destinations),
                "since": round(self.since, 3),
            }
        out["remote"] = _safe_probe(rprobe)
        out["local"] = _safe_probe(lprobe)
        return out


def _histogram_json(snap: HistogramSnapshot) -> dict[str, Any]:
    return {"buckets": [list(b) for b in snap.buckets], "count": snap.count, "sum": snap.sum}


def _describe(error: BaseException | str) -> str:
    if isinstance(error, BaseException):
        text = str(error) or type(error).__name__
        return f"{type(error).__name__}: {text}" if type(error).__name__ not in text else text
    return error


class StatusRegistry:
    """All bridges of an agent, in registration order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bridges: dict[str, BridgeStatus] = {}
        self._started = time.monotonic()

    def register(self, name: str, *, connector: str, service: str) -> BridgeStatus:
        with self._lock:
            if name in self._bridges:
                raise ValueError(f"bridge {name!r} is already registered")
            status = BridgeStatus(name=name, connector=connector, service=service)
            self._bridges[name] = status
            return status

    def get(self, name: str) -> BridgeStatus:
        with self._lock:
            return self._bridges[name]

    def __iter__(self) -> Any:
        with self._lock:
            return iter(list(self._bridges.values()))

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            bridges = list(self._bridges.values())
        return {"bridges": [b.snapshot() for b in bridges]}

    def to_json(self) -> str:
        return json.dumps(self.snapshot(), indent=2)

    def to_prometheus(self) -> str:
        return render_metrics(self.snapshot()["bridges"], uptime=time.monotonic() - self._started)


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(bridges: Iterable[dict[str, Any]], uptime: float | None = None) -> str:
    bridges = list(bridges)
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, rows: Iterable[tuple[dict[str, object], float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in rows:
            lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{lab}}} {value:g}")

    family("amq_bridge_up", "gauge", "1 when the bridge is up.",
           (({"bridge": b["name"]}, 1.0 if b["state"] == UP else 0.0) for b in bridges))
    family("amq_bridge_state", "gauge", "Bridge state (one series per state, 1 for the current one).",
           (({"bridge": b["name"], "state": s}, 1.0 if b["state"] == s else 0.0) for b in bridges for s in STATES))
    family("amq_bridge_info", "gauge", "Bridge identity and the remote address actually connected.",
           (({"bridge": b["name"], "connector": b["connector"], "service": b["service"],
              "remote": b["remote"] or ""}, 1.0) for b in bridges))
    for key, help_text in (
        ("forwarded", "Messages forwarded and acknowledged by the far broker."),
        ("failed", "Messages whose forwarding failed (left unacknowledged, forwarded again later)."),
        ("suppressed", "Messages not forwarded because of network_ttl or a loop in the hop path."),
        ("rebuilds", "Times the bridge was rebuilt after a failure."),
    ):
        family(f"amq_bridge_{key}_total", "counter", help_text,
               (({"bridge": b["name"]}, float(b[key])) for b in bridges))
    # the client-side counterparts of the broker's families (docs/metrics.md)
    family("amq_bridge_connected", "gauge", "1 while the bridge's local / remote connection is up.",
           (({"bridge": b["name"], "side": side}, 1.0 if b.get(side) else 0.0)
            for b in bridges for side in ("local", "remote")))
    family("amq_bridge_destination_forwarded_total", "counter", "Messages forwarded, per source destination.",
           (({"bridge": b["name"], "destination": d}, float(n))
            for b in bridges for d, n in sorted(b.get("by_destination", {}).items())))
    family("amq_bridge_in_flight", "gauge", "Messages sent to the far broker whose receipt is awaited.",
           (({"bridge": b["name"]}, float(b.get("in_flight", 0))) for b in bridges))
    family("amq_bridge_failovers_total", "counter",
           "Times the remote connection resumed on a broker after a failover.",
           (({"bridge": b["name"]}, float(b.get("failovers", 0))) for b in bridges))
    name = "amq_bridge_forward_duration_seconds"
    lines.append(f"# HELP {name} Send of a batch to the far broker's last receipt.")
    lines.append(f"# TYPE {name} histogram")
    for b in bridges:
        h = b.get("forward_seconds") or {"buckets": [], "count": 0, "sum": 0.0}
        bridge = _label(b["name"])
        for bound, count in h["buckets"]:
            lines.append(f'{name}_bucket{{bridge="{bridge}",le="{bound:g}"}} {count}')
        lines.append(f'{name}_bucket{{bridge="{bridge}",le="+Inf"}} {h["count"]}')
        lines.append(f'{name}_sum{{bridge="{bridge}"}} {h["sum"]:g}')
        lines.append(f'{name}_count{{bridge="{bridge}"}} {h["count"]}')
    if uptime is not None:
        family("amq_bridge_uptime_seconds", "gauge", "Seconds since the agent started.", [({}, uptime)])
    return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    registry: StatusRegistry  # set on the subclass made per server

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/status":
            body = self.registry.to_json().encode()
            ctype = "application/json"
            code = 200
        elif path == "/metrics":
            body = self.registry.to_prometheus().encode()
            ctype = "text/plain; version=0.0.4; charset=utf-8"
            code = 200
        elif path == "/":
            body = b"amq bridge agent: see /status (JSON) and /metrics (Prometheus)\n"
            ctype = "text/plain; charset=utf-8"
            code = 200
        else:
            body = b'{"error": "not found"}'
            ctype = "application/json"
            code = 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature from the base class
        log.debug("status http: " + format, *args)


class StatusServer:
    """Serves a :class:`StatusRegistry` over HTTP from a daemon thread. Port 0 picks a free port."""

    def __init__(self, registry: StatusRegistry, host: str = "127.0.0.1", port: int = 0) -> None:
        handler = type("StatusHandler", (_Handler,), {"registry": registry})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> StatusServer:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="bridge-status-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> StatusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def render_table(status: dict[str, Any]) -> str:
    """The ``amq bridge status`` table."""
    cols = ("NAME", "STATE", "REMOTE", "FORWARDED", "FAILED", "REBUILDS", "LAST ERROR")
    rows = [
        (
            str(b.get("name", "")),
            str(b.get("state", "")),
            str(b.get("remote") or "-"),
            str(b.get("forwarded", 0)),
            str(b.get("failed", 0)),
            str(b.get("rebuilds", 0)),
            str(b.get("last_error") or "-").replace("\n", " ")[:60],
        )
        for b in status.get("bridges", [])
    ]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*cols).rstrip()]
    out.extend(fmt.format(*r).rstrip() for r in rows)
    if not rows:
        out.append("(no bridges)")
    return "\n".join(out)
