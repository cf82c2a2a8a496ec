"""STOMP header escaping.

STOMP 1.0 has no escaping. STOMP 1.1 escapes ``\\n`` (LF), ``\\c`` (``:``) and ``\\\\``
(backslash). STOMP 1.2 adds ``\\r`` (CR). Any other backslash sequence is a fatal
protocol error ("undefined escape"). Headers of CONNECT, STOMP and CONNECTED frames
are never escaped in any version, so that a 1.0-only peer can read the handshake.
"""

from __future__ import annotations

import re
from typing import Final

from amqtransport.errors import RemoteProtocolError

__all__ = ["escape_header", "unescape_header", "needs_escaping"]

_ESCAPE_12: Final = str.maketrans({"\\": "\\\\", "\r": "\\r", "\n": "\\n", ":": "\\c"})
_ESCAPE_11: Final = str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c"})

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
        return text.translate(_ESCAPE_12)
    if version == "1.1":
        return text.translate(_ESCAPE_11)
    return text


def unescape_header(text: str, version: str = "1.2") -> str:
    """Undo :func:`escape_header`; an undefined escape raises :class:`RemoteProtocolError`."""
    if version == "1.0" or "\\" not in text:
        return text
    table = _UNESCAPE_12 if version == "1.2" else _UNESCAPE_11

    def replace(match: re.Match[str]) -> str:
        char = match.group(1)
        try:
            return table[char]
        except KeyError:
            if not char:
                raise RemoteProtocolError(
                    f"header {text!r} ends with a lone backslash (STOMP {version} escape is incomplete)"
                ) from None
            valid = ", ".join("\\" + k for k in table)
            raise RemoteProtocolError(
                f"undefined escape sequence '\\{char}' in header {text!r} "
                f"(STOMP {version} defines only {valid})"
            ) from None

    return _ESCAPE_RE.sub(replace, text)
