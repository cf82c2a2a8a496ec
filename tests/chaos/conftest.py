"""Fixtures for the chaos proxy tests: a real server on port 0, real upstream servers.

Everything binds 127.0.0.1 on port 0 and is stopped by its fixture, even on failure.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer

from chaos.proxy.server import ToxiproxyServer
from chaos.proxy.testing import UpstreamServer, echo_handler, greet_and_close_handler


@pytest.fixture
def toxiproxy_server() -> Iterator[ToxiproxyServer]:
    server = ToxiproxyServer(port=0).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def toxi(toxiproxy_server: ToxiproxyServer) -> Iterator[Toxiproxy]:
    """The PyPI ``toxiproxy-python`` client, pointed at our server."""
    saved = (APIConsumer.host, APIConsumer.port)
    client = Toxiproxy()
    client.update_api_consumer("127.0.0.1", toxiproxy_server.port)
    try:
        yield client
    finally:
        APIConsumer.host, APIConsumer.port = saved


@pytest.fixture
def echo_server() -> Iterator[UpstreamServer]:
    server = UpstreamServer(echo_handler)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def greet_server() -> Iterator[UpstreamServer]:
    server = UpstreamServer(greet_and_close_handler)
    try:
        yield server
    finally:
        server.close()
