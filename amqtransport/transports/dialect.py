"""Broker dialects: how the STOMP brokers we talk to differ, as data and pure functions.

Theory of operation
-------------------
STOMP leaves much to the broker: how prefetch is asked for, how a durable topic
subscription is named and deleted, whether a transactional SEND is answered before
its COMMIT, whether a header deduplicates. A :class:`Dialect` holds those answers
for one broker family:

- ``amq``: our broker (``server:amqtransport/...``): deduplicates on
  ``amq-idempotency-key``; ActiveMQ's headers for prefetch and durable subscriptions;
- ``activemq``: ActiveMQ Classic 5.x (``server:ActiveMQ/5...``): prefetch
  ``activemq.prefetchSize`` (messages), durable subscriptions by
  ``activemq.subscriptionName`` under the connection's ``client-id``; a STOMP message
  with ``content-length`` becomes a JMS BytesMessage, so text goes without it (text
  mode); no duplicate detection (the client's filter removes replayed copies);
- ``artemis``: ActiveMQ Artemis (``server:ActiveMQ-Artemis/...``), from its documented
  STOMP behaviour (not tested here: it cannot be installed on these machines):
  ``activemq.prefetchSize`` would be read as *bytes* there, so prefetch goes as
  ``consumer-window-size`` (bytes, estimated at :data:`ARTEMIS_WINDOW_PER_MESSAGE`
  per message); durable subscriptions by ``durable-subscription-name``;
  ``_AMQ_DUPL_ID`` carries the key (Artemis' duplicate detection); routing by
  ``destination-type``/``subscription-type`` (ANYCAST for ``/queue/``, MULTICAST for
  ``/topic/``); ACKs inside a transaction are ignored; heart-beats of at least 500 ms;
  text mode;
- ``rabbitmq``: RabbitMQ's STOMP plugin (``server:RabbitMQ/...``): prefetch
  ``prefetch-count`` (per connection there; unlimited without it), the ``host``
  header is the virtual host (``/`` by default), a durable topic subscription is a
  queue named from (topic, ``id``): ``durable:true``, ``auto-delete:false`` and a stable
  ``id`` derived from the subscription name, deleted by an UNSUBSCRIBE carrying
  ``durable:true``; a transactional SEND's receipt comes only after the COMMIT's; a
  NACK in ``client`` mode is cumulative; no duplicate detection.

The dialect of a link is the URI's ``dialect`` option when given, else it is detected
from CONNECTED's ``server`` header (:func:`detect`); a broker we do not recognise gets
``generic`` (what the client always did: both prefetch headers, ActiveMQ's durable
headers). Before the first CONNECTED nothing is known, so what the CONNECT frame
carries does not depend on the dialect except through an explicit ``dialect`` option
(the default virtual host ``/`` suits every broker above: only RabbitMQ reads it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = [
    "ARTEMIS_WINDOW_PER_MESSAGE",
    "DIALECT_NAMES",
    "DEFAULT_VHOST",
    "Dialect",
    "detect",
    "dialect_named",
]

#: the dialects a URI may name
DIALECT_NAMES = ("amq", "activemq", "artemis", "rabbitmq")
#: the CONNECT ``host`` header when none is configured (RabbitMQ's default vhost; the
#: other brokers ignore it)
DEFAULT_VHOST = "/"
#: Artemis counts its consumer window in bytes: bytes assumed per prefetched message
ARTEMIS_WINDOW_PER_MESSAGE = 1024


@dataclass(frozen=True)
class Dialect:
    name: str
    #: what the dialect is called in logs and docs
    label: str
    #: the broker drops a SEND whose idempotency key it has seen (exactly-once replay)
    dedupes: bool = False
    #: a header that must also carry the idempotency key for the broker's dedupe
    duplicate_id_header: str | None = None
    #: text bodies go without content-length (JMS TextMessage instead of BytesMessage)
    text_mode: bool = False
    #: a transactional SEND's RECEIPT comes only after the COMMIT's
    deferred_tx_receipts: bool = False
    #: the broker ignores ACKs inside a transaction
    tx_acks_ignored: bool = False
    #: a NACK in ``client`` mode rejects every earlier unacked delivery too
    cumulative_nack: bool = True
    #: the smallest heart-beat interval the broker accepts (ms; 0: any)
    min_heartbeat_ms: int = 0
    #: the URI's ``jms.prefetchPolicy.*``: (kind, count) with kind queue, topic, durable or browser
    prefetch_policy: tuple[tuple[str, int], ...] = ()

    def default_prefetch(self, destination: str, *, durable: bool, browser: bool) -> int | None:
        """The prefetch the URI's ``jms.prefetchPolicy.*`` gives a subscription (None: none given)."""
        policy = dict(self.prefetch_policy)
        if browser:
            return policy.get("browser")
        if durable:
            return policy.get("durable")
        return policy.get("queue" if destination.startswith(("/queue/", "/amq/queue/", "/temp-queue/")) else "topic")

    def prefetch_headers(self, count: int) -> dict[str, str]:
        """SUBSCRIBE headers asking for at most ``count`` unacknowledged messages."""
        if self.name == "rabbitmq":
            return {"prefetch-count": str(count)}
        if self.name == "artemis":
            return {"consumer-window-size": str(count * ARTEMIS_WINDOW_PER_MESSAGE)}
        if self.name == "generic":
            return {"activemq.prefetchSize": str(count), "prefetch-count": str(count)}
        return {"activemq.prefetchSize": str(count)}

    def durable_id(self, destination: str, name: str) -> str | None:
        """The subscription ``id`` a durable subscription must use (RabbitMQ names the
        queue from it, so it must be the same on every connection), or None for any."""
        if self.name != "rabbitmq":
            return None
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]
        return f"durable-{safe}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"

    def durable_headers(self, name: str, client_id: str | None) -> dict[str, str]:
        """SUBSCRIBE headers of a durable topic subscription called ``name``."""
        if self.name == "rabbitmq":
            return {"durable": "true", "auto-delete": "false", "persistent": "true"}
        if self.name == "artemis":
            out = {"durable-subscription-name": name}
        elif self.name == "generic":
            out = {"activemq.subscriptionName": name, "durable-subscription-name": name}
        else:
            out = {"activemq.subscriptionName": name}
        if client_id is not None:
            out["client-id"] = client_id
        return out

    def durable_unsubscribe_headers(self, name: str, client_id: str | None) -> dict[str, str]:
        """UNSUBSCRIBE headers that delete the durable subscription ``name``."""
        if self.name == "rabbitmq":
            return {"durable": "true", "persistent": "true"}
        return self.durable_headers(name, client_id)

    def routing_headers(self, destination: str, command: str) -> dict[str, str]:
        """Artemis' routing type for ``/queue/`` (ANYCAST: one consumer gets each
        message) and ``/topic/`` (MULTICAST: every subscription does) destinations:
        ``destination-type`` on SEND, ``subscription-type`` on SUBSCRIBE. Without them
        Artemis routes an auto-created address by its default type, whatever the
        prefix says. Other brokers read the prefix: nothing to add."""
        if self.name != "artemis":
            return {}
        if destination.startswith("/queue/"):
            kind = "ANYCAST"
        elif destination.startswith("/topic/"):
            kind = "MULTICAST"
        else:
            return {}
        return {"destination-type" if command == "SEND" else "subscription-type": kind}

    def needs_client_id(self) -> bool:
        """Does a durable subscription need ``connect(..., client_id=...)``?"""
        return self.name in ("amq", "activemq", "artemis", "generic")


