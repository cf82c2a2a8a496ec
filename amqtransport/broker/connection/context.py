"""What a client connection may use of the broker it runs in.

Theory of operation
-------------------
A client connection (one asyncio ``Protocol`` per socket, :mod:`.protocol`) does not
get the server: it gets a :class:`BrokerContext`, built by
:meth:`~.server.BrokerServer.listen` and shared by every connection of that listener.
The context says everything a connection may do to the broker around it: the core
(to send, subscribe, ack), the config, the event loop, :attr:`authenticate` a login,
:attr:`register` and :attr:`unregister` itself (the server counts and lists its
connections, and refuses one over ``max_connections``), a new session id, the headers
of a status answer, and :attr:`fence` the broker when the journal fails.

The connect hook. Something else may want to answer some CONNECT frames on the client
port itself: an HA node answers status and role requests there and refuses clients
while it is checking whether its peer took over. It declares itself as a
:class:`ConnectHook` (``BrokerServer.connect_hook``, set before ``listen``); the
connection offers it every CONNECT first. A hook that takes the frame calls
:meth:`HookedConnection.detach` to take the socket over: the connection stops (its
timer, its reading), leaves the server's list, and hands back its transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from amqtransport.stomp import Frame

from ..authorization import Authorizer
from ..config import BrokerConfig
from ..dispatch.core import BrokerCore
from ..tracing import SendTracer

__all__ = ["BrokerContext", "ConnectHook", "HookedConnection"]

ConnT = TypeVar("ConnT")


class HookedConnection(Protocol):
    """What a :class:`ConnectHook` may do with the connection whose CONNECT it is shown."""

    @property
    def peer(self) -> str: ...

    def detach(self) -> asyncio.Transport | None:
        """Stop handling this socket and hand its transport over (None: already closed)."""
        ...


class ConnectHook(Protocol):
    """Sees every CONNECT frame on the client port before the connection handles it."""

    def intercept_connect(self, conn: HookedConnection, frame: Frame) -> bool:
        """True: the hook took the frame (and, with :meth:`HookedConnection.detach`, the
        socket); False: the connection handles it as a client's CONNECT."""
        ...


@dataclass
class BrokerContext(Generic[ConnT]):
    """What every connection of one listener shares (see the module docstring)."""

    core: BrokerCore
    config: BrokerConfig
    loop: asyncio.AbstractEventLoop
    #: ``(login, passcode) -> bool``: True when the broker has no users or they are valid
    authenticate: Callable[[str | None, str | None], bool]
    #: False: over ``max_connections``, the connection must refuse its client
    register: Callable[[ConnT], str | None]  # None: registered; else why it is refused
    unregister: Callable[[ConnT], None]
    new_session_id: Callable[[], str]
    #: the ``amq-ha-*`` headers of a plain broker's answer to ``amq broker status``
    status_headers: Callable[[], dict[str, str]]
    #: the journal failed: the broker stops serving (the reason goes into the log and ERRORs)
    fence: Callable[[str], None]
    connect_hook: ConnectHook | None = None
    #: who may read, write or create what (the config's ``[[authorization]]`` entries)
    authorizer: Authorizer = field(default_factory=lambda: Authorizer((), {}))
    #: ``(conn, client_id) -> refusal or None``: a client-id may be connected once
    claim_client_id: Callable[[ConnT, str], str | None] = lambda _conn, _cid: None
    #: the server spans of sampled SENDs (``otel_endpoint``; None: off)
    tracer: SendTracer | None = None
