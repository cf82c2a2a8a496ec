"""pytest fixtures that run real ActiveMQ Classic brokers (registered by tests/conftest.py).

- ``activemq_node`` (session): one node, started once for the whole run. Share it; do
  not kill it (use ``activemq_pair`` or ``activemq_factory`` to break things). Use
  unique destination names per test, since the store is shared across tests.
- ``activemq_pair`` (function): a fresh shared-store master/slave pair
  (``lock_interval_ms=500``), stopped after the test even when it fails.
- ``activemq_factory`` (function): ``.node(name, **kwargs)`` / ``.pair(**kwargs)`` build
  started nodes and pairs with other settings (``openwire=True``, ``lock_keepalive_ms``,
  ...); all of them are stopped after the test.

The fixtures skip only when ActiveMQ (or java) is not installed, with the reason. Set
``AMQ_REQUIRE_ACTIVEMQ=1`` to make that a failure instead (CI, where setup installs it).
A broker that is installed but does not start is an error, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqtransport.processes.activemq import ActiveMQNode, ActiveMQPair, missing_reason

__all__ = ["activemq_factory", "activemq_node", "activemq_pair", "require_activemq"]


def require_activemq() -> None:
    """Skip the calling test (or fail, with AMQ_REQUIRE_ACTIVEMQ=1) when ActiveMQ cannot run."""
    reason = missing_reason()
    if reason is None:
        return
    if os.environ.get("AMQ_REQUIRE_ACTIVEMQ") == "1":
        pytest.fail(f"AMQ_REQUIRE_ACTIVEMQ=1 but {reason}", pytrace=False)
    pytest.skip(reason)


class ActiveMQFactory:
    """Builds started nodes and pairs under one directory and stops them all in :meth:`close`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._nodes: list[ActiveMQNode] = []
        self._pairs: list[ActiveMQPair] = []

    def node(self, name: str, *, start: bool = True, **kwargs: Any) -> ActiveMQNode:
        node = ActiveMQNode(self.workdir, name, **kwargs)
        self._nodes.append(node)
        if start:
            node.start()
        return node

    def pair(self, name: str = "pair", *, start: bool = True, **kwargs: Any) -> ActiveMQPair:
        pair = ActiveMQPair(self.workdir / name, **kwargs)
        self._pairs.append(pair)
        if start:
            pair.start()
        return pair

    def close(self) -> None:
        for pair in self._pairs:
            pair.kill()
        for node in self._nodes:
            node.kill()


@pytest.fixture(scope="session")
def activemq_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQNode]:
    """One ActiveMQ node for the whole session (``.uri``, ``.stomp_port``)."""
    require_activemq()
    node = ActiveMQNode(tmp_path_factory.mktemp("activemq-node"), "session")
    try:
        node.start()
        yield node
    finally:
        node.stop(timeout=5)


@pytest.fixture
def activemq_pair(tmp_path: Path) -> Iterator[ActiveMQPair]:
    """A fresh shared-store pair: ``.master`` serves, ``.slave`` waits on the lock; ``.uri`` is failover:(...)."""
    require_activemq()
    pair = ActiveMQPair(tmp_path / "activemq-pair", lock_interval_ms=500)
    try:
        pair.start()
        yield pair
    finally:
        pair.kill()  # the data is thrown away: no need for a graceful stop


@pytest.fixture
def activemq_factory(tmp_path: Path) -> Iterator[ActiveMQFactory]:
    """``.node(name, **kw)`` and ``.pair(name="pair", **kw)`` for custom setups, all stopped afterwards."""
    require_activemq()
    factory = ActiveMQFactory(tmp_path / "activemq")
    try:
        yield factory
    finally:
        factory.close()
