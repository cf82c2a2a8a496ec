"""What a failover driver shows of its core: the read-only status both drivers expose
(state, generation, the current link and its address, version and dialect, the last
error, counters), in one place."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from amqtransport.errors import AmqTransportError
from amqtransport.stomp import Frame
from amqtransport.transports.core import FailoverCore
from amqtransport.transports.core_state import LINK_UP
from amqtransport.transports.dialect import Dialect, dialect_named

__all__ = ["CoreStatus"]


class _Link(Protocol):
    @property
    def address(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    @property
    def dialect(self) -> Dialect: ...

    @property
    def connected_frame(self) -> Frame | None: ...

    @property
    def duplicate_id_header(self) -> str | None: ...


L = TypeVar("L", bound=_Link)


class CoreStatus(Generic[L]):
    """Mixed into a driver that keeps its core in ``_core``."""

    _core: FailoverCore[L]
    _last_dialect: Dialect = dialect_named("generic")

    @property
    def state(self) -> str:
        """The core's state (``core_state.State``, a ``str``: ``"connected"``, ...)."""
        return self._core.state

    @property
    def generation(self) -> int:
        return self._core.generation

    @property
    def link(self) -> L | None:
        return self._core.link

    @property
    def is_connected(self) -> bool:
        return self._core.state in LINK_UP

    @property
    def connected_address(self) -> str | None:
        link = self._core.link
        return link.address if link is not None and self._core.state in LINK_UP else None

    @property
    def version(self) -> str:
        link = self._core.link
        return link.version if link is not None else "1.2"

    @property
    def dialect(self) -> Dialect:
        """The dialect of the current link, else of the last one (``generic`` before any)."""
        link = self._core.link
        if link is not None and link.connected_frame is not None:
            self._last_dialect = link.dialect
        return self._last_dialect

    @property
    def connected_frame(self) -> Frame | None:
        """The CONNECTED frame of the current link (None while disconnected)."""
        link = self._core.link
        return link.connected_frame if link is not None and link.alive else None

    @property
    def duplicate_id_header(self) -> str | None:
        """The header that also carries the idempotency key on the current link."""
        link = self._core.link
        return link.duplicate_id_header if link is not None else None

    @property
    def last_error(self) -> AmqTransportError | None:
        return self._core.error

    @property
    def reconnects(self) -> int:
        """Links lost (each starts a reconnect)."""
        return self._core.reconnects

    @property
    def failed_attempts(self) -> int:
        """Connect attempts that failed since the last success."""
        return self._core.failed_attempts

    @property
    def cached_sends(self) -> int:
        """How many fire-and-forget sends ``trackMessages`` would replay on a new link."""
        return len(self._core.cache)

    @property
    def backup_links(self) -> int:
        """Pre-connected backup links held now (``backup=true``)."""
        return len(self._core.backups)
