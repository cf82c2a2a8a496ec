"""pytest fixtures that run a real RabbitMQ (registered by tests/conftest.py).

- ``rabbitmq_node`` (session): one node for the whole run, started on first use
  (5-15 s) and stopped at the end. Use unique destination names per test: the node
  and its durable queues are shared.
- ``rabbitmq`` (function): the same node, checked to be serving first (a test that
  killed it and failed before restarting it does not break the next one).

They skip only when RabbitMQ is not installed, with the reason. ``AMQ_REQUIRE_RABBITMQ=1``
makes that a failure instead (CI, where ``scripts/setup.sh`` installs it). A node that
is installed but does not start is an error, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from amqtransport.testing.rabbitmq import RabbitMQNode, missing_reason

__all__ = ["rabbitmq", "rabbitmq_node", "require_rabbitmq"]


def require_rabbitmq() -> None:
    """Skip the calling test (or fail, with AMQ_REQUIRE_RABBITMQ=1) when RabbitMQ cannot run."""
    reason = missing_reason()
    if reason is None:
        return
    if os.environ.get("AMQ_REQUIRE_RABBITMQ") == "1":
        pytest.fail(f"AMQ_REQUIRE_RABBITMQ=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def rabbitmq_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQNode]:
    """One RabbitMQ node for the session (``.uri``, ``.stomp_port``, ``.kill()``, ``.start()``)."""
    require_rabbitmq()
    node = RabbitMQNode(tmp_path_factory.mktemp("rabbitmq"), "amqtest")
    try:
        node.start()
        yield node
    finally:
        node.stop()


@pytest.fixture
def rabbitmq(rabbitmq_node: RabbitMQNode) -> RabbitMQNode:
    """The session node, serving (restarted if an earlier test left it down)."""
    if not rabbitmq_node.is_serving():
        if rabbitmq_node.alive:
            rabbitmq_node.wait_until_serving(60)
        else:
            rabbitmq_node.start()
    return rabbitmq_node
