"""STOMP header escaping.

STOMP 1.0 has no escaping. STOMP 1.1 escapes ``\\n`` (LF), ``\\c`` (``:``) and ``\\\\``
(backslash). STOMP 1.2 adds ``\\r`` (CR). Any other backslash sequence is a fatal
protocol error ("undefined escape"). Headers of CONNECT, STOMP and CONNECTED frames
are never escaped in any version, so that a 1.0-only peer can read the handshake.
"""

from __future__ import annotations

import re
from typing import Final, NoReturn

from amqtransport.errors import RemoteProtocolError

__all__ = ["escape_header", "unescape_header", "needs_escaping"]

# Characters that need escaping; most header values have none, so a C-speed search
# decides whether the (slower) replacements run at all.
_SPECIAL_12: Final = re.compile(r"[\\\r\n:]").search
_SPECIAL_11: Final = re.compile(r"[\\\n:]").search

_UNESCAPE_12: Final = {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}
_UNESCAPE_11: Final = {"n": "\n", "c": ":", "\\": "\\"}

_ESCAPE_RE: Final = re.compile(r"\\(.?)", re.DOTALL)


def needs_escaping(version: str, command: str) -> bool:
    """Whether headers of ``command`` frames are escaped under ``version``."""
    return version != "1.0" and command not in ("CONNECT", "STOMP", "CONNECTED")


def escape_header(text: str, version: str = "1.2") -> str:
    """Escape a header name or value for ``version`` (1.1 or 1.2; 1.0 returns it unchanged).

    Under 1.1 a CR cannot be escaped and is left as is (the serializer decides whether
    the result is still expressible).
    """
    if version == "1.2":
        if _SPECIAL_12(text) is None:
            return text
        return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n").replace(":", "\\c")
    if version == "1.1":
        if _SPECIAL_11(text) is None:
            return text
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
    return text


def unescape_header(text: str, version: str = "1.2") -> str:
    """Undo :func:`escape_header`; an undefined escape raises :class:`RemoteProtocolError`."""
    if version == "1.0" or "\\" not in text:
        return text
    # Splitting on escaped backslashes first leaves every other backslash alone in its
    # part, so plain replacements decode the rest left to right like a scanner would.
    parts = text.split("\\\\")
    for i, part in enumerate(parts):
        if "\\" in part:
            if version == "1.2":
                part = part.replace("\\r", "\r")
            part = part.replace("\\n", "\n").replace("\\c", ":")
            if "\\" in part:
                _raise_bad_escape(text, version)
            parts[i] = part
    return "\\".join(parts)


def _raise_bad_escape(text: str, version: str) -> NoReturn:
    table = _UNESCAPE_12 if version == "1.2" else _UNESCAPE_11
    for match in _ESCAPE_RE.finditer(text):
        char = match.group(1)
        if char in table and char:
            continue
        if not char:
            raise RemoteProtocolError(
                f"header {text!r} ends with a lone backslash (STOMP {version} escape is incomplete)"
            )
        valid = ", ".join("\\" + k for k in table)
        raise RemoteProtocolError(
            f"undefined escape sequence '\\{char}' in header {text!r} "
            f"(STOMP {version} defines only {valid})"
        )
    raise RemoteProtocolError(f"bad escape sequence in header {text!r}")  # pragma: no cover
