"""STOMP header escaping, and the one policy for headers a version cannot express.

STOMP 1.0 has no escaping. STOMP 1.1 escapes ``\\n`` (LF), ``\\c`` (``:``) and ``\\\\``
(backslash). STOMP 1.2 adds ``\\r`` (CR). Any other backslash sequence is a fatal
protocol error ("undefined escape"). Headers of CONNECT, STOMP and CONNECTED frames
are never escaped in any version, so that a 1.0-only peer can read the handshake.

What cannot be expressed. Without escaping (1.0, and the handshake frames) a header
cannot hold a line feed, a name cannot hold ``:``, and a value cannot end with a
carriage return (the parser takes it for the end of the line); 1.1 escapes all of
that but a trailing carriage return. :func:`unexpressible` is the one definition of
those cases, and there are two ways to meet one:

- a peer writing its *own* frame is refused: :func:`~.serializer.serialize` raises
  :class:`~amqtransport.errors.LocalProtocolError` naming the header (the caller asked
  for something the version cannot carry);
- a peer *relaying* a header someone else wrote (a broker delivering a 1.2 producer's
  header to a 1.0 consumer, a login echoed in CONNECTED) cannot refuse the message, so
  :func:`expressible` writes it with each offending character -- a line feed, a
  ``:`` in an unescaped name, the carriage return that would end the line -- replaced
  by a space. The frame stays readable and every other header intact; a header that
  can be expressed is never changed. The fast encoders (:mod:`.encoders`) do this.
"""

from __future__ import annotations

import re
from typing import Final, NoReturn

from amqtransport.errors import RemoteProtocolError

from .versions import UNESCAPED_COMMANDS

__all__ = ["escape_header", "unescape_header", "needs_escaping", "unexpressible", "expressible", "header_line"]

# Characters that need escaping; most header values have none, so a C-speed search
# decides whether the (slower) replacements run at all.
_SPECIAL_12: Final = re.compile(r"[\\\r\n:]").search
_SPECIAL_11: Final = re.compile(r"[\\\n:]").search

_UNESCAPE_12: Final = {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}
_UNESCAPE_11: Final = {"n": "\n", "c": ":", "\\": "\\"}

_ESCAPE_RE: Final = re.compile(r"\\(.?)", re.DOTALL)


def needs_escaping(version: str, command: str) -> bool:
    """Whether headers of ``command`` frames are escaped under ``version``."""
    return version != "1.0" and command not in UNESCAPED_COMMANDS


def unexpressible(name: str, value: str, version: str, command: str) -> str | None:
    """Why header ``name:value`` cannot be written faithfully in a ``command`` frame of
    STOMP ``version`` (None: it can). See the module docstring."""
    if needs_escaping(version, command):
        if version == "1.1" and value.endswith("\r"):
            return f"header {name!r} ends with a carriage return, which STOMP 1.1 cannot escape"
        return None
    where = f"STOMP {version} has no header escaping" if version == "1.0" else f"{command} frame headers are never escaped"
    if "\n" in name or "\n" in value:
        return f"header {name!r} contains a line feed, which cannot be sent: {where}"
    if ":" in name:
        return f"header name {name!r} contains ':', which cannot be sent: {where}"
    if value.endswith("\r") or (not value and name.endswith("\r")):
        return f"header {name!r} ends with a carriage return, which cannot be sent: {where}"
    return None


def expressible(name: str, value: str, version: str, command: str) -> tuple[str, str]:
    """``(name, value)`` as a relaying peer writes it: unchanged when
    :func:`unexpressible` finds nothing, else with each offending character replaced by
    a space (see the module docstring)."""
    if unexpressible(name, value, version, command) is None:
        return name, value
    if needs_escaping(version, command):  # 1.1: only a trailing carriage return
        return name, value[:-1] + " "
    name = name.replace("\n", " ").replace(":", " ")
    value = value.replace("\n", " ")
    if value.endswith("\r"):
        value = value[:-1] + " "
    elif not value and name.endswith("\r"):
        name = name[:-1] + " "
    return name, value


# the characters that may make a header unexpressible (a fast first check)
_MAYBE_UNEXPRESSIBLE: Final = re.compile(r"[\r\n:]").search


def header_line(name: str, value: str, version: str, command: str) -> str:
    """The header line ``name:value`` (without its line feed) of a ``command`` frame a
    relaying peer writes: made :func:`expressible`, then escaped as the version and the
    command require."""
    if version == "1.2" and command not in UNESCAPED_COMMANDS:
        return f"{escape_header(name, version)}:{escape_header(value, version)}"  # 1.2 expresses all
    if _MAYBE_UNEXPRESSIBLE(name) is not None or _MAYBE_UNEXPRESSIBLE(value) is not None:
        name, value = expressible(name, value, version, command)
    if needs_escaping(version, command):
        return f"{escape_header(name, version)}:{escape_header(value, version)}"
    return f"{name}:{value}"


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