_DIALECTS = {
    "amq": Dialect("amq", "amqtransport broker", dedupes=True),
    "activemq": Dialect("activemq", "ActiveMQ Classic", text_mode=True, cumulative_nack=False),
    "artemis": Dialect("artemis", "ActiveMQ Artemis", duplicate_id_header="_AMQ_DUPL_ID", text_mode=True,
                       tx_acks_ignored=True, min_heartbeat_ms=500),
    "rabbitmq": Dialect("rabbitmq", "RabbitMQ", deferred_tx_receipts=True),
    "generic": Dialect("generic", "unknown STOMP broker", cumulative_nack=False),
}


def dialect_named(name: str) -> Dialect:
    """The dialect called ``name`` (one of :data:`DIALECT_NAMES` or ``generic``)."""
    try:
        return _DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown dialect {name!r}; expected one of {', '.join(DIALECT_NAMES)}") from None


def detect(server: str | None) -> Dialect:
    """The dialect of a broker from its CONNECTED ``server`` header."""
    text = (server or "").strip().lower()
    if text.startswith("activemq-artemis") or text.startswith("artemis"):
        return _DIALECTS["artemis"]
    if text.startswith("activemq"):
        return _DIALECTS["activemq"]
    if text.startswith("rabbitmq"):
        return _DIALECTS["rabbitmq"]
    if text.startswith("amqtransport"):
        return _DIALECTS["amq"]
    return _DIALECTS["generic"]
