"""Bridge status: JSON and Prometheus over real HTTP, and `amq bridge status`."""

from __future__ import annotations

import json
import urllib.request

import pytest
from click.testing import CliRunner

from amqtransport.cli.bridge_cmd import bridge as bridge_cli
from bridge.status import StatusRegistry, StatusServer, render_table


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.headers["Content-Type"], resp.read().decode()


@pytest.fixture
def served() -> tuple[StatusRegistry, StatusServer]:
    reg = StatusRegistry()
    server = StatusServer(reg, "127.0.0.1", 0).start()
    yield reg, server
    server.stop()


def test_remote_is_read_live_from_the_probe(served: tuple[StatusRegistry, StatusServer]) -> None:
    reg, server = served
    st = reg.register("nc", connector="nc", service="failover:(tcp://a:1,tcp://b:2)")
    current = {"addr": "tcp://127.0.0.1:1"}
    st.connecting()
    assert reg.snapshot()["bridges"][0]["state"] == "connecting"
    assert st.up(lambda: current["addr"]) == 1
    _, ctype, body = _get(server.url + "/status")
    assert ctype == "application/json"
    data = json.loads(body)
    assert list(data) == ["bridges"]
    b = data["bridges"][0]
    assert {"name", "state", "remote", "forwarded", "failed", "rebuilds", "last_error"} <= set(b)
    assert (b["name"], b["state"], b["remote"], b["rebuilds"]) == ("nc", "up", "tcp://127.0.0.1:1", 0)
    # the connection moved by itself: the next request shows where it is now
    current["addr"] = "tcp://127.0.0.1:2"
    assert json.loads(_get(server.url + "/status")[2])["bridges"][0]["remote"] == "tcp://127.0.0.1:2"
    # between brokers: no address rather than a stale one
    current["addr"] = None  # type: ignore[assignment]
    assert json.loads(_get(server.url + "/status")[2])["bridges"][0]["remote"] is None


def test_down_and_rebuild_counts(served: tuple[StatusRegistry, StatusServer]) -> None:
    reg, server = served
    st = reg.register("nc", connector="nc", service="s")
    st.up(lambda: "tcp://h:1")
    st.add_forwarded(5)
    st.down(ConnectionError("boom"))
    snap = reg.snapshot()["bridges"][0]
    assert snap["state"] == "down" and snap["remote"] is None and "boom" in snap["last_error"]
    assert st.up(lambda: "tcp://h:2") == 2
    st.add_failed(2)
    st.add_suppressed(1)
    snap = json.loads(_get(server.url + "/status")[2])["bridges"][0]
    assert (snap["rebuilds"], snap["forwarded"], snap["failed"], snap["suppressed"]) == (1, 5, 2, 1)


def test_probe_that_raises_does_not_break_status(served: tuple[StatusRegistry, StatusServer]) -> None:
    reg, server = served
    st = reg.register("nc", connector="nc", service="s")

    def broken() -> str:
        raise RuntimeError("closed")

    st.up(broken)
    assert json.loads(_get(server.url + "/status")[2])["bridges"][0]["remote"] is None


def test_metrics_text(served: tuple[StatusRegistry, StatusServer]) -> None:
    reg, server = served
    a = reg.register("a", connector="a", service="s")
    reg.register("b", connector="b", service='we"ird')
    a.up(lambda: "tcp://127.0.0.1:9")
    a.add_forwarded(3)
    _, ctype, text = _get(server.url + "/metrics")
    assert ctype.startswith("text/plain; version=0.0.4")
    assert 'amq_bridge_up{bridge="a"} 1' in text
    assert 'amq_bridge_up{bridge="b"} 0' in text
    assert 'amq_bridge_forwarded_total{bridge="a"} 3' in text
    assert 'amq_bridge_state{bridge="b",state="down"} 1' in text
    assert 'remote="tcp://127.0.0.1:9"' in text
    assert 'service="we\\"ird"' in text
    assert "# TYPE amq_bridge_rebuilds_total counter" in text


def test_unknown_path_is_404(served: tuple[StatusRegistry, StatusServer]) -> None:
    _, server = served
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.url + "/nope", timeout=5)
    assert info.value.code == 404


def test_cli_status_table_and_json(served: tuple[StatusRegistry, StatusServer]) -> None:
    reg, server = served
    st = reg.register("spoke1-to-hub", connector="spoke1-to-hub", service="s")
    st.up(lambda: "tcp://127.0.0.1:61643")
    st.add_forwarded(7)
    runner = CliRunner()
    res = runner.invoke(bridge_cli, ["status", "--url", server.url])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:3] == ["NAME", "STATE", "REMOTE"]
    assert lines[1].split()[:4] == ["spoke1-to-hub", "up", "tcp://127.0.0.1:61643", "7"]
    res = runner.invoke(bridge_cli, ["status", "--url", server.url, "--json"])
    assert res.exit_code == 0
    assert json.loads(res.output)["bridges"][0]["remote"] == "tcp://127.0.0.1:61643"


def test_cli_status_unreachable_agent() -> None:
    from amqtransport.testing.ports import free_port

    res = CliRunner().invoke(bridge_cli, ["status", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2"])
    assert res.exit_code == 1
    assert "cannot read" in res.output


def test_render_table_empty() -> None:
    assert "(no bridges)" in render_table({"bridges": []})
