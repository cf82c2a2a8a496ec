"""Small real-socket helpers for testing through the chaos proxy (tests and scenarios).

:class:`UpstreamServer` is a threaded TCP server on ``127.0.0.1:0`` that runs a
handler per connection (:func:`echo_handler`, :func:`greet_and_close_handler`), and
counts connections; the functions below are blocking-socket conveniences.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

__all__ = [
    "UpstreamServer",
    "echo_handler",
    "greet_and_close_handler",
    "listen_addr",
    "connect",
    "recv_exactly",
    "recv_until_closed",
]

ConnHandler = Callable[[socket.socket], None]


class UpstreamServer:
    """A threaded TCP server on 127.0.0.1:0 running ``handler(sock)`` per connection."""

    def __init__(self, handler: ConnHandler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
        self.listener.settimeout(0.2)
        self.port: int = self.listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.accepted = 0
        self.open = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True, name="upstream")
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.open += 1
                self._socks.append(sock)
            threading.Thread(target=self._run, args=(sock,), daemon=True).start()

    def _run(self, sock: socket.socket) -> None:
        try:
            self.handler(sock)
        except OSError:
            pass
        finally:
            with self._lock:
                self.open -= 1
            sock.close()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        self._thread.join(timeout=5)
        with self._lock:
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def echo_handler(sock: socket.socket) -> None:
    while True:
        data = sock.recv(65536)
        if not data:
            return
        sock.sendall(data)


def greet_and_close_handler(sock: socket.socket) -> None:
    sock.sendall(b"bye")


def listen_addr(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def connect(listen: str, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(listen_addr(listen), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = sock.recv(n - len(out))
        if not data:
            break
        out += data
    return bytes(out)


def recv_until_closed(sock: socket.socket) -> bytes:
    out = bytearray()
    while True:
        data = sock.recv(65536)
        if not data:
            return bytes(out)
        out += data
