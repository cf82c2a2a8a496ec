"""The side port of a real ``amq broker run --http`` process: probes, metrics, the JSON
API and every action, with CSRF, Origin/Host checks and bad input.

One broker serves the whole module (its state accumulates; each test uses its own
queue names)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from http_helpers import (
    Console,
    dead_letter,
    metric,
    receipt_stages,
    receive_all,
    running_console,
    send,
)

import amqtransport
from amqtransport.broker.http.metrics import CONTENT_TYPE
from amqtransport.testing.wait import wait_for


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with running_console(tmp_path_factory.mktemp("http")) as c:
        yield c


# ---------------------------------------------------------------------- probes, metrics
def test_healthz_and_readyz_on_a_standalone_broker(console: Console) -> None:
    r = console.get("/healthz")
    assert r.status_code == 200 and r.text.startswith("ok")
    r = console.get("/readyz")
    assert r.status_code == 200, r.text
    assert "standalone" in r.text


def test_metrics_follow_prometheus_naming_and_count_a_queue(console: Console) -> None:
    send(console.uri, "m.orders", [f"o{i}" for i in range(7)])
    r = console.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == CONTENT_TYPE
    text = r.text
    assert metric(text, "amq_queue_depth", {"queue": "m.orders"}) == 7
    assert metric(text, "amq_queue_enqueued_total", {"queue": "m.orders"}) == 7
    assert metric(text, "amq_queue_consumers", {"queue": "m.orders"}) == 0
    assert metric(text, "amq_queue_dlq_depth", {"queue": "m.orders"}) == 0
    assert metric(text, "amq_messages_sent_total") is not None and metric(text, "amq_messages_sent_total") >= 7
    assert metric(text, "amq_ha_role", {"role": "standalone"}) == 1
    assert metric(text, "amq_ready") == 1
    assert metric(text, "amq_memory_limit_bytes") == 268435456
    assert (metric(text, "amq_journal_fsync_duration_seconds_count") or 0) >= 1
    assert metric(text, "amq_journal_fsync_duration_seconds_bucket", {"le": "+Inf"}) == \
        metric(text, "amq_journal_fsync_duration_seconds_count")
    # every family is declared once, counters end in _total, names carry the prefix
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"{name} declared twice"
            types[name] = kind
        elif line and not line.startswith("#"):
            assert line.startswith("amq_"), line
    for name, kind in types.items():
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
    with amqtransport.connect(console.uri) as c:
        sub = c.subscribe("/queue/m.orders", ack="client-individual", headers={"activemq.prefetchSize": "10"})
        got = [sub.receive(timeout=5) for _ in range(7)]
        text = console.metrics()
        assert metric(text, "amq_queue_in_flight", {"queue": "m.orders"}) == 7
        assert metric(text, "amq_queue_consumers", {"queue": "m.orders"}) == 1
        for m in got:
            assert m is not None
            m.ack()
        c.send("/queue/m.flush", "x")  # a receipted send: the acks before it are processed
        text = console.metrics()
        assert metric(text, "amq_queue_dequeued_total", {"queue": "m.orders"}) == 7
        assert metric(text, "amq_queue_in_flight", {"queue": "m.orders"}) == 0


def test_metrics_time_each_stage_of_the_receipt_path(console: Console) -> None:
    """issue 27: ``amq_receipt_<stage>_seconds`` histograms count the receipted sends."""
    n = 25
    before_text = console.metrics()
    before = receipt_stages(before_text)
    with amqtransport.connect(console.uri) as c:
        for i in range(n):
            c.send("/queue/m.receipts", f"r{i}")  # window 1: each its RECEIPT before the next
    text = console.metrics()
    after = receipt_stages(text)
    assert set(after) == {"read", "journal_wakeup", "journal_queue", "journal_sync", "replication_send",
                          "slave_ack", "gate_wait", "handoff", "receipt_write", "total"}

    def delta(stage: str) -> float:
        return after[stage]["count"] - before.get(stage, {}).get("count", 0.0)

    assert delta("total") == n  # one per receipted SEND: read and parsed -> its RECEIPT queued
    batches = metric(text, "amq_journal_batches_total")
    assert batches is not None
    # one journal_queue and one journal_sync per group commit (a batch in flight at the scrape at most)
    assert batches <= after["journal_queue"]["count"] <= batches + 1
    assert batches <= after["journal_sync"]["count"] <= batches + 1
    for stage in ("read", "journal_queue", "journal_sync", "handoff", "receipt_write"):
        assert delta(stage) >= n, (stage, delta(stage))
    assert 0 < after["total"]["sum"] - before.get("total", {}).get("sum", 0.0)
    # a standalone broker replicates nothing
    assert after["replication_send"]["count"] == after["slave_ack"]["count"] == after["gate_wait"]["count"] == 0
    assert "# TYPE amq_receipt_total_seconds histogram" in text


def test_metrics_count_scheduled_messages(console: Console) -> None:
    before = metric(console.get("/metrics").text, "amq_scheduled_messages")
    assert before is not None
    with amqtransport.connect(console.uri) as c:
        c.send("/queue/m.later", "in ten minutes", delay=600_000)
    assert metric(console.get("/metrics").text, "amq_scheduled_messages") == before + 1


def test_metrics_parse_with_the_prometheus_client_parser(console: Console) -> None:
    parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client is a dev dependency")
    send(console.uri, "m.parse", ["x"])
    families = {f.name: f for f in parser.text_string_to_metric_families(console.metrics())}
    assert "amq_journal_fsync_duration_seconds" in families
    assert families["amq_journal_fsync_duration_seconds"].type == "histogram"
    assert families["amq_queue_enqueued"].type == "counter"  # the parser strips _total
    depth = {s.labels["queue"]: s.value for s in families["amq_queue_depth"].samples}
    assert depth["m.parse"] == 1


# ---------------------------------------------------------------------- reads
def test_overview_destinations_and_queue_json(console: Console) -> None:
    send(console.uri, "j.q", ["a", "b"])
    ov = console.json("/api/overview")
    assert ov["node"]["role"] == "standalone" and ov["node"]["ready"] is True
    assert ov["nodes"][0]["self"] is True
    assert ov["totals"]["enqueued"] >= 2
    dests = console.json("/api/destinations?filter=j.q")["destinations"]
    assert [(d["name"], d["depth"], d["kind"]) for d in dests] == [("j.q", 2, "queue")]
    q = console.json("/api/queues/j.q")
    assert q["depth"] == 2 and q["dlq"] == "DLQ.j.q"
    assert console.get("/api/queues/no.such.queue").status_code == 404


def test_browse_shows_headers_and_the_first_kib_without_consuming(console: Console) -> None:
    big = "x" * 3000
    send(console.uri, "j.browse", ["small", big])
    page = console.json("/api/queues/j.browse/messages")
    assert page["total"] == 2
    small, large = page["messages"]
    assert small["body"] == "small" and small["truncated"] is False
    assert len(large["body"]) == 1024 and large["truncated"] is True and large["size"] == 3000
    assert ["persistent", "true"] in small["headers"]
    assert console.depth("j.browse") == 2  # nothing consumed
    assert console.json("/api/queues/j.browse/messages?offset=1&limit=1")["messages"][0]["id"] == large["id"]
    assert console.get("/api/queues/j.browse/messages?limit=0").status_code == 400
    assert console.get("/api/queues/j.browse/messages?limit=abc").status_code == 400


# ---------------------------------------------------------------------- actions
def test_send_a_test_message(console: Console) -> None:
    r = console.post("/api/send", {"destination": "/queue/a.send", "body": "hi",
                                   "headers": {"color": "blue"}, "persistent": True})
    assert r.status_code == 200, r.text
    (m,) = receive_all(console.uri, "a.send", 1)
    assert m.text == "hi" and m.headers["color"] == "blue"


def test_purge(console: Console) -> None:
    send(console.uri, "a.purge", ["1", "2", "3"])
    r = console.post("/api/queues/a.purge/purge")
    assert r.status_code == 200 and "purged 3" in r.json()["message"]
    assert console.depth("a.purge") in (0, None)


def test_retry_one_then_all_from_the_dlq_to_the_original_destination(console: Console) -> None:
    dead_letter(console.uri, "a.retry", ["r1", "r2", "r3"])
    assert console.depth("DLQ.a.retry") == 3
    msgs = console.json("/api/queues/DLQ.a.retry/messages")["messages"]
    assert ["original-destination", "/queue/a.retry"] in msgs[0]["headers"]
    r = console.post("/api/queues/DLQ.a.retry/retry", {"ids": [msgs[0]["id"]]})
    assert r.status_code == 200, r.text
    assert console.depth("DLQ.a.retry") == 2 and console.depth("a.retry") == 1
    r = console.post("/api/queues/DLQ.a.retry/retry", {"all": True})
    assert r.status_code == 200 and "moved 2" in r.json()["message"]
    assert console.depth("DLQ.a.retry") == 0 and console.depth("a.retry") == 3
    got = sorted(m.text for m in receive_all(console.uri, "a.retry", 3))
    assert got == ["r1", "r2", "r3"]


def test_move_to_a_named_queue_and_delete_one(console: Console) -> None:
    send(console.uri, "a.move", ["m1", "m2"])
    first, second = console.json("/api/queues/a.move/messages")["messages"]
    r = console.post("/api/queues/a.move/move", {"ids": [first["id"]], "to": "a.moved"})
    assert r.status_code == 200, r.text
    assert console.depth("a.moved") == 1
    r = console.post(f"/api/queues/a.move/messages/{requests.utils.quote(second['id'], safe='')}/delete")
    assert r.status_code == 200, r.text
    assert console.depth("a.move") in (0, None)
    (m,) = receive_all(console.uri, "a.moved", 1)
    assert m.text == "m1" and m.headers.get("original-destination") == "/queue/a.move"


def test_close_a_connection(console: Console) -> None:
    with amqtransport.connect(console.uri) as c:
        c.send("/queue/a.conn", "x")
        conns = console.json("/api/connections")["connections"]
        assert len(conns) >= 1
        target = conns[0]["id"]
        r = console.post(f"/api/connections/{requests.utils.quote(target, safe='')}/close")
        assert r.status_code == 200, r.text
        assert all(x["id"] != target for x in console.json("/api/connections")["connections"])
    assert console.post("/api/connections/nope/close").status_code == 404


# ---------------------------------------------------------------------- CSRF, origin, host
def test_an_action_without_the_csrf_token_changes_nothing(console: Console) -> None:
    send(console.uri, "c.csrf", ["1"])
    for token in (None, "0" * 40):
        r = console.post("/api/queues/c.csrf/purge", token=token)
        assert r.status_code == 403, r.text
        assert "CSRF" in r.json()["error"]
    # a form post without a token (what another site could make a browser send)
    r = requests.post(console.url + "/api/queues/c.csrf/purge", data={"_next": "/"}, timeout=10,
                      allow_redirects=False)
    assert r.status_code == 403
    assert console.depth("c.csrf") == 1
    assert "refused POST /api/queues/c.csrf/purge" in console.proc.log_text()


def test_cross_origin_post_and_foreign_host_are_refused(console: Console) -> None:
    send(console.uri, "c.origin", ["1"])
    r = console.post("/api/queues/c.origin/purge", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    r = console.post("/api/queues/c.origin/purge", headers={"Origin": console.url})
    assert r.status_code == 200  # same origin is fine
    r = requests.get(console.url + "/api/overview", headers={"Host": "evil.example"}, timeout=10)
    assert r.status_code == 403  # DNS rebinding: a loopback-bound port answers loopback names only


def test_a_get_never_changes_state(console: Console) -> None:
    send(console.uri, "c.get", ["1"])
    for path in ("/api/queues/c.get/purge", "/api/send"):
        assert console.get(path).status_code in (404, 405)
    r = console.session.put(console.url + "/api/queues/c.get/purge", timeout=10)
    assert r.status_code == 405
    assert console.depth("c.get") == 1


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/api/send", {"body": "x"}, 400, "destination"),
    ("/api/send", {"destination": "/topic/x", "headers": "no colon here"}, 400, "headers line 1"),
    ("/api/send", {"destination": "/queue/x", "headers": {"a": ["list"]}}, 400, "headers"),
    ("/api/send", {"destination": "/queue/a.*", "body": "x"}, 400, "wildcard"),
    ("/api/send", {"destination": "/nowhere/x"}, 400, "must start with"),
    ("/api/queues/no.such/purge", {}, 404, "no queue"),
    ("/api/queues/bad.input/move", {"ids": ["x"]}, 400, "'to'"),
    ("/api/queues/bad.input/move", {"all": True, "ids": ["x"], "to": "y"}, 400, "either"),
    ("/api/queues/bad.input/move", {"all": True, "to": "/topic/t"}, 400, "only be moved to a queue"),
    ("/api/queues/bad.input/move", {"all": True, "to": "bad.input"}, 400, "the queue the messages are in"),
    ("/api/queues/bad.input/retry", {"all": "maybe"}, 400, "true or false"),
    ("/api/queues/bad.input/retry", {"all": True}, 400, "original-destination"),
    ("/api/queues/bad.input/messages/ID:nope/delete", {}, 404, "not waiting"),
    ("/api/queues/bad.input/frobnicate", {}, 404, "no API action"),
])
def test_bad_actions_are_refused_naming_the_problem(console: Console, path: str, body: dict, status: int,
                                                     words: str) -> None:
    if console.depth("bad.input") is None:
        send(console.uri, "bad.input", ["keep"])
    r = console.post(path, body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]
    assert console.depth("bad.input") == 1  # nothing moved, nothing lost


def test_bad_bodies(console: Console) -> None:
    token = console.token()
    r = console.session.post(console.url + "/api/send", data=b"{not json",
                             headers={"Content-Type": "application/json", "X-CSRF-Token": token}, timeout=10)
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    r = console.session.post(console.url + "/api/send", data=b"[1]",
                             headers={"Content-Type": "application/json", "X-CSRF-Token": token}, timeout=10)
    assert r.status_code == 400 and "object" in r.json()["error"]
    r = console.session.post(console.url + "/api/send", data=b"x",
                             headers={"Content-Type": "text/csv", "X-CSRF-Token": token}, timeout=10)
    assert r.status_code == 400 and "Content-Type" in r.json()["error"]
    r = console.session.post(console.url + "/api/send", data=b"x" * (2 << 20),
                             headers={"Content-Type": "application/json", "X-CSRF-Token": token}, timeout=10)
    assert r.status_code == 413


def _raw(console: Console, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", console.http_port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def test_malformed_http_gets_400_and_the_broker_goes_on(console: Console) -> None:
    assert _raw(console, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert _raw(console, b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n").startswith(b"HTTP/1.1 400")
    huge = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n"
    assert _raw(console, huge).split(b" ", 2)[1] in (b"400", b"431")
    assert console.get("/healthz").status_code == 200


def test_keep_alive_serves_several_requests_on_one_connection(console: Console) -> None:
    req = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    out = _raw(console, req + req + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200 OK") == 3


def _keep_alive_connection(console: Console) -> socket.socket:
    """A connection that made one keep-alive request, read its answer and now idles."""
    sock = socket.create_connection(("127.0.0.1", console.http_port), timeout=10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"loop answers\n"):
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data
    return sock


def test_idle_keep_alive_connections_do_not_starve_the_probes(console: Console) -> None:
    """Issue 23, defect 3: 64 idle keep-alive connections (the port's budget) and 16
    that never sent a byte; then 45 /healthz probes, each on a new connection: every one
    answered (the connection idle longest makes room). Before: the 65th connection was
    closed at once, so all 45 probes failed."""
    socks = [_keep_alive_connection(console) for _ in range(64)]
    socks += [socket.create_connection(("127.0.0.1", console.http_port), timeout=10) for _ in range(16)]
    try:
        codes = []
        for _ in range(45):
            try:
                codes.append(requests.get(console.url + "/healthz", timeout=5,
                                          headers={"Connection": "close"}).status_code)
            except requests.RequestException as exc:
                codes.append(repr(exc))
        assert codes == [200] * 45, codes
    finally:
        for sock in socks:
            sock.close()


def test_an_idle_keep_alive_connection_is_closed(console: Console) -> None:
    """A kept-alive connection that starts no new request is closed after the idle
    timeout (5 s; it was 30 s)."""
    sock = _keep_alive_connection(console)
    with sock:
        sock.settimeout(15)
        t0 = time.monotonic()
        assert sock.recv(4096) == b"", "the server wrote something on an idle connection"
        assert time.monotonic() - t0 < 14


# ---------------------------------------------------------------------- pages
def test_pages_render_and_escape(console: Console) -> None:
    send(console.uri, "p.<b>q", ["<script>alert(1)</script>"])
    for path in ("/", "/destinations", "/connections", "/queues/p.%3Cb%3Eq"):
        r = console.get(path)
        assert r.status_code == 200, (path, r.status_code)
        assert r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert "<b>q" not in r.text and "<script>alert" not in r.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in console.get("/queues/p.%3Cb%3Eq").text
    assert console.get("/queues/none.such").status_code == 404
    assert console.get("/nowhere").status_code == 404
    assert console.get("/static/console.js").headers["content-type"].startswith("text/javascript")
    assert console.get("/static/../app.py").status_code == 404


def test_a_form_post_without_javascript_redirects_back_with_the_outcome(console: Console) -> None:
    send(console.uri, "f.form", ["1", "2"])
    page = console.get("/queues/f.form").text
    token = page.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    r = console.session.post(console.url + "/api/queues/f.form/purge",
                             data={"csrf_token": token, "_next": "/queues/f.form"}, timeout=10,
                             allow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"].startswith("/queues/f.form?msg=purged%202")
    r = console.session.post(console.url + "/api/queues/f.form/purge",
                             data={"csrf_token": token, "_next": "https://evil.example/"}, timeout=10,
                             allow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/?msg=")  # never off-site


def test_http_flag_validation(tmp_path: Path) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "amqtransport", "broker", "run", "--port", "0", "--data-dir",
                        str(tmp_path / "d"), "--http", "127.0.0.1:notaport"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "http" in r.stderr and "HOST:PORT" in r.stderr
    cfg = tmp_path / "b.toml"
    cfg.write_text('http = "::"\n')
    r = subprocess.run([sys.executable, "-m", "amqtransport", "broker", "run", "--port", "0", "--data-dir",
                        str(tmp_path / "d"), "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "key 'http'" in r.stderr


def test_http_port_in_use_is_an_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "amqtransport", "broker", "run", "--port", "0", "--data-dir",
                            str(tmp_path / "d"), "--http", f"127.0.0.1:{port}"], capture_output=True, text=True,
                           timeout=60)
    assert r.returncode == 1 and f"cannot listen on http 127.0.0.1:{port}" in r.stderr


def test_json_is_json(console: Console) -> None:
    for path in ("/api/overview", "/api/node", "/api/nodes", "/api/destinations", "/api/connections",
                 "/api/session"):
        r = console.get(path)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        json.loads(r.text)
    assert console.get("/api/nope").status_code == 404


def test_readyz_turns_503_when_flow_control_holds_too_long(tmp_path: Path) -> None:
    config = "memory_limit = 4096\nhttp_ready_flow_control_seconds = 0.3\n"
    with running_console(tmp_path, config=config, name="flow") as c:
        # the second one engages flow control (non-persistent: persistent ones would be paged)
        send(c.uri, "full.q", ["x" * 3000, "y" * 3000], persistent=False)
        deadline = time.monotonic() + 10
        while c.get("/readyz").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = c.get("/readyz")
        assert r.status_code == 503 and "flow control has held" in r.text
        text = c.metrics()
        assert metric(text, "amq_memory_flow_control") == 1 and metric(text, "amq_ready") == 0
        assert c.get("/healthz").status_code == 200  # alive all the same
        assert c.post("/api/queues/full.q/purge").status_code == 200  # frees the memory
        assert c.get("/readyz").status_code == 200


def test_readyz_turns_503_when_the_store_limit_holds_producers_too_long(tmp_path: Path) -> None:
    """The store limit's flow control (persistent producers parked at ``store_limit``)
    counts for readiness as memory's does: 503 with the reason once it has held for
    ``http_ready_flow_control_seconds``; ready again once compaction frees the store."""
    config = ("segment_size = 4096\nstore_limit = 32768\ncompact_interval_ms = 50\n"
              "http_ready_flow_control_seconds = 0.3\n")
    with running_console(tmp_path, config=config, name="storefull") as c:
        sender = threading.Thread(target=send, args=(c.uri, "store.q", ["s" * 3000] * 14), daemon=True)
        sender.start()  # about 11 fill the store; the rest wait for space
        wait_for(lambda: metric(c.metrics(), "amq_store_flow_control") == 1, 20, "store flow control")
        assert sender.is_alive(), "no send was held by the store limit"
        wait_for(lambda: c.get("/readyz").status_code == 503, 10, "/readyz 503")
        r = c.get("/readyz")
        assert "flow control has held" in r.text and "store limit" in r.text and "store_limit=32768" in r.text
        text = c.metrics()
        assert metric(text, "amq_ready") == 0 and (metric(text, "amq_store_flow_control_seconds") or 0) >= 0.3
        assert metric(text, "amq_memory_flow_control") == 0  # the store, not memory
        assert c.json("/api/node")["store"]["flow_control"] is True
        assert c.get("/healthz").status_code == 200  # alive all the same
        assert c.post("/api/queues/store.q/purge").status_code == 200  # compaction frees the store
        wait_for(lambda: c.get("/readyz").status_code == 200, 20, "/readyz 200 after the purge")
        sender.join(20)
        assert not sender.is_alive(), "the held sends never went through"


def test_actions_reach_paged_messages(tmp_path: Path) -> None:
    """With a window of 2 messages in memory the rest of a queue is paged (on disk):
    browse reads them back in order, delete and move find them, purge takes them all."""
    with running_console(tmp_path, config="page_window = 2\n", name="paged") as c:
        send(c.uri, "p.q", [f"m{i}" for i in range(8)])
        page = c.json("/api/queues/p.q/messages")
        assert page["total"] == 8 and [m["body"] for m in page["messages"]] == [f"m{i}" for i in range(8)]
        assert [m["body"] for m in c.json("/api/queues/p.q/messages?offset=3&limit=2")["messages"]] == ["m3", "m4"]
        ids = [m["id"] for m in page["messages"]]
        r = c.post(f"/api/queues/p.q/messages/{requests.utils.quote(ids[5], safe='')}/delete")  # a paged one
        assert r.status_code == 200, r.text
        r = c.post("/api/queues/p.q/move", {"ids": [ids[1], ids[6]], "to": "p.moved"})  # one of each
        assert r.status_code == 200 and "moved 2" in r.json()["message"], r.text
        assert c.depth("p.q") == 5 and c.depth("p.moved") == 2
        assert [m.text for m in receive_all(c.uri, "p.moved", 2)] == ["m1", "m6"]
        r = c.post("/api/queues/p.q/purge")
        assert r.status_code == 200 and "purged 5" in r.json()["message"]
        assert c.depth("p.q") in (0, None)
