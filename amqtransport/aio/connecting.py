"""``aio.connect(uri)``: opening an :class:`~amqtransport.aio.connection.AsyncConnection`,
the asyncio client's own part of connecting (the sync client's is ``connect`` in
:mod:`amqtransport.client`; both take the same arguments).

``connect`` returns at once an object that is both awaitable (``conn = await
aio.connect(uri)``) and an async context manager (``async with aio.connect(uri) as
conn:``, which closes the connection on exit): the transport starts on the caller's
event loop. A plain ``tcp://`` leaf that refuses the connect raises its
``ConnectError``, as the sync client does, rather than the failover's
``ReconnectExhausted``.
"""

from __future__ import annotations

from collections.abc import Generator

from amqtransport.aio.connection import AsyncConnection
from amqtransport.aio.failover import AsyncFailoverTransport
from amqtransport.errors import AmqTransportError, ReconnectExhausted
from amqtransport.outbound import DEFAULT_AUDIT_SIZE
from amqtransport.transports.link import ConnectParams
from amqtransport.uri import LeafUri, parse_uri

__all__ = ["connect"]


class _Connecting:
    """What :func:`connect` returns: ``await`` it for the connection, or use it in
    ``async with`` (the connection closes on exit)."""

    def __init__(self, uri: str, params: ConnectParams, dedupe: bool, audit_size: int,
                 listener: object) -> None:
        self._uri = uri
        self._params = params
        self._dedupe = dedupe
        self._audit_size = audit_size
        self._listener = listener
        self._conn: AsyncConnection | None = None

    async def _open(self) -> AsyncConnection:
        transport = AsyncFailoverTransport.from_uri(self._uri, self._params)
        conn = AsyncConnection(transport, dedupe=self._dedupe, audit_size=self._audit_size, uri=self._uri,
                               client_id=self._params.client_id)
        if self._listener is not None:
            transport.add_listener(self._listener)
        try:
            await transport.start()
        except ReconnectExhausted as exc:
            await transport.close()
            if isinstance(parse_uri(self._uri), LeafUri) and isinstance(exc.last_error, AmqTransportError):
                # one broker, no reconnect: the connect error itself, as the sync client raises it
                raise exc.last_error from exc
            raise
        except BaseException:
            await transport.close()
            raise
        return conn

    def __await__(self) -> Generator[object, None, AsyncConnection]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncConnection:
        self._conn = await self._open()
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self._conn.close()


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
) -> _Connecting:
    """Connect through ``uri`` (the sync client's grammar and options: docs/uris.md):
    ``async with aio.connect(uri) as conn:`` or ``conn = await aio.connect(uri)``."""
    params = ConnectParams(login=login, passcode=passcode, vhost=vhost, client_id=client_id,
                           heartbeat=(int(heartbeat[0]), int(heartbeat[1])), connect_timeout=connect_timeout)
    return _Connecting(uri, params, dedupe, audit_size, listener)
