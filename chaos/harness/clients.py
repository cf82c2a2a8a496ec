"""How a chaos run's clients connect: the URI (through the stage's proxies), heart-beats,
the connect timeout, the duplicate filter, the login and the client id."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import amqtransport
from amqtransport.client import Connection

__all__ = ["ClientSettings"]


@dataclass(frozen=True)
class ClientSettings:
    """How the round's clients connect."""

    uri: str
    heartbeat_ms: int = 1000
    #: seconds to connect and receive CONNECTED (None: the URI's ``connectTimeout``, 10 s unless given)
    connect_timeout_s: float | None = 2.0
    dedupe: bool = True
    login: str | None = None
    passcode: str | None = None
    client_id: str | None = None  # durable subscriptions need one

    def connect(self, listener: Any = None) -> Connection:
        conn: Connection = amqtransport.connect(
            self.uri,
            login=self.login,
            passcode=self.passcode,
            client_id=self.client_id,
            heartbeat=(self.heartbeat_ms, self.heartbeat_ms),
            dedupe=self.dedupe,
            listener=listener,
            connect_timeout=self.connect_timeout_s,
        )
        return conn
