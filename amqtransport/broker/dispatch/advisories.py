"""Consumer advisories (ActiveMQ's ``ActiveMQ.Advisory.Consumer.Queue.X`` topics)."""

from __future__ import annotations

import json

from amqtransport.destinations import QUEUE, QUEUE_PREFIX, TOPIC_PREFIX, advisory_name, match

from .message import Message
from .model import Subscription
from .registry import Registry
from .topics import FanOut

__all__ = ["Advisories"]


class Advisories:
    """Consumer advisories: ``/topic/ActiveMQ.Advisory.Consumer.Queue.X`` (header
    ``consumerCount``) whenever a queue gains or loses a consumer; a new advisory
    subscriber is told the current counts."""

    def __init__(self, reg: Registry, fanout: FanOut) -> None:
        self.reg = reg
        self.fanout = fanout

    def message(self, queue_dest: str, count: int) -> Message:
        name = queue_dest[len(QUEUE_PREFIX) :] if queue_dest.startswith(QUEUE_PREFIX) else queue_dest
        topic = advisory_name(QUEUE, name)
        body = json.dumps({"destination": queue_dest, "consumerCount": count}).encode()
        return Message(
            id=self.reg.new_id(),
            destination=f"{TOPIC_PREFIX}{topic}",
            headers=(
                ("consumerCount", str(count)),
                ("advisoryType", "ConsumerInfo"),
                ("originDestination", queue_dest),
                ("content-type", "application/json"),
            ),
            body=body,
            timestamp=self.reg.clock(),
        )

    def advise(self, queue_dest: str, count: int) -> None:
        reg = self.reg
        if not reg.config.advisories or not queue_dest.startswith(QUEUE_PREFIX):
            return
        name = queue_dest[len(QUEUE_PREFIX) :]
        topic = advisory_name(QUEUE, name)
        if topic not in reg.topics and not reg.wildcard_subs:
            return
        msg = self.message(queue_dest, count)
        self.fanout.publish(topic, msg, None)

    def advise_current(self, sub: Subscription) -> None:
        reg = self.reg
        if not reg.config.advisories:
            return
        for key, q in list(reg.queues.items()):
            if not key.startswith(QUEUE_PREFIX) or not q.consumers:
                continue
            topic_parts = advisory_name(QUEUE, key[len(QUEUE_PREFIX):]).split(".")
            wanted = match(sub.pattern, topic_parts) if sub.pattern else ".".join(topic_parts) == sub.name
            if wanted:
                self.fanout.offer(sub, self.message(key, len(q.consumers)))
