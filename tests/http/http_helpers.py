"""Helpers for the HTTP side-port tests: a real ``amq broker run --http`` process, a
small client that keeps its session cookie and CSRF token, and dead-lettered messages."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

import amqtransport
from amqtransport.testing.broker_process import BrokerProcess
from amqtransport.testing.ports import free_port
from amqtransport.testing.wait import wait_for


class Console:
    """A running broker with its side port; ``session`` keeps cookies between calls."""

    def __init__(self, proc: BrokerProcess, http_port: int) -> None:
        self.proc = proc
        self.http_port = http_port
        self.url = f"http://127.0.0.1:{http_port}"
        self.session = requests.Session()

    @property
    def uri(self) -> str:
        return self.proc.uri

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.session.get(self.url + path, timeout=10, allow_redirects=False, **kw)

    def json(self, path: str, **kw: Any) -> Any:
        r = self.get(path, **kw)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def token(self, **kw: Any) -> str:
        return str(self.json("/api/session", **kw)["csrf_token"])

    def post(self, path: str, data: Mapping[str, Any] | None = None, *, token: str | None = "auto",
             headers: Mapping[str, str] | None = None, **kw: Any) -> requests.Response:
        h = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
        if token == "auto":
            token = self.token(**kw)
        if token is not None:
            h["X-CSRF-Token"] = token
        return self.session.post(self.url + path, data=json.dumps(dict(data or {})), headers=h, timeout=30,
                                 allow_redirects=False, **kw)

    def depth(self, name: str) -> int | None:
        for d in self.json("/api/destinations")["destinations"]:
            if d["name"] == name and d["kind"] != "topic":
                return int(d["depth"])
        return None

    def metrics(self) -> str:
        r = self.get("/metrics")
        assert r.status_code == 200
        return r.text


def metric(text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The value of one sample of the Prometheus text ``text`` (None when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in (labels or {}).items())
    prefix = f"{name}{{{want}}} " if want else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return None


@contextmanager
def running_console(tmp_path: Path, *, args: Sequence[str] = (), config: str = "max_redeliveries = 1\n",
                    name: str = "b") -> Iterator[Console]:
    port = free_port()
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(config)
    proc = BrokerProcess(tmp_path / f"data-{name}", args=["--config", str(cfg), "--http", f"127.0.0.1:{port}",
                                                          "--name", name, *args],
                         log_dir=tmp_path / f"logs-{name}")
    with proc:
        wait_http(port)
        yield Console(proc, port)


def wait_http(port: int, timeout: float = 20.0) -> None:
    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    wait_for(listening, timeout, f"something to listen on http port {port}", interval=0.05, ignore=(OSError,))


def dead_letter(uri: str, queue: str, bodies: Sequence[str], *, login: str | None = None,
                passcode: str | None = None) -> None:
    """Send ``bodies`` to ``/queue/<queue>`` and NACK every delivery until the broker has
    moved them all to ``DLQ.<queue>`` (after ``1 + max_redeliveries`` deliveries each)."""
    kw: dict[str, Any] = {"login": login, "passcode": passcode} if login else {}
    with amqtransport.connect(uri, **kw) as c:
        for b in bodies:
            c.send(f"/queue/{queue}", b, headers={"customer": "c-" + b})
        sub = c.subscribe(f"/queue/{queue}", ack="client-individual")
        nacked = 0
        while True:
            m = sub.receive(timeout=1.0 if nacked else 5.0)
            if m is None:
                break
            m.nack()
            nacked += 1
            assert nacked <= 100 * len(bodies), "messages never reach the DLQ"
        sub.unsubscribe()
        assert nacked >= len(bodies), f"only {nacked} deliveries to NACK"


def send(uri: str, queue: str, bodies: Sequence[str], *, persistent: bool = True, **kw: Any) -> None:
    with amqtransport.connect(uri, **kw) as c:
        for b in bodies:
            c.send(f"/queue/{queue}", b, persistent=persistent)


def receive_all(uri: str, queue: str, n: int, **kw: Any) -> list[amqtransport.Message]:
    with amqtransport.connect(uri, **kw) as c:
        sub = c.subscribe(f"/queue/{queue}")
        out = []
        for _ in range(n):
            m = sub.receive(timeout=5)
            assert m is not None, f"got {len(out)} of {n} messages from {queue}"
            out.append(m)
        return out


def receipt_stages(text: str) -> dict[str, dict[str, float]]:
    """``stage -> {"count", "sum", "+Inf", "buckets": ...}`` of the ``amq_receipt_<stage>_seconds``
    histograms in the Prometheus text ``text``; each histogram's buckets must be cumulative
    and end at its count."""
    stages: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("amq_receipt_"):
            continue
        name, value = line.rsplit(" ", 1)
        stage, _, rest = name[len("amq_receipt_"):].partition("_seconds_")
        series = stages.setdefault(stage, {})
        if rest.startswith("bucket"):
            le = rest.split('"')[1]
            assert float(value) >= series.get("last", 0.0), f"{stage}: buckets not cumulative at le={le}"
            series["last"] = float(value)
            series[le] = float(value)
        else:
            series[rest] = float(value)
    for stage, series in stages.items():
        assert series["+Inf"] == series["count"], (stage, series)
    return stages
