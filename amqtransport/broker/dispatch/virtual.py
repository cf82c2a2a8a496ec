"""Virtual topics, as ActiveMQ's default ``virtualDestinationInterceptor`` has them.

Theory of operation
-------------------
A message published to ``/topic/VirtualTopic.X`` is also copied into every queue named
``/queue/Consumer.<name>.VirtualTopic.X`` that exists (``<name>`` is one segment, as in
ActiveMQ's default ``prefix="Consumer.*."``); inside each queue its consumers share the
copies as on any queue (load-balanced), so each ``<name>`` is one logical subscriber.

"Exists" is ActiveMQ's rule, checked against 5.17: the queue starts receiving once it
has been created -- by a consumer subscribing to it or a producer sending to it -- and
keeps receiving after its consumers leave (a message published before the queue
existed is not copied into it; one published while it has no consumer waits in it).

Such a queue is a durable subscription of the topic whose queue is the consumer queue
itself: :func:`virtual_subscription` makes its :class:`~..store.Sub` record, which the
registry writes to the journal (so the queue keeps receiving across a restart and a
takeover, replicated like any record) and registers, and the topic's fan-out
(:meth:`~.topics.FanOut.durable_copies`) copies into it as into a durable subscription's
queue -- in the same atomic journal record as the other copies -- except that the copy
keeps the consumer queue as its ``destination`` and names the topic in
``original-destination``, as ActiveMQ's does.

Pure: no I/O.
"""

from __future__ import annotations

from amqtransport.destinations import QUEUE_PREFIX

from ..store import Sub

__all__ = ["VIRTUAL_CONSUMER_PREFIX", "virtual_subscription", "virtual_topic_of"]

VIRTUAL_CONSUMER_PREFIX = QUEUE_PREFIX + "Consumer."
_TOPIC_PREFIX = "VirtualTopic."


def virtual_topic_of(queue_key: str) -> str | None:
    """The virtual topic a consumer queue receives from (``/queue/Consumer.A.VirtualTopic.X``
    -> ``VirtualTopic.X``), or None for any other queue."""
    if not queue_key.startswith(VIRTUAL_CONSUMER_PREFIX):
        return None
    name, dot, topic = queue_key[len(VIRTUAL_CONSUMER_PREFIX) :].partition(".")
    if not name or not dot or not topic.startswith(_TOPIC_PREFIX) or len(topic) == len(_TOPIC_PREFIX):
        return None
    if name in ("*", ">") or any(part in ("*", ">") for part in topic.split(".")):
        return None  # a wildcard consumer, not a consumer queue
    return topic


def virtual_subscription(queue_key: str) -> Sub | None:
    """The subscription record that makes consumer queue ``queue_key`` receive its
    virtual topic's messages; None when it is no consumer queue."""
    topic = virtual_topic_of(queue_key)
    if topic is None:
        return None
    return Sub(queue_key, topic, "", queue_key)
