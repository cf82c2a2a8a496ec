"""A wire tap on a connection: every MESSAGE frame as it arrives, before the client
looks at it. The same for the sync client (``client.Connection``) and the asyncio
client (``aio.AsyncConnection``).

For harnesses that judge what the broker delivered rather than what the application
got (``amq chaos``'s workloads record each link's deliveries, the copies the
duplicate filter drops included). ``conn.add_wire_tap(tap)`` calls
``tap(frame, generation)`` for every MESSAGE, with the generation of the link it came
on, where the frame arrives (the link's reader thread in the sync client, the event
loop in the asyncio client), before the subscription is looked up and before the
duplicate filter. A tap must only read and must be quick: the frame is the one the
client delivers next, and the reader waits for it. A tap that raises is logged and
skipped; the frame is delivered as if it were not there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from amqtransport.stomp import Frame

__all__ = ["WireTap", "WireTapped"]

log = logging.getLogger(__name__)

#: ``tap(frame, generation)``
WireTap = Callable[[Frame, int], None]


class WireTapped:
    """Mixed into both connections, which call :meth:`_tap_wire` first thing for each
    MESSAGE. The taps are a tuple replaced on change, so the reader never locks."""

    _wire_taps: tuple[WireTap, ...] = ()

    def add_wire_tap(self, tap: WireTap) -> None:
        """Call ``tap(frame, generation)`` for every MESSAGE from now on (see the module)."""
        self._wire_taps = (*self._wire_taps, tap)

    def remove_wire_tap(self, tap: WireTap) -> None:
        """Stop calling ``tap``; a tap that was not added is ignored."""
        self._wire_taps = tuple(t for t in self._wire_taps if t is not tap)

    def _tap_wire(self, frame: Frame, generation: int) -> None:
        for tap in self._wire_taps:
            try:
                tap(frame, generation)
            except Exception:
                log.exception("wire tap %r raised; ignored", tap)
