"""The nemesis pair's clients: the URI they connect with (runner.pair_uri) gives every
leaf a connectTimeout of one link timeout, the harness's ClientSettings leaves that
URI option in force (no keyword overrides it), and their heart-beats find a silent
master within the witness's lease."""

from __future__ import annotations

from typing import Any

import pytest

import amqtransport
from amqtransport.broker.config import BrokerConfig
from amqtransport.options import FailoverOptions
from amqtransport.stomp import negotiate_heartbeat
from amqtransport.transports.link import ConnectParams, connect_timeout_for
from amqtransport.uri import CompositeUri, parse_uri
from chaos.harness.clients import ClientSettings
from chaos.nemesis.runner import NemesisParams, pair_uri


class Stage:
    """The one method of chaos.harness.cluster.Stage that pair_uri reads."""

    def uri(self, *, timeout_ms: int = -1, max_reconnect_delay_ms: int = 500) -> str:
        return ("failover:(tcp://127.0.0.1:20001,tcp://127.0.0.1:20002)?randomize=false&initialReconnectDelay=20"
                f"&maxReconnectDelay={max_reconnect_delay_ms}&timeout={timeout_ms}")


@pytest.mark.parametrize("link_timeout_s", [1.0, 2.5])
def test_every_leaf_of_the_pair_uri_times_out_a_silent_connect_after_one_link_timeout(link_timeout_s: float) -> None:
    params = NemesisParams(link_timeout_s=link_timeout_s)
    node = parse_uri(pair_uri(Stage(), params))  # type: ignore[arg-type]
    assert isinstance(node, CompositeUri) and isinstance(node.options, FailoverOptions)
    assert node.options.randomize is False and node.options.timeout == params.client_timeout_ms
    leaves = list(node.leaves())
    assert len(leaves) == 2
    for leaf in leaves:
        assert leaf.options.connect_timeout == round(link_timeout_s * 1000)
        assert connect_timeout_for(leaf, ConnectParams()) == pytest.approx(link_timeout_s)


def test_client_settings_without_a_connect_timeout_leave_the_uris_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_connect(uri: str, **kwargs: Any) -> object:
        seen.update(kwargs, uri=uri)
        return object()

    monkeypatch.setattr(amqtransport, "connect", fake_connect)
    uri = pair_uri(Stage(), NemesisParams())  # type: ignore[arg-type]
    ClientSettings(uri=uri, connect_timeout_s=None).connect()
    node = parse_uri(seen["uri"])
    params = ConnectParams(connect_timeout=seen["connect_timeout"])
    assert [connect_timeout_for(leaf, params) for leaf in node.leaves()] == [1.0, 1.0]
    ClientSettings(uri=uri).connect()  # the scenarios' explicit 2 s still wins
    assert seen["connect_timeout"] == 2.0


def test_the_pair_clients_notice_a_silent_master_within_its_lease() -> None:
    """A frozen master is noticed by the clients' read deadline (2 heart-beat intervals,
    negotiated with the broker's defaults) no later than the witness lets the standby
    take over (the lease, 1.5 x the link timeout), so their reconnect pass runs while
    the standby comes up (and cuts the frozen node's silent CONNECT when it does)."""
    params = NemesisParams()
    cfg = BrokerConfig()
    broker_offer = (cfg.heartbeat_send_min_ms, cfg.heartbeat_receive_min_ms)
    _, expect_ms = negotiate_heartbeat((params.heartbeat_ms, params.heartbeat_ms), broker_offer)
    assert 2 * expect_ms <= 1.5 * params.link_timeout_s * 1000
