"""HTTP/1.1 on the broker's event loop: h11 (sans-IO) under an asyncio ``Protocol``.

Theory of operation
-------------------
The side port speaks HTTP/1.1 with `h11 <https://h11.readthedocs.io>`_, the sans-IO
HTTP library our STOMP codec takes its manner from: bytes in
(``receive_data``), events out (``next_event``), events in (``send``), bytes out. No
thread and no second event loop: :class:`HttpServer` is an ``asyncio.Server`` on the
broker's own loop, one :class:`_HttpConnection` per client, so a request reads the
broker's state between two client frames, and a handler that awaits (an action
waiting for its fsync, a probe of the peer node) never holds the loop.

One request at a time per connection: once a request is complete the connection
stops reading, runs the handler as a task and writes the response; with keep-alive
it then starts the next cycle (h11 keeps pipelined bytes for it). Bounds: request
head :attr:`HttpLimits.max_head` bytes, body :attr:`HttpLimits.max_body` bytes
(413 at once when ``Content-Length`` says more), ``idle_timeout`` seconds for a
connection (new, or kept alive after a response) to start a request, then
``request_timeout`` seconds to finish it, and ``max_connections`` open connections. A
connection over that budget does not wait for a free slot and is not refused while
another is only waiting: the connection idle longest (no request started, else the
oldest request still arriving; never one whose handler runs) is closed to make room.
So idle keep-alive connections, or slow ones, cannot starve the probes (``/healthz``)
an orchestrator relies on. A malformed request gets a 400 naming the problem (431 for a
head, 413 for a body over its limit, 505 for an HTTP version other than 1.0 and 1.1) and
the connection is closed; a handler that raises gets a 500 (logged with its traceback)
and the server goes on. The error answers are the server's ``error_response``: plain
text on the broker's side port (:func:`text_error`), Toxiproxy's JSON on the chaos
proxy's API (``chaos/proxy/http_api.py``), which runs on this same server.
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

import h11

__all__ = ["ErrorResponder", "HttpLimits", "HttpServer", "Request", "Response", "Handler", "text_error"]

log = logging.getLogger(__name__)

SERVER_HEADER = b"amqtransport"


@dataclass(frozen=True)
class HttpLimits:
    max_head: int = 16 * 1024
    max_body: int = 1 << 20
    max_connections: int = 64
    idle_timeout: float = 5.0  # to start a request, on a new or a kept-alive connection
    request_timeout: float = 30.0  # to finish it once its first byte came


@dataclass
class Request:
    method: str
    target: str  # as sent: path and query, percent-encoded
    path: str  # percent-encoded path (split on "/" before decoding segments)
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names; repeats joined with ", " (cookies with "; ")
    body: bytes
    peer: str

    def segments(self) -> list[str]:
        """The path's segments, each percent-decoded (so a name may hold an encoded '/')."""
        return [unquote(s) for s in self.path.strip("/").split("/")] if self.path.strip("/") else []

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response]]
#: ``(status, reason) -> Response``: the answer to a malformed request (4xx, 505) or a
#: handler that raised (500); the connection is closed after a 4xx or 505
ErrorResponder = Callable[[int, str], Response]


def text_error(status: int, reason: str) -> Response:
    """The side port's error answers: plain text."""
    if status == 500:
        return Response(500, b"internal error (see the broker log)\n")
    return Response(status, f"bad request: {reason}\n".encode())


def _request_of(event: h11.Request, peer: str) -> Request:
    headers: dict[str, str] = {}
    for raw_name, raw_value in event.headers:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name in headers:
            headers[name] += ("; " if name == "cookie" else ", ") + value
        else:
            headers[name] = value
    target = event.target.decode("latin-1")
    parts = urlsplit(target)
    query: dict[str, str] = {}
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        query.setdefault(k, v)
    return Request(event.method.decode("ascii", "replace").upper(), target, parts.path or "/", query, headers,
                   b"", peer)


