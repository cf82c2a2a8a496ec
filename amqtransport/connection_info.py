"""The read-only status a connection shows, the same for the sync client
(``client.Connection``) and the asyncio client (``aio.AsyncConnection``)."""

from __future__ import annotations

from typing import Protocol

from amqtransport.received import Inbound
from amqtransport.stomp import Frame
from amqtransport.transports.dialect import Dialect

__all__ = ["ConnectionInfo", "StatusSource"]


class StatusSource(Protocol):
    """What :class:`ConnectionInfo` reads of a transport (either driver)."""

    @property
    def connected_address(self) -> str | None: ...

    @property
    def is_connected(self) -> bool: ...

    @property
    def dialect(self) -> Dialect: ...

    @property
    def connected_frame(self) -> Frame | None: ...


class ConnectionInfo:
    """Mixed into both connections; each gives its transport through :meth:`_status`."""

    _inbound: Inbound

    def _status(self) -> StatusSource:
        raise NotImplementedError

    @property
    def connected_uri(self) -> str | None:
        """Address of the broker connected now (``tcp://127.0.0.1:61613``), or None."""
        return self._status().connected_address

    @property
    def is_connected(self) -> bool:
        return self._status().is_connected

    @property
    def duplicates(self) -> int:
        """Redelivered copies the duplicate filter dropped so far."""
        return self._inbound.duplicates

    @property
    def dialect(self) -> str:
        """The broker dialect in use (``amq``, ``activemq``, ``artemis``, ``rabbitmq``, or
        ``generic`` for a broker we do not recognise): the URI's ``dialect`` option, else
        detected from the ``server`` header of CONNECTED."""
        return self._status().dialect.name

    @property
    def server(self) -> str | None:
        """The broker's ``server`` header on the current link (``ActiveMQ/5.17.2``), or None."""
        frame = self._status().connected_frame
        return frame.get("server") if frame is not None else None
