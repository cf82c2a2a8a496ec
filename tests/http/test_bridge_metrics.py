"""The bridge's /metrics: the client-side counterparts of the broker's families
(connected per side, forwarded per destination, in flight, failovers, forward time)."""

from __future__ import annotations

import pytest
import requests

from bridge.status import StatusRegistry, StatusServer


def test_bridge_metrics_families() -> None:
    parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client is a dev dependency")
    reg = StatusRegistry()
    st = reg.register("hub", connector="c", service="failover:(tcp://a:1,tcp://b:2)")
    st.up(lambda: "tcp://b:2", lambda: None)
    st.add_in_flight(5)
    st.add_in_flight(-3)
    st.add_forwarded(3, "/queue/orders")
    st.add_forwarded(2, "/topic/prices")
    st.failover()
    st.forward_seconds.observe(0.003)
    with StatusServer(reg) as server:
        text = requests.get(server.url + "/metrics", timeout=5).text
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    connected = {s.labels["side"]: s.value for s in fams["amq_bridge_connected"].samples}
    assert connected == {"local": 0.0, "remote": 1.0}
    per_dest = {s.labels["destination"]: s.value for s in fams["amq_bridge_destination_forwarded"].samples}
    assert per_dest == {"/queue/orders": 3.0, "/topic/prices": 2.0}
    assert fams["amq_bridge_in_flight"].samples[0].value == 2
    assert fams["amq_bridge_failovers"].samples[0].value == 1
    assert fams["amq_bridge_forward_duration_seconds"].type == "histogram"
    count = [s for s in fams["amq_bridge_forward_duration_seconds"].samples if s.name.endswith("_count")]
    assert count[0].value == 1
    assert fams["amq_bridge_uptime_seconds"].samples[0].value >= 0
    st.add_in_flight(-10)
    assert st.snapshot()["in_flight"] == 0  # never negative
