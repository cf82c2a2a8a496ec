"""Frame -> bytes for STOMP 1.0/1.1/1.2.

Rules: headers are escaped as the version and command call for (see
:mod:`.escaping`); a ``content-length`` header is added for every non-empty body
that has none (so a body may contain NUL) -- except in *text mode* for a SEND whose
``content-type`` is ``text/...`` and whose body has no NUL (ActiveMQ and Artemis turn a
message with ``content-length`` into a JMS BytesMessage, one without into a
TextMessage); a frame that cannot be expressed in the
version raises :class:`~amqtransport.errors.LocalProtocolError` instead of putting
bytes on the wire that the peer would misread.

The common frame -- STOMP 1.1/1.2, an escaped command, ``(str, str)`` headers with
nothing to escape, no ``content-length`` of its own -- takes a fast path of a few
C-level calls (every client ``send`` goes through here); anything else, and every
frame the fast path is unsure of, takes the checked path, which writes the same bytes
or raises the error. ``tests/stomp/test_stomp_serializer.py`` checks both agree.
"""

from __future__ import annotations

import re
from itertools import chain
from typing import Final

from amqtransport.errors import LocalProtocolError

from .escaping import escape_header, needs_escaping, unexpressible
from .frames import CLIENT_COMMANDS, SERVER_COMMANDS, Frame
from .versions import UNESCAPED_COMMANDS, check_version

__all__ = ["serialize"]

_ALL_COMMANDS = CLIENT_COMMANDS | SERVER_COMMANDS
#: the commands whose headers 1.1 and 1.2 escape
_ESCAPED_COMMANDS: Final = _ALL_COMMANDS - UNESCAPED_COMMANDS
#: a character that 1.1 or 1.2 escapes (or, a carriage return, 1.1 cannot write at the end)
_NEEDS_CARE: Final = re.compile(r"[\\\r\n:]").search


def serialize(frame: Frame, version: str = "1.2", *, text_mode: bool = False) -> bytes:
    """Encode ``frame`` for a connection speaking ``version`` (``text_mode``: see the
    module docstring)."""
    command = frame.command
    if (version == "1.2" or version == "1.1") and type(command) is str and command in _ESCAPED_COMMANDS:
        fast = _plain(frame, text_mode)
        if fast is not None:
            return fast
    return _checked(frame, version, text_mode)


def _plain(frame: Frame, text_mode: bool) -> bytes | None:
    """The bytes of a frame with nothing to escape or check (see the module docstring),
    or None: the checked path decides."""
    headers = frame.headers
    body = frame.body
    try:
        flat = list(chain.from_iterable(headers))
        names = flat[::2]
        if (type(body) is not bytes or (headers and set(map(len, headers)) != {2})
                or _NEEDS_CARE("".join(flat)) or "" in names or "content-length" in names
                or (text_mode and "content-type" in names)):
            return None
        head = "\n".join([frame.command, *map(":".join, headers)])
        if body:
            head = f"{head}\ncontent-length:{len(body)}"
        return b"".join((head.encode("utf-8"), b"\n\n", body, b"\x00"))
    except (TypeError, UnicodeEncodeError):  # not str pairs, not encodable: the checked path says what
        return None


def _checked(frame: Frame, version: str, text_mode: bool) -> bytes:
    check_version(version)
    command = frame.command
    if not isinstance(command, str) or not command:
        raise LocalProtocolError("cannot serialize a frame with an empty command")
    if command not in _ALL_COMMANDS:
        raise LocalProtocolError(
            f"unknown STOMP command {command!r}; expected one of {', '.join(sorted(_ALL_COMMANDS))}"
        )
    body = frame.body
    if not isinstance(body, bytes | bytearray):
        raise LocalProtocolError(f"{command} frame body must be bytes, got {type(body).__name__}")
    escaped = needs_escaping(version, command)
    parts = [command]
    has_length = False
    text_body = False
    for item in frame.headers:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise LocalProtocolError(f"{command} frame header {item!r} is not a (name, value) pair") from None
        if not isinstance(name, str) or not isinstance(value, str):
            raise LocalProtocolError(f"{command} frame header {item!r}: name and value must be str")
        if not name:
            raise LocalProtocolError(f"{command} frame has a header with an empty name")
        if text_mode and name == "content-type" and value.startswith("text/"):
            text_body = True
        if name == "content-length" and not has_length:
            has_length = True
            if value.strip() != str(len(body)):
                raise LocalProtocolError(
                    f"{command} frame has content-length {value!r} but its body is {len(body)} bytes"
                )
        problem = unexpressible(name, value, version, command)
        if problem is not None:
            raise LocalProtocolError(problem)
        if escaped:
            name = escape_header(name, version)
            value = escape_header(value, version)
        parts.append(f"{name}:{value}")
    if body and not has_length and not (text_body and command == "SEND" and b"\x00" not in body):
        parts.append(f"content-length:{len(body)}")
    parts.append("\n")
    try:
        head = "\n".join(parts).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"{command} frame headers cannot be encoded as UTF-8: {exc}") from None
    return b"".join((head, body, b"\x00"))
