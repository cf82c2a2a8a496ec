"""What a SUBSCRIBE frame asks for, read from its headers (pure: no I/O, no state).

:func:`subscribe_options` reads the ack mode, ActiveMQ's ``activemq.prefetchSize``,
``activemq.priority``, ``activemq.noLocal``, ``activemq.exclusive``, the durable
subscription's name (``activemq.subscriptionName`` or ``durable-subscription-name``), the
client id, ``browser`` and the JMS ``selector`` (compiled once, here). A header that does
not parse raises :class:`BadSubscribe` naming it; ``close`` says whether the connection
goes with the ERROR (a bad prefetch, as before) or stays (a bad consumer priority or
selector: ActiveMQ answers those with an ERROR and keeps the connection).
"""

from __future__ import annotations

from dataclasses import dataclass

from amqtransport.selector import Selector, SelectorError, compile_selector
from amqtransport.stomp import Frame

from ..dispatch.errors import CoreError
from ..dispatch.model import AUTO

__all__ = ["BadSubscribe", "SubscribeOptions", "subscribe_options"]


class BadSubscribe(CoreError):
    """A SUBSCRIBE header that does not parse; ``close``: the connection goes with the ERROR."""

    def __init__(self, message: str, *, close: bool) -> None:
        super().__init__(message)
        self.close = close


@dataclass(frozen=True)
class SubscribeOptions:
    ack: str
    prefetch: int | None
    durable: str | None
    client_id: str | None
    consumer_priority: int
    selector: Selector | None
    browser: bool
    no_local: bool
    exclusive: bool


def subscribe_options(frame: Frame, connection_client_id: str | None) -> SubscribeOptions:
    """The SUBSCRIBE's options; ``connection_client_id`` is the CONNECT's ``client-id``
    (a SUBSCRIBE's own ``client-id`` header wins)."""
    prefetch_text = frame.get("activemq.prefetchSize")
    prefetch: int | None = None
    if prefetch_text is not None:
        try:
            prefetch = int(prefetch_text)
            if prefetch < 1:
                raise ValueError
        except ValueError:
            raise BadSubscribe(f"activemq.prefetchSize must be a positive integer, got {prefetch_text!r}",
                               close=True) from None
    consumer_priority = 0
    priority_text = frame.get("activemq.priority")
    if priority_text is not None:
        try:
            consumer_priority = int(priority_text)
            if not -128 <= consumer_priority <= 127:
                raise ValueError
        except ValueError:
            raise BadSubscribe(f"activemq.priority must be an integer from -128 to 127, got {priority_text!r}",
                               close=False) from None
    selector_text = frame.get("selector")
    selector = None
    if selector_text is not None:
        try:
            selector = compile_selector(selector_text)
        except SelectorError as exc:  # as ActiveMQ: an ERROR, and the connection stays
            raise BadSubscribe(str(exc), close=False) from None
    return SubscribeOptions(
        ack=frame.get("ack") or AUTO,
        prefetch=prefetch,
        durable=frame.get("activemq.subscriptionName") or frame.get("durable-subscription-name"),
        client_id=frame.get("client-id") or connection_client_id,
        consumer_priority=consumer_priority,
        selector=selector,
        browser=frame.get("browser") == "true",
        no_local=frame.get("activemq.noLocal") == "true",
        exclusive=(frame.get("activemq.exclusive") or "").lower() == "true",
    )
