"""STOMP heart-beat header parsing and negotiation maths (pure; no clock here).

A peer's ``heart-beat: cx,cy`` says "I can send a beat every cx ms" and "I want to
receive a beat every cy ms" (0 = cannot / do not want). For our side with
``ours = (cx, cy)`` and the peer's header ``theirs = (sx, sy)``:

* we send every ``max(cx, sy)`` ms if both are non-zero, else never;
* we expect a beat every ``max(cy, sx)`` ms if both are non-zero, else never.

The computation is symmetric, so the client and the broker call the same function
with the arguments swapped and agree. How much slack to allow before declaring a
peer dead is the transport's business (a common choice is twice the interval).
"""

from __future__ import annotations

from typing import Final

from amqtransport.errors import RemoteProtocolError

__all__ = ["HEARTBEAT_BYTES", "parse_heartbeat_header", "format_heartbeat_header", "negotiate_heartbeat"]

#: What one heart-beat looks like on the wire: a bare EOL between frames.
HEARTBEAT_BYTES: Final = b"\n"


def parse_heartbeat_header(value: str | None) -> tuple[int, int]:
    """Parse a ``heart-beat`` header value ``"cx,cy"`` (milliseconds).

    ``None`` (header absent) means ``(0, 0)``. Anything other than two non-negative
    decimal integers separated by a comma raises :class:`RemoteProtocolError`.
    """
    if value is None:
        return (0, 0)
    parts = value.split(",")
    if len(parts) != 2:
        raise RemoteProtocolError(
            f"heart-beat header must be two comma-separated integers 'cx,cy' in ms, got {value!r}"
        )
    out: list[int] = []
    for part in parts:
        text = part.strip()
        if not text.isascii() or not text.isdigit():
            raise RemoteProtocolError(
                f"heart-beat header must be two non-negative integers 'cx,cy' in ms, got {value!r}"
            )
        out.append(int(text))
    return (out[0], out[1])


def format_heartbeat_header(value: tuple[int, int]) -> str:
    """The header text for ``(cx, cy)``; ``ValueError`` for negative values (a caller bug)."""
    cx, cy = value
    if cx < 0 or cy < 0:
        raise ValueError(f"heart-beat values must be >= 0 ms, got {value!r}")
    return f"{int(cx)},{int(cy)}"


def negotiate_heartbeat(ours: tuple[int, int], theirs: tuple[int, int]) -> tuple[int, int]:
    """Return ``(we_send_every_ms, we_expect_every_ms)``; 0 means none.

    ``ours`` is (we can send every, we want to receive every); ``theirs`` is the
    peer's heart-beat header, parsed.
    """
    can_send, want_receive = ours
    peer_can_send, peer_wants = theirs
    send = max(can_send, peer_wants) if can_send > 0 and peer_wants > 0 else 0
    expect = max(want_receive, peer_can_send) if want_receive > 0 and peer_can_send > 0 else 0
    return (send, expect)