class _HttpConnection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.request: Request | None = None
        self.body: list[bytes] = []
        self.body_size = 0
        self.busy = False  # a handler is running
        self.started = False  # bytes of the next request have come
        self.since = 0.0  # loop time of the connection or of its last response
        self.timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if len(self.server.connections) >= self.limits.max_connections and not self.server.make_room(self.peer):
            log.warning("http: refusing %s: max_connections=%d reached, every one running a request",
                        self.peer, self.limits.max_connections)
            transport.abort()
            return
        self.server.connections.add(self)
        self._wait_for_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if not self.started:
            self.started = True
            self._arm_timer(self.limits.request_timeout)
        try:
            self.conn.receive_data(data)
        except h11.RemoteProtocolError as exc:
            self._bad_request(str(exc))
            return
        self._process()

    def eof_received(self) -> bool | None:
        try:
            self.conn.receive_data(b"")
        except h11.RemoteProtocolError:
            pass
        self._process()
        return None

    # ------------------------------------------------------------------ protocol
    def _wait_for_request(self) -> None:
        self.started = False
        self.since = asyncio.get_running_loop().time()
        self._arm_timer(self.limits.idle_timeout)

    def _arm_timer(self, seconds: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(seconds, self._idle)

    def _idle(self) -> None:
        self.timer = None
        if not self.busy and self.transport is not None:
            self.transport.close()

    def _process(self) -> None:
        while self.transport is not None and not self.busy:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._bad_request(str(exc), exc.error_status_hint)
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                if event.http_version not in (b"1.0", b"1.1"):
                    self._bad_request(f"unsupported HTTP version: {event.http_version.decode('latin-1')!r}", 505)
                    return
                head = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
                if head > self.limits.max_head:
                    self._bad_request(f"request head of {head} bytes is over the limit of "
                                      f"{self.limits.max_head} bytes", 431)
                    return
                self.request = _request_of(event, self.peer)
                self.body, self.body_size = [], 0
                length = self.request.headers.get("content-length", "")
                if length.isdigit() and int(length) > self.limits.max_body:
                    self._bad_request(f"request body of {length} bytes is over the limit of "
                                      f"{self.limits.max_body} bytes", 413)
                    return
                if self.conn.they_are_waiting_for_100_continue:
                    self._send([h11.InformationalResponse(status_code=100, headers=[])])
            elif isinstance(event, h11.Data):
                self.body_size += len(event.data)
                if self.body_size > self.limits.max_body:
                    self._bad_request(f"request body over the limit of {self.limits.max_body} bytes", 413)
                    return
                self.body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                request, self.request = self.request, None
                assert request is not None
                request.body = b"".join(self.body)
                self.body = []
                self.busy = True
                if self.transport is not None:
                    self.transport.pause_reading()
                asyncio.get_running_loop().create_task(self._respond(request))
                return
            elif isinstance(event, h11.ConnectionClosed):
                if self.transport is not None:
                    self.transport.close()
                return

    async def _respond(self, request: Request) -> None:
        try:
            response = await self.server.handler(request)
        except Exception:  # noqa: BLE001 - one bad request must not take the side port down
            log.exception("http: %s %s from %s failed", request.method, request.path, request.peer)
            response = self.server.error_response(500, "internal error")
        head_only = request.method == "HEAD"
        self._write_response(response, head_only)
        self.busy = False
        if self.transport is None:
            return
        if self.conn.our_state is h11.MUST_CLOSE or self.conn.their_state is h11.MUST_CLOSE:
            self.transport.close()
            return
        try:
            self.conn.start_next_cycle()
        except h11.LocalProtocolError:
            self.transport.close()
            return
        self._wait_for_request()
        self.transport.resume_reading()
        self._process()

    def _write_response(self, response: Response, head_only: bool = False) -> None:
        headers = [
            (b"content-type", response.content_type.encode("latin-1")),
            (b"content-length", str(len(response.body)).encode()),
        ] if response.status not in (204, 304) else []  # RFC 9110: no Content-Length on a 204
        headers += [(b"server", SERVER_HEADER), (b"x-content-type-options", b"nosniff")]
        headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
        try:
            reason = http.HTTPStatus(response.status).phrase.encode()
        except ValueError:
            reason = b""
        events: list[h11.Event] = [h11.Response(status_code=response.status, headers=headers, reason=reason)]
        if response.body and not head_only:
            events.append(h11.Data(data=response.body))
        events.append(h11.EndOfMessage())
        self._send(events)

    def _send(self, events: list[h11.Event]) -> None:
        if self.transport is None:
            return
        try:
            data = b"".join(self.conn.send(e) or b"" for e in events)
        except h11.LocalProtocolError as exc:
            log.debug("http: cannot answer %s: %s", self.peer, exc)
            self.transport.close()
            return
        self.transport.write(data)

    def _bad_request(self, reason: str, status: int = 400) -> None:
        log.info("http: bad request from %s: %s", self.peer, reason)
        if self.transport is None:
            return
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            answer = self.server.error_response(status if 400 <= status < 600 else 400, reason)
            answer.headers = [*answer.headers, ("connection", "close")]
            self._write_response(answer)
        self.transport.close()


class HttpServer:
    """An HTTP/1.1 server on the running loop: ``await start()``, ``await stop()``."""

    def __init__(self, handler: Handler, host: str, port: int, limits: HttpLimits | None = None,
                 error_response: ErrorResponder = text_error) -> None:
        self.handler = handler
        self.error_response = error_response
        self.host = host
        self.port = port
        self.limits = limits or HttpLimits()
        self.connections: set[_HttpConnection] = set()
        self._server: asyncio.Server | None = None

    def make_room(self, newcomer: str) -> bool:
        """Close the connection idle longest to admit ``newcomer`` (see the module
        docstring); False when every connection runs a request."""
        candidates = [c for c in self.connections if not c.busy and c.transport is not None]
        if not candidates:
            return False
        victim = min(candidates, key=lambda c: (c.started, c.since))
        log.info("http: max_connections=%d reached: closing %s (%s) for %s", self.limits.max_connections,
                 victim.peer, "a request still arriving" if victim.started else "idle", newcomer)
        self.connections.discard(victim)
        if victim.transport is not None:
            victim.transport.abort()
        return True

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _HttpConnection(self), self.host, self.port,
                                                reuse_address=True)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        try:
            await asyncio.wait_for(server.wait_closed(), 2)
        except TimeoutError:
            pass
