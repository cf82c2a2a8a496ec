"""Blocking TCP and TLS streams (and ``vm://`` leaves) — the real I/O boundary.

Theory of operation
-------------------
One socket per stream, kept in blocking mode with a *write* timeout. Reads never
block on the socket itself: the reader first waits for readability with ``poll``
(bounded by the caller's timeout, so a heart-beat deadline can be checked), then
calls ``recv`` once. TLS records already decrypted and buffered inside the
``SSLSocket`` are drained before polling (``pending()``), since ``poll`` cannot
see them. ``close`` shuts the socket down before closing it, which wakes a reader
blocked in ``poll`` on every platform we run on.

A plain TCP stream also keeps a second socket object on a duplicate of the
descriptor, with timeout 0: Python polls before every call on a socket with a
timeout, so a ``recv`` after our own ``poll`` went through ``poll`` twice, and every
``sendall`` once. The reader's ``recv`` goes through the duplicate (our ``poll`` said
there is data), and a write first tries one ``send`` there; only what the kernel did
not take goes through ``sendall`` with the write timeout. (Both objects share one
open file: the timeout socket keeps it non-blocking already, so nothing changes
for either.)

Every ``OSError`` / ``ssl.SSLError`` / ``socket.timeout`` is mapped here, once,
into ``ConnectError`` (``ConnectRefused`` when the port is closed), ``ReadError``,
``WriteError`` or ``ConnectionClosed``.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import socket
import ssl
import struct
import threading
from typing import Any

from amqtransport._backends.base import leaf_address
from amqtransport.activemq_options import SocketSettings, socket_settings
from amqtransport.errors import (
    ConnectError,
    ConnectionClosed,
    ConnectRefused,
    ReadError,
    WriteError,
)

__all__ = ["SocketStream", "SocketBackend", "apply_socket_settings", "build_ssl_context", "DEFAULT_WRITE_TIMEOUT",
           "vm_endpoint", "vm_name"]

log = logging.getLogger(__name__)

#: Seconds a single write may block (a peer that stops reading altogether).
DEFAULT_WRITE_TIMEOUT = 30.0


class SocketStream:
    """A connected socket (plain or TLS). Thread-safe writes, one reader."""

    def __init__(self, sock: socket.socket, peer: str, *, write_timeout: float = DEFAULT_WRITE_TIMEOUT) -> None:
        self._sock = sock
        self._peer = peer
        self._wlock = threading.Lock()
        self._closed = False
        sock.settimeout(write_timeout)
        #: the same socket without a timeout (plain TCP only; see the module docstring)
        self._direct: socket.socket | None = None
        if not isinstance(sock, ssl.SSLSocket):
            self._direct = socket.socket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
            self._direct.settimeout(0.0)
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)

    @property
    def peer(self) -> str:
        return self._peer

    def read(self, max_bytes: int, timeout: float | None) -> bytes | None:
        if self._closed:
            raise ConnectionClosed(f"{self._peer}: stream closed")
        sock = self._sock
        try:
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                ms = None if timeout is None else max(0, int(timeout * 1000))
                if not self._poll.poll(ms):
                    return None
            if self._closed:
                raise ConnectionClosed(f"{self._peer}: stream closed")
            direct = self._direct
            return sock.recv(max_bytes) if direct is None else direct.recv(max_bytes)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return None
        except TimeoutError:
            return None
        except ConnectionClosed:
            raise
        except (OSError, ValueError) as exc:
            if self._closed:
                raise ConnectionClosed(f"{self._peer}: stream closed") from exc
            raise ReadError(f"{self._peer}: read failed: {exc}") from exc

    def write(self, data: bytes) -> None:
        with self._wlock:
            if self._closed:
                raise ConnectionClosed(f"{self._peer}: stream closed")
            try:
                direct = self._direct
                sent = 0
                if direct is not None:
                    try:
                        sent = direct.send(data)
                    except BlockingIOError:
                        pass
                if sent < len(data):
                    self._sock.sendall(memoryview(data)[sent:] if sent else data)
            except TimeoutError as exc:
                raise WriteError(f"{self._peer}: write timed out (peer not reading)") from exc
            except (OSError, ValueError) as exc:
                if self._closed:
                    raise ConnectionClosed(f"{self._peer}: stream closed") from exc
                raise WriteError(f"{self._peer}: write failed: {exc}") from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for sock in (self._sock, self._direct):
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass


_TLS_VERSIONS = {"TLSv1": ssl.TLSVersion.TLSv1, "TLSv1.1": ssl.TLSVersion.TLSv1_1,
                 "TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def apply_socket_settings(sock: Any, settings: SocketSettings) -> None:
    """The socket options a broker URI asks for (ActiveMQ's keepAlive, tcpNoDelay,
    socketBufferSize, soLinger, typeOfService/diffServ, socket.*); see activemq_options.py."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if settings.tcp_no_delay else 0)
        if settings.keep_alive is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1 if settings.keep_alive else 0)
        if settings.receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, settings.receive_buffer)
        if settings.send_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, settings.send_buffer)
        if settings.linger is not None and settings.linger >= 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, settings.linger))
        if settings.tos is not None and sock.family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, settings.tos)
    except OSError as exc:
        raise ConnectError(f"cannot set the socket options the URI asks for: {exc}") from exc


