"""A minimal asyncio HTTP/1.1 server: enough for a JSON API and its clients.

Theory of operation: one task per connection reads a request head (up to
``\\r\\n\\r\\n``), parses it with the pure :func:`parse_request_head`, reads the body
(``Content-Length`` or ``chunked``), calls the handler, writes the response and
loops while the connection is keep-alive. A malformed request gets a JSON error
(``{"error", "status"}``) and the connection is closed; a handler that raises gets
a 500 and the server keeps serving. Errors never escape a connection task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import unquote, urlsplit

from amqtransport.errors import AmqTransportError
from chaos.proxy.listener import Listener

__all__ = [
    "HttpError",
    "RequestHead",
    "Request",
    "Response",
    "Handler",
    "parse_request_head",
    "read_body",
    "json_response",
    "error_response",
    "HttpServer",
    "start_http_server",
    "MAX_HEAD",
    "MAX_BODY",
]

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
MAX_BODY = 8 * 1024 * 1024
MAX_HEADERS = 100
_HEX = frozenset(b"0123456789abcdefABCDEF")
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class HttpError(AmqTransportError):
    """A request could not be parsed; ``status`` is the answer to send before closing."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, name: str) -> str | None:
        """The last value of a header (names are case-insensitive), or None."""
        name = name.lower()
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found

    @property
    def path_segments(self) -> list[str]:
        """The URL path split on ``/``, percent-decoded, empty segments dropped."""
        path = urlsplit(self.target).path
        return [unquote(part) for part in path.split("/") if part]

    @property
    def keep_alive(self) -> bool:
        connection = (self.header("connection") or "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


@dataclass(frozen=True)
class Request:
    head: RequestHead
    body: bytes = b""

    @property
    def method(self) -> str:
        return self.head.method


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default_factory=tuple)


Handler = Callable[[Request], Awaitable[Response]]


def parse_request_head(data: bytes) -> RequestHead:
    """Parse a request line and headers (without the final blank line).

    Raises :class:`HttpError` (400, or 505 for an unsupported HTTP version) naming
    what is wrong.
    """
    try:
        text = data.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes anything
        raise HttpError(400, "request head is not text") from exc
    lines = text.split("\r\n")
    while lines and lines[0] == "":
        lines.pop(0)  # RFC 9112: ignore empty lines before the request line
    if not lines:
        raise HttpError(400, "empty request")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise HttpError(400, f"malformed request line: {lines[0][:100]!r}")
    method, target, version = parts
    if not method or not set(method) <= _TOKEN:
        raise HttpError(400, f"malformed method: {method[:50]!r}")
    if not target or any(c.isspace() or ord(c) < 0x21 or ord(c) > 0x7E for c in target):
        raise HttpError(400, f"malformed request target: {target[:100]!r}")
    if not version.startswith("HTTP/"):
        raise HttpError(400, f"malformed HTTP version: {version[:20]!r}")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise HttpError(505, f"unsupported HTTP version: {version[:20]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            raise HttpError(400, "empty line inside the headers")
        if line[0] in " \t":
            raise HttpError(400, "obsolete header line folding is not accepted")
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= _TOKEN:
            raise HttpError(400, f"malformed header line: {line[:100]!r}")
        if any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value):
            raise HttpError(400, f"control character in header {name!r}")
        headers.append((name.lower(), value.strip(" \t")))
        if len(headers) > MAX_HEADERS:
            raise HttpError(431, "too many headers")
    return RequestHead(method, target, version, tuple(headers))


def json_response(status: int, payload: object) -> Response:
    return Response(status, json.dumps(payload).encode("utf-8") + b"\n")


def error_response(status: int, message: str) -> Response:
    """Toxiproxy's error shape: ``{"error": message, "status": status}``."""
    return json_response(status, {"error": message, "status": status})


async def read_body(reader: asyncio.StreamReader, head: RequestHead) -> bytes:
    """Read the body ``head`` announces (``Content-Length`` or ``chunked``; none: empty).

    Raises :class:`HttpError` (400, 413, 501) naming what is wrong.
    """
    if head.header("transfer-encoding") is not None:
        if (head.header("transfer-encoding") or "").lower() != "chunked":
            raise HttpError(501, "only chunked transfer-encoding is supported")
        return await _read_chunked(reader)
    length_text = head.header("content-length")
    if length_text is None:
        return b""
    if not length_text.isascii() or not length_text.isdigit():
        raise HttpError(400, f"invalid Content-Length: {length_text[:30]!r}")
    length = int(length_text)
    if length > MAX_BODY:
        raise HttpError(413, f"body too large ({length} bytes, at most {MAX_BODY})")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise HttpError(400, "body shorter than Content-Length") from exc


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    try:
        while True:
            size_line = (await reader.readuntil(b"\r\n"))[:-2]
            size_text = size_line.split(b";", 1)[0].strip(b" \t")
            if not size_text or len(size_text) > 16 or not set(size_text) <= _HEX:
                raise HttpError(400, f"invalid chunk size: {size_text[:20]!r}")
            size = int(size_text, 16)
            if len(body) + size > MAX_BODY:
                raise HttpError(413, f"body too large (at most {MAX_BODY} bytes)")
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers, ignored
                return bytes(body)
            body += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise HttpError(400, "chunk not followed by CRLF")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise HttpError(400, "truncated chunked body") from exc


def _encode(response: Response, keep_alive: bool, head_only: bool = False) -> bytes:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {response.status} {reason}"]
    if response.status != 204 and response.status >= 200:
        lines.append(f"Content-Type: {response.content_type}")
        lines.append(f"Content-Length: {len(response.body)}")
    lines.extend(f"{k}: {v}" for k, v in response.headers)
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if response.status != 204 and not head_only:
        out += response.body
    return out


async def _serve_connection(
    handler: Handler, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            try:
                raw = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial.strip():
                    raise HttpError(400, "connection closed inside a request head") from exc
                return
            except asyncio.LimitOverrunError as exc:
                raise HttpError(431, f"request head larger than {MAX_HEAD} bytes") from exc
            head = parse_request_head(raw[:-4])
            if (head.header("expect") or "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await read_body(reader, head)
            try:
                response = await handler(Request(head, body))
            except Exception:
                log.exception("handler failed for %s %s", head.method, head.target)
                response = error_response(500, "internal server error")
            keep_alive = head.keep_alive
            writer.write(_encode(response, keep_alive, head.method == "HEAD"))
            await writer.drain()
            if not keep_alive:
                return
    except HttpError as exc:
        with contextlib.suppress(OSError):
            writer.write(_encode(error_response(exc.status, exc.message), keep_alive=False))
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


class HttpServer:
    """A listening HTTP server; :meth:`close` also closes every open connection."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._listener: Listener | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("HTTP server is not listening")
        return self._listener.address[1]

    async def start(self, host: str, port: int) -> None:
        sock = socket.create_server((host, port), family=_family(host), reuse_port=False)
        self._listener = Listener(sock, self._on_connection, limit=MAX_HEAD)
        self._listener.start()

    def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.get_running_loop().create_task(
            _serve_connection(self._handler, reader, writer)
        )
        self._tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            self._writers.discard(writer)

        task.add_done_callback(done)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_setups()
            self._listener = None
        for task in list(self._tasks):
            task.cancel()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.sleep(0)  # let the transports run connection_lost


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


async def start_http_server(handler: Handler, host: str, port: int) -> HttpServer:
    """Serve ``handler`` on ``host:port`` (0 picks a free port)."""
    server = HttpServer(handler)
    await server.start(host, port)
    return server
