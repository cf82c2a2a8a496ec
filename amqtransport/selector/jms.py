"""The message a selector sees: ActiveMQ's STOMP -> JMS mapping (its ``FrameTranslator``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .values import JLong, NumberFormat, Value, parse_int

__all__ = ["JMS_NAMES", "MessageView", "message_view"]


class MessageView:
    """One message as a selector sees it: ``props`` (property name -> value) and the JMS headers."""

    __slots__ = ("props", "jms")

    def __init__(self, props: Mapping[str, Value], jms: dict[str, Value]) -> None:
        self.props = props
        self.jms = jms


JMS_NAMES = frozenset(
    {
        "JMSDestination", "JMSReplyTo", "JMSType", "JMSDeliveryMode", "JMSPriority", "JMSMessageID",
        "JMSTimestamp", "JMSCorrelationID", "JMSExpiration", "JMSRedelivered", "JMSXDeliveryCount",
        "JMSXGroupID", "JMSXUserID", "JMSXGroupSeq", "JMSXProducerTXID", "JMSActiveMQBrokerInTime",
        "JMSActiveMQBrokerOutTime", "JMSActiveMQBrokerPath", "JMSXGroupFirstForConsumer",
    }
)


# ---------------------------------------------------------------------------- STOMP -> JMS
_REMOVED = frozenset({"destination", "receipt", "transaction", "content-length", "message-id", "redelivered", "subscription", "JMSXUserID"})
_LONG_PROPS = frozenset({"AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD"})


def _reply_to(dest: str) -> str | None:
    for prefix, scheme in (("/queue/", "queue://"), ("/topic/", "topic://"), ("/temp-queue/", "temp-queue://"), ("/temp-topic/", "temp-topic://")):
        if dest.startswith(prefix):
            return scheme + dest[len(prefix) :]
    return None


def _java_long(text: str, default: int = 0) -> int:
    try:
        return parse_int(text, 64)
    except NumberFormat:
        return default


def message_view(
    headers: Sequence[tuple[str, str]],
    *,
    message_id: str,
    destination: str,
    timestamp_ms: int,
    delivery_count: int = 0,
) -> MessageView:
    """The message a selector sees, from a SEND's headers, as ActiveMQ's STOMP
    connector builds it (``FrameTranslator``). ``destination`` is ``/queue/X`` or
    ``/topic/X``; ``delivery_count`` the deliveries so far (JMSRedelivered when > 0)."""
    props: dict[str, Value] = {}
    jms: dict[str, Value] = {
        "JMSMessageID": message_id,
        "JMSDestination": _reply_to(destination),
        "JMSPriority": 4,
        "JMSTimestamp": JLong(timestamp_ms),
        "JMSExpiration": JLong(0),
        "JMSDeliveryMode": "NON_PERSISTENT",
        "JMSRedelivered": delivery_count > 0,
        "JMSXDeliveryCount": delivery_count + 1,
        "JMSXGroupSeq": 0,
        "JMSXGroupFirstForConsumer": False,
    }
    seen: set[str] = set()
    for k, v in headers:
        if k in seen:
            continue
        seen.add(k)
        if k in _REMOVED:
            continue
        if k == "correlation-id" or k == "JMSCorrelationID":
            jms["JMSCorrelationID"] = v
        elif k == "expires" or k == "JMSExpiration":
            jms["JMSExpiration"] = JLong(_java_long(v))
        elif k == "timestamp" or k == "JMSTimestamp":
            jms["JMSTimestamp"] = JLong(_java_long(v, timestamp_ms))
        elif k == "priority" or k == "JMSPriority":
            try:
                jms["JMSPriority"] = parse_int(v, 32)
            except NumberFormat:
                pass
        elif k == "type" or k == "JMSType":
            jms["JMSType"] = v
        elif k == "reply-to" or k == "JMSReplyTo":
            jms["JMSReplyTo"] = _reply_to(v)
        elif k == "persistent":
            jms["JMSDeliveryMode"] = "PERSISTENT" if v == "true" else "NON_PERSISTENT"
        elif k == "JMSXGroupID":
            jms["JMSXGroupID"] = v
        elif k == "JMSXGroupSeq":
            try:
                jms["JMSXGroupSeq"] = parse_int(v, 32)
            except NumberFormat:
                pass
        elif k in _LONG_PROPS:
            props[k] = JLong(_java_long(v))
        elif k == "AMQ_SCHEDULED_REPEAT":
            try:
                props[k] = parse_int(v, 32)
            except NumberFormat:
                props[k] = v
        else:
            props[k] = v
    return MessageView(props, jms)
