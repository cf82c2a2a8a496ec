"""Incremental, sans-IO STOMP 1.0/1.1/1.2 frame parser (h11 style).

Theory of operation
-------------------
Bytes go in with :meth:`FrameParser.feed`; events come out of
:meth:`FrameParser.next_event`: a :class:`Frame`, a :data:`HEARTBEAT` (a bare EOL
between frames) or :data:`NEED_DATA` (nothing complete yet; feed more). The parser
never does I/O, never blocks and never looks at a clock.

All received bytes live in one ``bytearray``. ``_pos`` is where the unconsumed data
starts; ``_scan`` is where the next search resumes, so bytes already examined are
never examined again however small the chunks are (a 1 MiB body fed 4 KiB at a
time costs O(n), not O(n^2)). Consumed bytes are dropped from the front of the
buffer only when they are at least half of it, which keeps that amortised O(n) too.

The state machine has three states:

``IDLE``      between frames. ``LF`` or ``CR LF`` is a heart-beat event; anything
              else starts a frame.
``HEADERS``   waiting for the blank line that ends the header block (``\\n\\n`` or
              ``\\n\\r\\n``, found with one regex search from ``_scan``). When it is
              there the whole block is decoded (UTF-8), split into lines (a trailing
              CR is dropped: CR LF and LF both end a line), the command checked, the
              headers split on their first ``:`` and unescaped where the version
              and command call for it (never for CONNECT/STOMP/CONNECTED, never in
              1.0; 1.1 knows ``\\n \\c \\\\``, 1.2 adds ``\\r``). Repeated headers are
              kept in order; the first ``content-length`` decides the body.
``BODY``      with a content-length: wait for that many bytes plus one that must be
              NUL; without: search for the first NUL from ``_scan``.

Every search is bounded by the limits (:class:`Limits`), so a peer cannot make the
buffer grow past ``max_frame_size`` (plus one chunk) without an error. While a header
block is incomplete, the LFs of newly arrived bytes are counted and the start of the
current line remembered, so too many headers or an endless line are refused as soon
as they arrive, at a cost proportional to the new bytes only. Any problem
raises :class:`~amqtransport.errors.RemoteProtocolError` with a message that names
what is wrong (and the limit and its value, for limits); after that the parser is
dead and every further call raises again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Final

from amqtransport.errors import RemoteProtocolError

from .escaping import needs_escaping, unescape_header
from .frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    NEED_DATA,
    SERVER_COMMANDS,
    Frame,
    Heartbeat,
    NeedData,
)
from .limits import Limits
from .versions import check_version

__all__ = ["FrameParser", "ALL_COMMANDS"]

#: Every command the parser accepts by default (client and server frames).
ALL_COMMANDS: Final = CLIENT_COMMANDS | SERVER_COMMANDS

_IDLE: Final = 0
_HEADERS: Final = 1
_BODY: Final = 2

# The end of the header block: the EOL of the last header line followed by an empty line.
_HEADER_END: Final = re.compile(rb"\n\r?\n")

# Drop consumed bytes from the buffer front once there are at least this many of them.
_COMPACT_MIN: Final = 64 * 1024


def _preview(data: bytes | bytearray, limit: int = 40) -> str:
    text = repr(bytes(data[:limit]))
    return text + ("..." if len(data) > limit else "")


class FrameParser:
    """Turns a byte stream into STOMP frames and heart-beats. See the module docstring."""

    def __init__(
        self,
        version: str = "1.2",
        limits: Limits = Limits(),  # noqa: B008 - frozen, shared safely
        *,
        commands: Iterable[str] | None = None,
    ) -> None:
        self._version = check_version(version)
        self.limits = limits
        self._commands: frozenset[str] = ALL_COMMANDS if commands is None else frozenset(commands)
        self._buf = bytearray()
        self._pos = 0
        self._scan = 0
        self._state = _IDLE
        self._error: RemoteProtocolError | None = None
        # Frame being parsed (valid in the BODY state).
        self._command = ""
        self._headers: tuple[tuple[str, str], ...] = ()
        self._body_start = 0
        self._content_length: int | None = None
        # Incomplete header block bookkeeping (HEADERS state): where the current line
        # starts, how many LFs were seen so far and up to where they were counted.
        self._line_start = 0
        self._newlines = 0
        self._counted_to = 0

    # -- public API -------------------------------------------------------------

    @property
    def version(self) -> str:
        """Protocol version used to unescape headers; set it after negotiation."""
        return self._version

    @version.setter
    def version(self, value: str) -> None:
        self._version = check_version(value)

    @property
    def pending_bytes(self) -> int:
        """Bytes received but not yet returned as events (a partial frame, say)."""
        return len(self._buf) - self._pos

    @property
    def in_frame(self) -> bool:
        """True when part of a frame has been received (useful to tell a clean EOF)."""
        return self._state != _IDLE or self._pos < len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes. Cheap: parsing happens in :meth:`next_event`."""
        if self._error is not None:
            raise self._dead()
        if data:
            self._buf += data

    def next_event(self) -> Frame | Heartbeat | NeedData:
        """The next complete event, or :data:`NEED_DATA`."""
        if self._error is not None:
            raise self._dead()
        try:
            return self._next()
        except RemoteProtocolError as exc:
            self._error = exc
            raise
        except Exception as exc:  # pragma: no cover - defensive: the contract is one exception type
            err = RemoteProtocolError(f"internal parser error on malformed input: {exc!r}")
            self._error = err
            raise err from exc

    def events(self) -> Iterator[Frame | Heartbeat]:
        """Yield every event that is ready, stopping at :data:`NEED_DATA`."""
        while True:
            event = self.next_event()
            if isinstance(event, NeedData):
                return
            yield event

    # -- internals --------------------------------------------------------------

    def _dead(self) -> RemoteProtocolError:
        return RemoteProtocolError(f"parser is unusable after an earlier error: {self._error}")

    def _compact(self) -> None:
        pos = self._pos
        if pos >= _COMPACT_MIN and pos * 2 >= len(self._buf):
            del self._buf[:pos]
            self._pos = 0
            self._scan -= pos
            self._body_start -= pos

    def _next(self) -> Frame | Heartbeat | NeedData:
        if self._state == _BODY:
            return self._read_body()
        buf = self._buf
        if self._state == _IDLE:
            self._compact()
            pos = self._pos
            n = len(buf)
            if pos >= n:
                return NEED_DATA
            first = buf[pos]
            if first == 10:
                self._pos = self._scan = pos + 1
                return HEARTBEAT
            if first == 13:
                if pos + 1 >= n:
                    return NEED_DATA
                if buf[pos + 1] == 10:
                    self._pos = self._scan = pos + 2
                    return HEARTBEAT
                raise RemoteProtocolError(
                    "carriage return not followed by line feed between frames "
                    f"(got {_preview(buf[pos:])}); a line must end with LF or CR LF"
                )
            self._state = _HEADERS
            self._scan = self._line_start = self._counted_to = pos
            self._newlines = 0
        return self._read_headers()

    def _read_headers(self) -> Frame | NeedData:
        buf = self._buf
        limits = self.limits
        start = self._pos
        n = len(buf)
        # Cannot match beyond the frame size limit: bound the search there.
        match = _HEADER_END.search(buf, self._scan, min(n, start + limits.max_frame_size + 2))
        if match is None:
            if n - start > limits.max_frame_size:
                raise RemoteProtocolError(
                    f"frame headers exceed max_frame_size={limits.max_frame_size} bytes "
                    "without the blank line that ends the header block"
                )
            # Only the bytes that arrived since the last call are looked at.
            counted_to = self._counted_to
            last_nl = buf.rfind(b"\n", counted_to, n)
            if last_nl >= 0:
                self._line_start = last_nl + 1
                self._newlines += buf.count(b"\n", counted_to, n)
                if self._newlines - 1 > limits.max_headers:
                    raise RemoteProtocolError(
                        f"frame has more than max_headers={limits.max_headers} header lines"
                    )
            self._counted_to = n
            line_start = self._line_start
            if n - line_start > limits.max_header_line + 1:  # +1: the CR of a CR LF
                raise RemoteProtocolError(
                    f"header line longer than max_header_line={limits.max_header_line} bytes "
                    f"(starts {_preview(buf[line_start:])})"
                )
            self._scan = max(start, n - 2)
            return NEED_DATA

        block_end = match.start()
        body_start = match.end()
        if body_start - start > limits.max_frame_size:
            raise RemoteProtocolError(
                f"frame headers are {body_start - start} bytes, over max_frame_size={limits.max_frame_size}"
            )
        raw = bytes(buf[start:block_end])
        if block_end - start > limits.max_header_line:
            for raw_line in raw.split(b"\n"):
                line_len = len(raw_line) - (1 if raw_line.endswith(b"\r") else 0)
                if line_len > limits.max_header_line:
                    raise RemoteProtocolError(
                        f"header line of {line_len} bytes is longer than "
                        f"max_header_line={limits.max_header_line} (starts {_preview(raw_line)})"
                    )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RemoteProtocolError(
                f"frame command/headers are not valid UTF-8 ({exc.reason} at byte {exc.start} "
                f"of {_preview(raw)})"
            ) from None
        lines = text.split("\n")
        if "\r" in text:
            lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        command = lines[0]
        if command not in self._commands:
            if not command:
                raise RemoteProtocolError("frame has an empty command line")
            raise RemoteProtocolError(
                f"unknown STOMP command {command[:40]!r}; expected one of "
                f"{', '.join(sorted(self._commands))}"
            )
        if len(lines) - 1 > limits.max_headers:
            raise RemoteProtocolError(
                f"{command} frame has {len(lines) - 1} headers, over max_headers={limits.max_headers}"
            )
        escaped = needs_escaping(self._version, command)
        headers: list[tuple[str, str]] = []
        content_length: str | None = None
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise RemoteProtocolError(
                    f"{command} frame has a header line without ':' separating name and value: "
                    f"{line[:60]!r}"
                )
            if not name:
                raise RemoteProtocolError(
                    f"{command} frame has a header with an empty name: {line[:60]!r}"
                )
            if escaped and "\\" in line:
                name = unescape_header(name, self._version)
                value = unescape_header(value, self._version)
            if content_length is None and name == "content-length":
                content_length = value
            headers.append((name, value))

        length: int | None = None
        if content_length is not None:
            digits = content_length.strip()
            if not (digits.isascii() and digits.isdigit()):
                raise RemoteProtocolError(
                    f"{command} frame has content-length {content_length!r}; "
                    "it must be a non-negative decimal integer (the body size in bytes)"
                )
            length = int(digits)
            total = body_start - start + length + 1
            if total > limits.max_frame_size:
                raise RemoteProtocolError(
                    f"{command} frame would be {total} bytes (content-length {length}), "
                    f"over max_frame_size={limits.max_frame_size}"
                )
        self._command = command
        self._headers = tuple(headers)
        self._body_start = body_start
        self._content_length = length
        self._scan = body_start
        self._state = _BODY
        return self._read_body()

    def _read_body(self) -> Frame | NeedData:
        buf = self._buf
        start = self._pos
        body_start = self._body_start
        length = self._content_length
        if length is not None:
            end = body_start + length
            if len(buf) <= end:
                return NEED_DATA
            if buf[end] != 0:
                raise RemoteProtocolError(
                    f"{self._command} frame body of content-length {length} is not followed by "
                    f"NUL (found byte 0x{buf[end]:02x}); the content-length header is probably wrong"
                )
        else:
            max_size = self.limits.max_frame_size
            limit_end = start + max_size  # NUL must be at an index < this
            end = buf.find(b"\x00", self._scan, limit_end)
            if end < 0:
                if len(buf) >= limit_end:
                    raise RemoteProtocolError(
                        f"{self._command} frame without content-length has no NUL within "
                        f"max_frame_size={max_size} bytes"
                    )
                self._scan = len(buf)
                return NEED_DATA
        frame = Frame(self._command, self._headers, bytes(buf[body_start:end]))
        self._pos = self._scan = end + 1
        self._state = _IDLE
        self._headers = ()
        return frame
