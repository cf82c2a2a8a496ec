"""``host:port`` strings as Toxiproxy's ``listen`` and ``upstream`` fields spell them."""

from __future__ import annotations

from chaos.proxy.errors import BadRequest

__all__ = ["parse_hostport", "format_hostport"]


def parse_hostport(text: str, field: str = "address") -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` for IPv6; an empty host means any address).

    Raises :class:`~chaos.proxy.errors.BadRequest` naming ``field`` when the text is not an
    address with a port between 0 and 65535.
    """
    if not isinstance(text, str) or not text:
        raise BadRequest(f"{field} must be a non-empty 'host:port' string, got {text!r}")
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise BadRequest(f"{field} {text!r}: expected '[ipv6]:port'")
        host, port_text = text[1:close], text[close + 2 :]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise BadRequest(f"{field} {text!r}: missing ':port'")
        if ":" in host:
            raise BadRequest(f"{field} {text!r}: an IPv6 host must be written '[host]:port'")
    if any(c.isspace() for c in host) or "/" in host:
        raise BadRequest(f"{field} {text!r}: invalid host {host!r}")
    if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5:
        raise BadRequest(f"{field} {text!r}: port must be a number 0-65535")
    port = int(port_text)
    if port > 65535:
        raise BadRequest(f"{field} {text!r}: port must be a number 0-65535")
    return host, port


def format_hostport(host: str, port: int) -> str:
    """The inverse of :func:`parse_hostport` (IPv6 hosts get brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
