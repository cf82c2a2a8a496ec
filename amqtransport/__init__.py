"""amqtransport: ActiveMQ-style failover transports over STOMP 1.2.

Public API::

    import amqtransport
    with amqtransport.connect("failover:(tcp://a:61613,tcp://b:61613)?randomize=false") as conn:
        conn.send("/queue/orders", b"hello")

The exception family is importable from here; ``connect``/``Connection`` and
``parse_uri`` are loaded on first use so that importing the package stays cheap.
"""

from __future__ import annotations

from typing import Any

from amqtransport.errors import (
    AmqTransportError,
    AuthenticationError,
    BrokerError,
    ConfigError,
    ConnectError,
    ConnectionClosed,
    HeartbeatTimeout,
    LocalProtocolError,
    ProtocolError,
    ReadError,
    ReconnectExhausted,
    RemoteProtocolError,
    RequestTimeout,
    SendTimeout,
    TransactionRolledBack,
    TransportError,
    UriError,
    WriteError,
)

__version__ = "0.1.0"

_LAZY = {
    "connect": "amqtransport.client",
    "Connection": "amqtransport.client",
    "Subscription": "amqtransport.client",
    "Message": "amqtransport.client",
    "parse_uri": "amqtransport.uri",
    "EmbeddedBroker": "amqtransport.broker",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'amqtransport' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)


__all__ = [
    "AmqTransportError",
    "AuthenticationError",
    "BrokerError",
    "ConfigError",
    "ConnectError",
    "ConnectionClosed",
    "HeartbeatTimeout",
    "LocalProtocolError",
    "ProtocolError",
    "ReadError",
    "ReconnectExhausted",
    "RemoteProtocolError",
    "RequestTimeout",
    "SendTimeout",
    "TransactionRolledBack",
    "TransportError",
    "UriError",
    "WriteError",
    *_LAZY,
]
