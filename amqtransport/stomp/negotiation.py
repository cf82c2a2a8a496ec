"""STOMP version negotiation (the ``accept-version`` header of CONNECT/STOMP)."""

from __future__ import annotations

from collections.abc import Sequence

from amqtransport.errors import RemoteProtocolError

from .versions import SUPPORTED_VERSIONS

__all__ = ["negotiate_version"]


def _key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        return (-1,)


def negotiate_version(
    accept_version: str | None, supported: Sequence[str] = SUPPORTED_VERSIONS
) -> str:
    """The highest version in both ``accept_version`` (comma-separated) and ``supported``.

    A missing (or blank) header means the client speaks STOMP 1.0 only. No common
    version raises :class:`RemoteProtocolError` listing the supported ones (a broker
    sends that text in its ERROR frame).
    """
    if accept_version is None or not accept_version.strip():
        offered = ["1.0"]
    else:
        offered = [v.strip() for v in accept_version.split(",") if v.strip()]
    common = [v for v in offered if v in supported]
    if not common:
        raise RemoteProtocolError(
            f"no common STOMP version: client accepts {accept_version or '1.0'!r}, "
            f"supported versions are {','.join(supported)}"
        )
    return max(common, key=_key)
