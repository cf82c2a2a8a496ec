"""A blocking WebSocket client on ``wsproto`` for the tests of the broker's WebSocket port."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, RejectConnection, Request, TextMessage

__all__ = ["WsClient", "frame"]


class WsClient:
    """A blocking WebSocket client on wsproto: the handshake, messages and frames."""

    def __init__(self, address: tuple[str, int], *, subprotocols: list[str] | None = None,
                 origin: str | None = None, path: str = "/ws") -> None:
        self.sock = socket.create_connection(address, timeout=5)
        self.ws = WSConnection(ConnectionType.CLIENT)
        headers = [(b"origin", origin.encode())] if origin else []
        self.sock.sendall(self.ws.send(Request(host=f"{address[0]}:{address[1]}", target=path,
                                               subprotocols=subprotocols or [], extra_headers=headers)))
        self.events: list[Any] = []
        self.handshake = self.next(lambda e: isinstance(e, (AcceptConnection, RejectConnection)))

    def next(self, pred: Callable[[Any], bool], timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if pred(e):
                    return self.events.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no such event; got {self.events}")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            self.ws.receive_data(data or None)
            self.events.extend(self.ws.events())
            if not data and not self.events:
                raise ConnectionError("closed")

    def send_text(self, text: str, final: bool = True) -> None:
        self.sock.sendall(self.ws.send(TextMessage(data=text, message_finished=final)))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(self.ws.send(BytesMessage(data=data)))

    def stomp(self, timeout: float = 5.0) -> str:
        """The text of the next STOMP frame(s) message (skipping heart-beat EOLs)."""
        m = self.next(lambda e: isinstance(e, (TextMessage, BytesMessage)) and e.data.strip() != "", timeout)
        return m.data if isinstance(m, TextMessage) else m.data.decode()

    def close(self) -> None:
        self.sock.close()


def frame(command: str, headers: dict[str, str], body: str = "") -> str:
    """One STOMP frame as text."""
    return command + "\n" + "".join(f"{k}:{v}\n" for k, v in headers.items()) + "\n" + body + "\x00"
