"""The embedded STOMP broker (asyncio): store, destinations/dispatch, protocol handler.

Public entry point: :class:`EmbeddedBroker` (a broker on a background thread for tests
and embedding). Imported lazily so that ``import amqtransport.broker.store`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import BrokerConfig
    from .embedded import EmbeddedBroker
    from .server import BrokerServer

__all__ = ["EmbeddedBroker", "BrokerConfig", "BrokerServer"]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedBroker":
        from .embedded import EmbeddedBroker

        return EmbeddedBroker
    if name == "BrokerConfig":
        from .config import BrokerConfig

        return BrokerConfig
    if name == "BrokerServer":
        from .server import BrokerServer

        return BrokerServer
    raise AttributeError(name)
