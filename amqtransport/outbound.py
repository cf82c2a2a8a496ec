"""The frames a client connection sends, built once for the sync client
(``client.py``) and the asyncio client (``aio/``): SEND with its idempotency key,
SUBSCRIBE with each broker's headers, UNSUBSCRIBE, and how a failed COMMIT is reported.

Theory of operation
-------------------
Every SEND carries an idempotency key (``amq-idempotency-key``; the caller's or a
fresh UUID, and the broker's own duplicate-id header where it has one), so the
failover layer may replay it after a reconnect and a broker that honours the key drops
the copy. A subscription's headers depend on the broker's dialect (durable names,
prefetch, routing). Both builders are pure: they take the dialect and the ids they
need and return frames; the connection decides when to write them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Literal

from amqtransport.errors import (
    BrokerError,
    LocalProtocolError,
    SendTimeout,
    TransactionInDoubt,
    TransactionRolledBack,
)
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.transports.dialect import Dialect

__all__ = ["ACK_MODES", "AckMode", "DEFAULT_AUDIT_SIZE", "DEFAULT_PREFETCH", "commit_failure", "new_key",
           "send_frame", "subscribe_frame", "unsubscribe_frames"]

AckMode = Literal["auto", "client", "client-individual"]
ACK_MODES = ("auto", "client", "client-individual")
DEFAULT_AUDIT_SIZE = 100_000
#: prefetch asked for when none is given, where the broker has no limit of its own (RabbitMQ)
DEFAULT_PREFETCH = 1000


def send_frame(destination: str, body: bytes | str, headers: Mapping[str, str] | None, persistent: bool,
               idempotency_key: str | None, *, dialect: Dialect, duplicate_id_header: str | None,
               priority: int | None = None, delay: int | None = None) -> Frame:
    """A SEND frame with its idempotency key (see the module docstring). ``priority``: the
    JMS priority, 0-9 (the ``priority`` header; ValueError otherwise); ``delay``:
    milliseconds, as the ``AMQ_SCHEDULED_DELAY`` header (``ValueError`` when negative)."""
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int) or delay < 0):
        raise ValueError(f"delay must be a whole number of milliseconds >= 0, got {delay!r}")
    data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    hdrs: dict[str, str] = {"destination": str(destination)}
    if isinstance(body, str):
        hdrs["content-type"] = "text/plain;charset=utf-8"
    if headers:
        hdrs.update({str(k): str(v) for k, v in headers.items()})
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
            raise ValueError(f"priority must be an integer from 0 to 9, got {priority!r}")
        hdrs["priority"] = str(priority)
    hdrs["persistent"] = "true" if persistent else "false"
    if delay is not None:
        hdrs["AMQ_SCHEDULED_DELAY"] = str(delay)
    key = hdrs[IDEMPOTENCY_HEADER] = str(idempotency_key or hdrs.get(IDEMPOTENCY_HEADER) or new_key())
    if duplicate_id_header is not None and duplicate_id_header not in hdrs:
        hdrs[duplicate_id_header] = key
    for name, value in dialect.routing_headers(destination, "SEND").items():
        hdrs.setdefault(name, value)
    return Frame("SEND", tuple(hdrs.items()), data)  # every name and value is a str already


def new_key() -> str:
    """A fresh idempotency key: 128 random bits as 32 hex digits (the format of
    ``uuid4().hex``, at a sixth of its cost: it is made for every send)."""
    return os.urandom(16).hex()


def subscribe_frame(destination: str, ack: str, headers: Mapping[str, str] | None, prefetch: int | None,
                    durable_name: str | None, *, dialect: Dialect, client_id: str | None,
                    next_id: Callable[[str], str], in_use: Container[str], selector: str | None = None) -> Frame:
    """The SUBSCRIBE frame for ``subscribe(...)``; its ``id`` header is the subscription's
    id; ``selector``: a JMS message selector (the ``selector`` header, ActiveMQ's and ours).
    Raises ``ValueError``/``LocalProtocolError`` for arguments this broker cannot take."""
    if ack not in ACK_MODES:
        raise ValueError(f"ack must be one of {', '.join(ACK_MODES)}, got {ack!r}")
    sub_id: str | None = None
    hdrs: dict[str, str] = {}
    if durable_name is not None:
        if not durable_name or any(c in durable_name for c in "\r\n\x00"):
            raise ValueError(f"durable_name must be a non-empty name without CR, LF or NUL, got {durable_name!r}")
        if destination.startswith(("/queue/", "/amq/queue/")):
            raise ValueError(f"durable_name is for topic subscriptions; {destination} is a queue, "
                             "which keeps its messages anyway")
        if dialect.needs_client_id() and client_id is None:
            raise LocalProtocolError(
                f"a durable subscription on {dialect.label} is filed under the connection's client id: "
                "connect(..., client_id=...)")
        sub_id = dialect.durable_id(destination, durable_name)
        hdrs.update(dialect.durable_headers(durable_name, client_id))
    given_id = (headers or {}).get("id")
    if given_id is not None:  # the caller's own id: messages and UNSUBSCRIBE must use it
        if sub_id is not None and str(given_id) != sub_id:
            raise ValueError(f"a durable subscription on {dialect.label} must use id {sub_id!r}, not {given_id!r}")
        sub_id = str(given_id)
    if sub_id is None:
        sub_id = next_id("sub")
    hdrs.update({"id": sub_id, "destination": destination, "ack": ack,
                 **dialect.routing_headers(destination, "SUBSCRIBE")})
    if prefetch is None:  # the URI's jms.prefetchPolicy.* (ActiveMQ's connection-factory default)
        prefetch = dialect.default_prefetch(destination, durable=durable_name is not None,
                                            browser=str((headers or {}).get("browser", "")).lower() == "true")
    if prefetch is None and dialect.name == "rabbitmq":
        prefetch = DEFAULT_PREFETCH
    if prefetch is not None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        hdrs.update(dialect.prefetch_headers(prefetch))
    if selector is not None:
        hdrs["selector"] = selector
    if headers:
        hdrs.update({str(k): str(v) for k, v in headers.items() if k != "id"})
    if sub_id in in_use:
        raise LocalProtocolError(f"subscription id {sub_id!r} is already in use on this connection")
    return Frame.make("SUBSCRIBE", hdrs)


def unsubscribe_frames(sub_id: str, durable_name: str | None, durable: bool, *, dialect: Dialect,
                       client_id: str | None) -> list[Frame]:
    """The UNSUBSCRIBE frame(s) ending subscription ``sub_id`` (``durable``: and deleting
    the durable subscription, on each broker's terms)."""
    frames = [Frame.make("UNSUBSCRIBE", {"id": sub_id})]
    if durable:
        assert durable_name is not None
        extra = {"id": sub_id, **dialect.durable_unsubscribe_headers(durable_name, client_id)}
        if dialect.name == "rabbitmq":
            frames = [Frame.make("UNSUBSCRIBE", extra)]  # one frame, while subscribed
        else:
            frames.append(Frame.make("UNSUBSCRIBE", extra))  # after the consumer is gone
    return frames


def commit_failure(exc: BaseException, tx_id: str, sends: Sequence[Frame], *, committed: bool) -> BaseException | None:
    """What a commit that failed with ``exc`` raises instead (None: ``exc`` itself).
    ``committed``: the COMMIT's receipt was in and a send's was not."""
    if isinstance(exc, TransactionRolledBack):
        if committed and not isinstance(exc, TransactionInDoubt):
            return TransactionInDoubt(
                f"transaction {tx_id}: the COMMIT was accepted but the link was lost before every "
                f"send was confirmed: send its messages again with the same keys (exception.keys)",
                transaction=tx_id, keys=exc.keys)
        return None
    if isinstance(exc, SendTimeout):  # the caller's timeout: the COMMIT may still take effect
        what = "its COMMIT" if not committed else "every send"
        return TransactionInDoubt(
            f"transaction {tx_id}: no receipt for {what} within the timeout: the broker may commit it or "
            f"not: send its messages again with the same keys (exception.keys)",
            transaction=tx_id, keys=[f.get(IDEMPOTENCY_HEADER) or "" for f in sends])
    if isinstance(exc, BrokerError) and exc.in_doubt:  # e.g. the journal failed with the COMMIT's record queued
        return TransactionInDoubt(
            f"transaction {tx_id}: the broker could not tell whether its COMMIT took effect "
            f"({exc}): send its messages again with the same keys (exception.keys)",
            transaction=tx_id, keys=[f.get(IDEMPOTENCY_HEADER) or "" for f in sends])
    return None
