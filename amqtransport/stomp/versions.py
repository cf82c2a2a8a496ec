"""STOMP protocol versions and the command sets whose headers are never escaped."""

from __future__ import annotations

from typing import Final

__all__ = ["SUPPORTED_VERSIONS", "UNESCAPED_COMMANDS", "check_version"]

#: Versions this codec speaks, oldest first.
SUPPORTED_VERSIONS: Final = ("1.0", "1.1", "1.2")

#: STOMP 1.1/1.2: "CONNECT and CONNECTED frames do not escape" (STOMP is CONNECT's alias).
UNESCAPED_COMMANDS: Final = frozenset({"CONNECT", "STOMP", "CONNECTED"})


def check_version(version: str) -> str:
    """Return ``version`` if the codec supports it, else raise ``ValueError`` (a caller bug)."""
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(
            f"unsupported STOMP version {version!r}; expected one of {', '.join(SUPPORTED_VERSIONS)}"
        )
    return version
