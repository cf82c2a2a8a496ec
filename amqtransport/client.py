"""The public sync client API: ``connect(uri)`` -> :class:`Connection`.

``Connection``, ``Subscription``, ``Producer``, ``Transaction`` and ``Message`` are
written once, with the asyncio client, in ``amqtransport/aio/connection.py`` (its
theory of operation is there); ``scripts/async_to_sync.py`` generates them into
``amqtransport/_sync/connection.py``, and this module re-exports them. What is the sync
client's own is here: :func:`connect` builds the transport for the URI
(``transports.factory``: a ``DirectTransport`` for a plain ``tcp://`` leaf, a
``FailoverTransport`` for ``failover:``/``static:``/``masterslave:``) and starts it
on the caller's thread. It takes the asyncio ``connect``'s arguments, plus injection
points for tests (``backend``, ``sleep``, ``clock``, ``rng``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from amqtransport._backends.base import Backend
from amqtransport._sync.connection import Connection, Message, Producer, Subscription, Transaction
from amqtransport.outbound import DEFAULT_AUDIT_SIZE, DEFAULT_PREFETCH, AckMode
from amqtransport.transports.factory import build_transport
from amqtransport.transports.link import ConnectParams

__all__ = ["connect", "Connection", "Producer", "Subscription", "Message", "Transaction", "AckMode",
           "DEFAULT_AUDIT_SIZE", "DEFAULT_PREFETCH"]


def connect(
    uri: str,
    *,
    login: str | None = None,
    passcode: str | None = None,
    vhost: str | None = None,
    client_id: str | None = None,
    heartbeat: tuple[int, int] = (10000, 10000),
    dedupe: bool = True,
    listener: object = None,
    connect_timeout: float | None = None,
    audit_size: int = DEFAULT_AUDIT_SIZE,
    backend: Backend | None = None,
    sleep: Callable[[float], object] | None = None,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> Connection:
    """Connect through ``uri`` (the grammar: docs/uris.md) and return a
    :class:`Connection`. ``connect_timeout`` is in seconds (default: the leaf's
    ``connectTimeout`` option, 10 s). ``backend``/``sleep``/``clock``/``rng`` are
    injection points for tests."""
    params = ConnectParams(login=login, passcode=passcode, vhost=vhost, client_id=client_id,
                           heartbeat=(int(heartbeat[0]), int(heartbeat[1])), connect_timeout=connect_timeout)
    transport = build_transport(uri, params, backend=backend, sleep=sleep, clock=clock, rng=rng)
    conn = Connection(transport, dedupe=dedupe, audit_size=audit_size, uri=uri, client_id=client_id)
    if listener is not None:
        transport.add_listener(listener)
    transport.start()
    return conn
