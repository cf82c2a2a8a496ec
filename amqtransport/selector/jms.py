"""The message a selector sees: ActiveMQ's STOMP -> JMS mapping (its ``FrameTranslator``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .values import JLong, NumberFormat, Value, parse_int

__all__ = ["JMS_NAMES", "MessageView", "header_sources", "message_view"]


class MessageView:
    """One message as a selector sees it: ``props`` (property name -> value) and ``jms``
    (the JMS headers), each built from the STOMP headers the first time a selector reads
    it (:func:`message_view`), so a selector on one property never pays for the JMS
    headers, nor one on JMS headers for the properties. ``delivery_count`` (the
    deliveries so far) may change between evaluations: ``jms`` reflects it at each read."""

    __slots__ = ("_headers", "_props", "_jms", "message_id", "destination", "timestamp_ms", "delivery_count")

    def __init__(self, headers: Sequence[tuple[str, str]], *, message_id: str, destination: str, timestamp_ms: int,
                 delivery_count: int = 0) -> None:
        self._headers = headers
        self._props: dict[str, Value] | None = None
        self._jms: dict[str, Value] | None = None
        self.message_id = message_id
        self.destination = destination
        self.timestamp_ms = timestamp_ms
        self.delivery_count = delivery_count

    @property
    def props(self) -> Mapping[str, Value]:
        props = self._props
        if props is None:
            props = self._props = _properties(self._headers)
        return props

    @property
    def jms(self) -> dict[str, Value]:
        jms = self._jms
        if jms is None:
            jms = self._jms = _jms_headers(self._headers, self.message_id, self.destination, self.timestamp_ms)
        n = self.delivery_count
        jms["JMSRedelivered"] = n > 0
        jms["JMSXDeliveryCount"] = n + 1
        return jms


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
    ``/topic/X``; ``delivery_count`` the deliveries so far (JMSRedelivered when > 0).
    Nothing is read from ``headers`` until a selector asks (:class:`MessageView`)."""
    return MessageView(headers, message_id=message_id, destination=destination, timestamp_ms=timestamp_ms,
                       delivery_count=delivery_count)


#: headers that set a JMS header (or are the frame's own): never a property
_NOT_PROPERTIES = _REMOVED | frozenset({
    "correlation-id", "JMSCorrelationID", "expires", "JMSExpiration", "timestamp", "JMSTimestamp", "priority",
    "JMSPriority", "type", "JMSType", "reply-to", "JMSReplyTo", "persistent", "JMSXGroupID", "JMSXGroupSeq",
})
_JMS_SOURCES = _NOT_PROPERTIES - _REMOVED


#: JMS headers a selector reads as a header's string, verbatim: from which headers
_STRING_JMS = {
    "JMSType": ("type", "JMSType"),
    "JMSCorrelationID": ("correlation-id", "JMSCorrelationID"),
    "JMSXGroupID": ("JMSXGroupID",),
}


def header_sources(name: str) -> tuple[str, ...] | None:
    """The headers whose value, verbatim, a selector reads as identifier ``name`` when
    that value is a string (a plain property: its own header; ``JMSType``: ``type`` or
    ``JMSType``; ...): whenever the selector sees a string there, one of these headers
    holds exactly it. None for a name read otherwise (typed, derived, never a property)."""
    if name in JMS_NAMES:
        return _STRING_JMS.get(name)
    if name in _NOT_PROPERTIES or name in _LONG_PROPS or name == "AMQ_SCHEDULED_REPEAT":
        return None
    return (name,)


def _properties(headers: Sequence[tuple[str, str]]) -> dict[str, Value]:
    """The message's properties: every header but the frame's own and the JMS ones (the
    first of a repeated name counts); the ``AMQ_SCHEDULED_*`` numbers typed."""
    props: dict[str, Value] = {}
    for k, v in headers:
        if k in props or k in _NOT_PROPERTIES:
            continue
        if k in _LONG_PROPS:
            props[k] = JLong(_java_long(v))
        elif k == "AMQ_SCHEDULED_REPEAT":
            try:
                props[k] = parse_int(v, 32)
            except NumberFormat:
                props[k] = v
        else:
            props[k] = v
    return props


def _jms_headers(headers: Sequence[tuple[str, str]], message_id: str, destination: str,
                 timestamp_ms: int) -> dict[str, Value]:
    """The JMS headers (without the delivery count's two, which :class:`MessageView` sets)."""
    jms: dict[str, Value] = {
        "JMSMessageID": message_id,
        "JMSDestination": _reply_to(destination),
        "JMSPriority": 4,
        "JMSTimestamp": JLong(timestamp_ms),
        "JMSExpiration": JLong(0),
        "JMSDeliveryMode": "NON_PERSISTENT",
        "JMSXGroupSeq": 0,
        "JMSXGroupFirstForConsumer": False,
    }
    seen: set[str] = set()
    for k, v in headers:
        if k not in _JMS_SOURCES or k in seen:
            continue
        seen.add(k)
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
        else:  # JMSXGroupSeq
            try:
                jms["JMSXGroupSeq"] = parse_int(v, 32)
            except NumberFormat:
                pass
    return jms
