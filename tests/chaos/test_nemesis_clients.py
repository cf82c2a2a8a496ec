"""The nemesis pair's clients: the URI they connect with (runner.pair_uri) gives every
leaf a connectTimeout of one link timeout, and the harness's ClientSettings leaves that
URI option in force (no keyword overrides it)."""

from __future__ import annotations

from typing import Any

import pytest

import amqtransport
from amqtransport.options import FailoverOptions
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
