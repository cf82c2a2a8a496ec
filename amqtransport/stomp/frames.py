"""STOMP frames and parser events as frozen dataclasses (h11 style).

Headers are kept as an ordered tuple of ``(name, value)`` pairs so that repeated
headers survive a round trip; lookups follow STOMP 1.2's rule that the *first*
occurrence of a repeated header wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "Frame",
    "Heartbeat",
    "NeedData",
    "HEARTBEAT",
    "NEED_DATA",
    "Event",
    "HeaderInput",
    "CLIENT_COMMANDS",
    "SERVER_COMMANDS",
    "IDEMPOTENCY_HEADER",
    "IDEMPOTENCY_HEADER_ALIASES",
    "IN_DOUBT_HEADER",
    "BROKER_STOPPED_HEADER",
    "CONNECTION_ENDED_HEADER",
]

#: Header our client stamps on every SEND and our broker uses for duplicate
#: suppression. Artemis' own duplicate-id header is accepted as an alias.
IDEMPOTENCY_HEADER: Final = "amq-idempotency-key"
IDEMPOTENCY_HEADER_ALIASES: Final = (IDEMPOTENCY_HEADER, "_AMQ_DUPL_ID")
#: On an ERROR of our broker: the request's record was queued when the journal failed,
#: so it may or may not have been kept (resending with the same key is safe).
IN_DOUBT_HEADER: Final = "amq-in-doubt"
#: On an ERROR of our broker: it stopped serving (its journal failed: fenced), which
#: says nothing against the frames the client sent.
BROKER_STOPPED_HEADER: Final = "amq-broker-stopped"
#: On an ERROR of our broker: it ends this connection for a reason of the connection's
#: own (a heart-beat timeout, an operator's close, the client-id taken over), which says
#: nothing against the frames the client sent (a failover must not take it as a refusal).
CONNECTION_ENDED_HEADER: Final = "amq-connection-ended"

CLIENT_COMMANDS: Final = frozenset(
    {
        "CONNECT",
        "STOMP",
        "SEND",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "ACK",
        "NACK",
        "BEGIN",
        "COMMIT",
        "ABORT",
        "DISCONNECT",
    }
)
SERVER_COMMANDS: Final = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})

HeaderInput = Mapping[str, str] | Iterable[tuple[str, str]] | None


def _normalise_headers(headers: HeaderInput) -> tuple[tuple[str, str], ...]:
    if headers is None:
        return ()
    items: Iterable[tuple[str, str]]
    if isinstance(headers, Mapping):
        items = headers.items()
    else:
        items = headers
    return tuple((str(k), str(v)) for k, v in items)


@dataclass(frozen=True)
class Frame:
    """One STOMP frame. ``headers`` is ordered and may repeat names."""

    command: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    @classmethod
    def make(cls, command: str, headers: HeaderInput = None, body: bytes | str = b"") -> Frame:
        """Build a frame from a mapping or pairs; a ``str`` body is UTF-8 encoded."""
        if isinstance(body, str):
            body = body.encode("utf-8")
        return cls(command, _normalise_headers(headers), bytes(body))

    def get(self, name: str, default: str | None = None) -> str | None:
        """The first value of header ``name`` (STOMP 1.2: first occurrence wins)."""
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def get_all(self, name: str) -> list[str]:
        """Every value of header ``name`` in order."""
        return [value for key, value in self.headers if key == name]

    def __contains__(self, name: object) -> bool:
        for key, _ in self.headers:  # a loop, not any(<genexpr>): on every send's path
            if key == name:
                return True
        return False

    @property
    def header_map(self) -> dict[str, str]:
        """Headers as a dict, first occurrence winning."""
        out: dict[str, str] = {}
        for key, value in self.headers:
            out.setdefault(key, value)
        return out

    def with_headers(self, headers: HeaderInput = None, **extra: str) -> Frame:
        """A copy with ``headers``/``extra`` replacing same-named headers (others kept)."""
        updates = dict(_normalise_headers(headers))
        updates.update(extra)
        kept = tuple((k, v) for k, v in self.headers if k not in updates)
        return Frame(self.command, tuple(updates.items()) + kept, self.body)

    def without_headers(self, *names: str) -> Frame:
        drop = set(names)
        return Frame(self.command, tuple((k, v) for k, v in self.headers if k not in drop), self.body)


@dataclass(frozen=True)
class Heartbeat:
    """A bare EOL received between frames (a STOMP heart-beat)."""


@dataclass(frozen=True)
class NeedData:
    """The parser needs more bytes before it can produce another event."""


HEARTBEAT: Final = Heartbeat()
NEED_DATA: Final = NeedData()

Event = Frame | Heartbeat | NeedData
