"""Virtual topics in our broker beyond the differential test: a consumer queue keeps
receiving across restarts (its subscription record is in the journal), the copies of a
receipted publish survive kill -9, and the name rule (virtual.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import amqtransport
from amqtransport.broker.dispatch.virtual import virtual_topic_of
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(120)

X = "VirtualTopic.orders"


def uri(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def drain(port: int, dest: str) -> list[str]:
    with amqtransport.connect(uri(port)) as c:
        sub = c.subscribe(dest)
        out: list[str] = []
        while (m := sub.receive(timeout=1.0)) is not None:
            out.append(m.text)
        return out


def test_a_consumer_queue_keeps_receiving_across_restarts(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        with amqtransport.connect(uri(bp.port)) as c:
            c.subscribe(f"/queue/Consumer.A.{X}").unsubscribe()  # the queue exists, empty, no consumer
        bp.kill()
        bp.start()  # ActiveMQ keeps the (empty) queue: so do we
        with amqtransport.connect(uri(bp.port)) as c:
            c.send(f"/topic/{X}", "m1")  # returns once its receipt is in
        bp.kill()
        bp.start()
        assert drain(bp.port, f"/queue/Consumer.A.{X}") == ["m1"]
        assert drain(bp.port, f"/queue/Consumer.B.{X}") == []  # never existed before m1


@pytest.mark.parametrize(
    ("queue", "topic"),
    [
        ("/queue/Consumer.A.VirtualTopic.X", "VirtualTopic.X"),
        ("/queue/Consumer.A.VirtualTopic.X.Y", "VirtualTopic.X.Y"),
        ("/queue/Consumer.A.B.VirtualTopic.X", None),  # the consumer name is one segment
        ("/queue/Consumer.A.VirtualTopic.", None),
        ("/queue/Consumer..VirtualTopic.X", None),
        ("/queue/Consumer.*.VirtualTopic.X", None),  # a wildcard consumer
        ("/queue/Consumer.A.Plain.X", None),
        ("/topic/Consumer.A.VirtualTopic.X", None),
    ],
)
def test_which_queues_are_consumer_queues(queue: str, topic: str | None) -> None:
    assert virtual_topic_of(queue) == topic
