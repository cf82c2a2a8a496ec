"""The names and values of the OpenTelemetry messaging semantic conventions the
instrumentation sets (docs/tracing.md has the table), and the few pure rules that
turn a connection's state into attribute values. No OpenTelemetry import here: the
instrumentor module owns the SDK-facing side.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit

__all__ = [
    "BATCH_COUNT",
    "BODY_SIZE",
    "CONVERSATION_ID",
    "DESTINATION",
    "ERROR_TYPE",
    "EVENT_INTERRUPTED",
    "EVENT_RECONNECTED",
    "EVENT_REPLAYED",
    "LOST_SERVER",
    "MESSAGE_ID",
    "NEW_SERVER",
    "OPERATION_NAME",
    "OPERATION_TYPE",
    "OUR_SYSTEM",
    "REPLAYED",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "SYSTEM",
    "body_size",
    "messaging_system",
    "server_of",
]

SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
MESSAGE_ID = "messaging.message.id"
CONVERSATION_ID = "messaging.message.conversation_id"
BODY_SIZE = "messaging.message.body.size"
BATCH_COUNT = "messaging.batch.message_count"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

#: ours (attributes and span events the conventions have no name for)
REPLAYED = "amqtransport.send.replayed"
LOST_SERVER = "amqtransport.failover.lost_server"
NEW_SERVER = "amqtransport.failover.new_server"
EVENT_REPLAYED = "amqtransport.send.replayed"
EVENT_INTERRUPTED = "amqtransport.failover.interrupted"
EVENT_RECONNECTED = "amqtransport.failover.reconnected"

#: ``messaging.system`` for our own broker (the conventions have no value for it)
OUR_SYSTEM = "amqtransport"

_SYSTEMS = {
    "activemq": "activemq",  # the conventions' well-known value (Apache ActiveMQ)
    "artemis": "activemq",  # ActiveMQ Artemis is Apache ActiveMQ's other broker
    "rabbitmq": "rabbitmq",
    "amq": OUR_SYSTEM,
}


def messaging_system(dialect: str) -> str:
    """``messaging.system`` for a connection of ``dialect`` (``ConnectionInfo.dialect``):
    the conventions' value where there is one, ``amqtransport`` for our broker, and
    ``stomp`` for a STOMP broker we did not recognise."""
    return _SYSTEMS.get(dialect, "stomp")


@lru_cache(maxsize=256)  # a connection has a handful of addresses; asked twice per operation
def server_of(address: str | None) -> tuple[str, int] | None:
    """``("127.0.0.1", 61613)`` from a connected address ``tcp://127.0.0.1:61613``
    (None when not connected or without a port)."""
    if not address:
        return None
    try:
        parts = urlsplit(address if "://" in address else f"tcp://{address}")
        port = parts.port
    except ValueError:
        return None
    if parts.hostname is None or port is None:
        return None
    return parts.hostname, port


def body_size(body: object) -> int | None:
    """The body's size in bytes as it goes on the wire (a str is sent as UTF-8)."""
    if isinstance(body, str):
        return len(body.encode("utf-8"))
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    return None
