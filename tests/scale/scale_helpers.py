"""Helpers of the scale tests: stores on real files, driven from the test thread."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.store import MessageStore, run_completions
from amqtransport.broker.store.journal import Callback

T0 = float(int(time.time()))


class Pump:
    """The journal's ``notify`` for a test: completions (and background checkpoints'
    results) wait here until the test thread runs them, as the broker's loop would."""

    def __init__(self) -> None:
        self.items: deque[list[tuple[Callback, BaseException | None]]] = deque()

    def __call__(self, items: list[tuple[Callback, BaseException | None]]) -> None:
        self.items.append(items)

    def run(self) -> None:
        while self.items:
            run_completions(self.items.popleft())


def msg(i: int, dest: str = "/queue/a", key: str = "", size: int = 100) -> Message:
    return Message(id=f"m{i}", destination=dest, headers=(("n", str(i)),), body=b"%06d" % i + b"x" * size,
                   key=key, timestamp=T0 + i, persistent=True)


def open_store(path: Path, **kw: Any) -> MessageStore:
    store = MessageStore(path, **kw)
    store.open()
    return store


def crash(store: MessageStore) -> None:
    """Stop a store the way a SIGKILL would leave its files: no checkpoint at close
    (everything appended is flushed first, as a crash after the last fsync)."""
    store.flush()
    store.checkpoints.stop()
    store.journal.close()


def state(store: MessageStore, *, segments: bool = True) -> dict[str, Any]:
    """Everything recovery must rebuild: the messages in order, subscriptions, keys (with
    the segment carrying each, unless ``segments`` is false: another journal's numbers)."""
    by_dest = store.messages_by_destination()
    return {
        "count": store.count,
        "messages": {
            d: [(m.id, m.destination, m.headers, m.body, m.key, m.timestamp, m.expires, m.delivery_count) for m in ms]
            for d, ms in sorted(by_dest.items())
        },
        "subs": dict(store.subs),
        "keys": sorted(k if segments else k[:3] for k in store.dedupe.items()),
    }




class Raw:
    """A STOMP 1.2 client on a plain socket, one frame at a time (our codec)."""

    def __init__(self, port: int, **connect: str) -> None:
        import socket

        from amqtransport.stomp import Frame, FrameParser, serialize

        self._Frame, self._serialize = Frame, serialize
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.parser = FrameParser("1.2")
        self.pending: deque[Any] = deque()
        self.send("CONNECT", {"accept-version": "1.2", "host": "localhost", **connect})
        assert self.read().command == "CONNECTED"

    def send(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.sock.sendall(self._serialize(self._Frame.make(command, list(headers.items()), body)))

    def read(self, timeout: float = 30.0) -> Any:
        self.sock.settimeout(timeout)
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the broker")
            self.parser.feed(data)
            self.pending.extend(e for e in self.parser.events() if isinstance(e, self._Frame))
        return self.pending.popleft()

    def receipt(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        """Send with a receipt and wait for it (MESSAGEs arriving meanwhile are kept)."""
        rid = f"r{id(headers)}-{time.monotonic_ns()}"
        self.send(command, {**headers, "receipt": rid}, body)
        kept: list[Any] = []
        while True:
            f = self.read()
            if f.command == "RECEIPT" and f.get("receipt-id") == rid:
                break
            assert f.command != "ERROR", f.headers
            kept.append(f)
        self.pending.extendleft(reversed(kept))

    def close(self) -> None:
        try:
            self.receipt("DISCONNECT", {})
        except (OSError, AssertionError, ConnectionError):
            pass
        self.sock.close()
