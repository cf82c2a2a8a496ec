"""The two brokers of a differential test: the same scenario against our broker and
against ActiveMQ 5.17, the results compared (docs/brokers/activemq-compat.md).

A module declares its fixture with :data:`BROKERS` and lets :func:`broker` start the
one asked for, once per module (ActiveMQ is a JVM: never one per test)::

    @pytest.fixture(scope="module", params=BROKERS)
    def broker_uri(request, tmp_path_factory):
        with broker(request.param, tmp_path_factory, "priority", extra_xml=POLICY) as uri:
            yield uri
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqtransport.broker import BrokerConfig, EmbeddedBroker
from amqtransport.processes.activemq import ActiveMQNode
from amqtransport.testing.pytest_fixtures import require_activemq

__all__ = ["BROKERS", "broker"]

#: the fixture's params: ours, and ActiveMQ (marked, so ``-m 'not activemq'`` leaves it out)
BROKERS = ["amq", pytest.param("activemq", marks=pytest.mark.activemq)]


@contextlib.contextmanager
def broker(kind: str, tmp_path_factory: pytest.TempPathFactory, name: str, *,
           config: BrokerConfig | None = None, **activemq: Any) -> Iterator[str]:
    """``tcp://`` of our in-process broker (``config``) or of an ActiveMQ 5.17 node
    (``activemq``: :class:`ActiveMQNode`'s options, e.g. ``extra_xml``, ``scheduler``)."""
    if kind == "amq":
        b = EmbeddedBroker(port=0, data_dir=tmp_path_factory.mktemp(f"amq-{name}"), config=config or BrokerConfig())
        b.start()
        try:
            yield f"tcp://127.0.0.1:{b.port}"
        finally:
            b.stop()
        return
    require_activemq()
    node = ActiveMQNode(Path(tmp_path_factory.mktemp(f"activemq-{name}")), name, **activemq)
    node.start()
    try:
        yield node.uri
    finally:
        node.stop(timeout=5)