def build_ssl_context(options: Any, settings: SocketSettings | None = None) -> ssl.SSLContext:
    """An ``SSLContext`` from a leaf's options (``ca_file``, ``cert_file``,
    ``key_file``, ``verify``) and ActiveMQ's (``verifyHostName``, ``socket.enabledProtocols``).
    Bad files raise ``ConnectError`` naming the option."""
    ca_file = getattr(options, "ca_file", None)
    cert_file = getattr(options, "cert_file", None)
    key_file = getattr(options, "key_file", None)
    verify = getattr(options, "verify", True)
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConnectError(f"ssl: cannot load ca_file {ca_file!r}: {exc}") from exc
    if cert_file:
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"ssl: cannot load cert_file {cert_file!r} / key_file {key_file!r}: {exc}") from exc
    if verify is False:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if settings is not None and settings.verify_host_name is False:
        ctx.check_hostname = False
    versions = [_TLS_VERSIONS[v] for v in settings.tls_versions if v in _TLS_VERSIONS] if settings else []
    if versions:
        ctx.minimum_version, ctx.maximum_version = min(versions), max(versions)
    return ctx


class SocketBackend:
    """Connects ``tcp://`` and ``ssl://`` leaves; ``vm://NAME`` starts (once per
    process) an embedded broker called NAME on a free port and connects to it."""

    def __init__(self, *, write_timeout: float = DEFAULT_WRITE_TIMEOUT) -> None:
        self.write_timeout = write_timeout

    def connect(self, leaf: Any, timeout: float) -> SocketStream:
        scheme = getattr(leaf, "scheme", "tcp")
        if scheme == "vm":
            host, port = vm_endpoint(vm_name(leaf))
        else:
            host, port = leaf.host, int(leaf.port)
        peer = leaf_address(leaf)
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except TimeoutError as exc:
            raise ConnectError(f"{peer}: connect timed out after {timeout:g}s") from exc
        except ConnectionRefusedError as exc:
            raise ConnectRefused(f"{peer}: connect failed: {exc.strerror or exc}") from exc
        except OSError as exc:
            raise ConnectError(f"{peer}: connect failed: {exc.strerror or exc}") from exc
        settings = socket_settings(getattr(leaf, "amq", ()))
        try:
            apply_socket_settings(sock, settings)
            if scheme == "ssl":
                options = getattr(leaf, "options", None)
                ctx = build_ssl_context(options, settings)
                server_hostname = getattr(options, "server_hostname", None) or host
                sock.settimeout(timeout)
                try:
                    sock = ctx.wrap_socket(sock, server_hostname=server_hostname)
                except TimeoutError as exc:
                    raise ConnectError(f"{peer}: TLS handshake timed out") from exc
                except (OSError, ssl.SSLError) as exc:
                    raise ConnectError(f"{peer}: TLS handshake failed: {exc}") from exc
            write_timeout = settings.write_timeout_ms / 1000.0 if settings.write_timeout_ms else self.write_timeout
            return SocketStream(sock, peer, write_timeout=write_timeout)
        except BaseException:
            sock.close()
            raise


_vm_lock = threading.Lock()
_vm_brokers: dict[str, Any] = {}


def _stop_vm_brokers() -> None:
    """Stop every ``vm://`` broker this process started (at interpreter exit), so each
    removes its private data directory. A ``vm://`` broker lives as long as the process:
    it is not stopped when its last connection closes (a later ``vm://NAME`` finds the
    same broker and the messages left on it)."""
    with _vm_lock:
        brokers = list(_vm_brokers.items())
        _vm_brokers.clear()
    for name, broker in brokers:
        try:
            broker.stop()
        except Exception:  # noqa: BLE001 - at exit: report and go on with the others
            log.exception("vm://%s: the embedded broker did not stop cleanly", name)


def vm_name(leaf: object) -> str:
    """The embedded broker's name in a ``vm://NAME`` leaf."""
    return str(getattr(leaf, "name", None) or getattr(leaf, "host", "") or "localhost")


def vm_endpoint(name: str) -> tuple[str, int]:
    """The (host, port) of the in-process embedded broker ``name``, started on first use."""
    with _vm_lock:
        broker = _vm_brokers.get(name)
        if broker is None:
            try:
                from amqtransport.broker import EmbeddedBroker
            except ImportError as exc:  # pragma: no cover - the broker ships with the package
                raise ConnectError(f"vm://{name}: the embedded broker is not available: {exc}") from exc
            broker = EmbeddedBroker(port=0, name=name)
            broker.start()
            if not _vm_brokers:
                atexit.register(_stop_vm_brokers)
            _vm_brokers[name] = broker
            log.info("vm://%s: started an embedded broker on %s", name, broker.uri)
        return broker.host, int(broker.port)
