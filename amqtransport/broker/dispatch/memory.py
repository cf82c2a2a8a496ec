"""Memory accounting of live queue messages, with the high/low water marks of flow control.

Theory of operation
-------------------
Every message that enters a queue (``/queue/X``, a durable-subscription queue, a DLQ)
is *charged* its size -- body + header names and values + :data:`MESSAGE_OVERHEAD`
for the Python objects -- when it is enqueued, and *released* when it leaves the
broker's memory for good: acked (or handed to an auto-ack consumer), expired,
discarded, or dropped with its durable subscription. The charge is remembered on the
message (``Message.mem``), so releasing twice, or releasing a message that was never
charged (a non-durable topic message), is a no-op, and the per-destination figure
stays right when a message moves to a DLQ (release from the old, charge the new).
A message waiting for an ack is still charged: it is still held in memory and comes
back to the queue if its consumer goes away.

A *paged* message (queues.py: a persistent message waiting on disk, only its journal
position in memory) is not charged; it is charged when it is paged back in. Past
``memory_low_water`` x the limit, new persistent messages are paged
(:meth:`MemoryGauge.paging`), so persistent producers need not wait for memory.

Non-durable topic messages are not charged: they are handed out at once, and what a
slow topic subscriber falls behind by is bounded by ``topic_backlog_limit`` and
``topic_backlog_bytes`` instead (see :mod:`.backlog`).

Open transactions. The SENDs of a transaction wait in the broker until COMMIT; their
bytes are *reserved* (:meth:`MemoryGauge.reserve`, per destination) as they arrive and
unreserved at COMMIT (when the messages are charged as they are enqueued) or ABORT, so
they count against both limits like queued messages.

Connections not logged in. The bytes of a partial frame buffered for a connection that
has not logged in yet are counted too (:meth:`MemoryGauge.hold_preauth`, in ``usage``:
they are part of ``memory_limit``; ``preauth`` says how many), and their total is also
bounded on its own by ``max_unauthenticated_bytes`` (the connection whose bytes would
pass it is refused: connection/protocol.py).

Flow control is a flag with hysteresis, kept globally (``memory_limit``) and per
destination (``destination_memory_limit``): it *engages* when usage reaches the
limit and *releases* when usage falls to ``memory_low_water`` x limit, each logged
once. The gauge does not refuse anything itself; the connection handler asks
:meth:`MemoryGauge.blocked` before it processes a SEND and parks the frame while it
is true. Parked connections register a waiter; when a flag releases, the waiters are
called (they reschedule themselves on the loop -- the release happens inside
dispatch, where re-entering the core would be unsafe). While producers are parked, the
core also runs an expiry sweep once a second
(:meth:`~.registry.Registry.start_expiry_sweep`), so expired messages in a queue that
nobody consumes do not hold the memory -- and the producers -- forever.
Because a SEND is accepted
whenever the flag is clear, usage can overshoot the limit by the SENDs processed
before the flag engaged: at most one frame per connection, so usage stays below
``limit + connections x max_frame_size``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from .message import Message

__all__ = ["MemoryGauge", "MESSAGE_OVERHEAD", "message_size", "send_size"]

log = logging.getLogger(__name__)

#: bytes charged per message on top of body and headers (the Python objects holding it)
MESSAGE_OVERHEAD = 256


def message_size(msg: Message) -> int:
    """The bytes a message is charged: body + headers + :data:`MESSAGE_OVERHEAD`."""
    return send_size(msg.headers, msg.body)


def send_size(headers: tuple[tuple[str, str], ...], body: bytes) -> int:
    """:func:`message_size` of the message a SEND with these headers and body makes."""
    n = len(body) + MESSAGE_OVERHEAD
    for k, v in headers:
        n += len(k) + len(v)
    return n


class MemoryGauge:
    """Bytes of live queue messages, globally and per destination, plus the flow-control flags."""

    def __init__(
        self,
        limit: int,
        destination_limit: int = 0,
        low_water: float = 0.7,
        *,
        clock: Callable[[], float],
    ) -> None:
        self.limit = limit
        self.destination_limit = destination_limit  # 0: no per-destination limit
        self.low_water = low_water
        self.usage = 0
        self.reserved = 0  # of usage: bytes held by open transactions
        self.preauth = 0  # of usage: bytes buffered by connections not logged in yet (hold_preauth)
        self.peak = 0
        self.by_destination: dict[str, int] = {}
        self.full = False  # global flag
        self.full_since: float | None = None  # clock() when the global flag engaged (readiness)
        self._clock = clock
        self.full_destinations: set[str] = set()
        self.engaged = 0  # times flow control engaged (global or per destination)
        self._waiters: dict[int, Callable[[], None]] = {}

    # ------------------------------------------------------------------ accounting
    def charge(self, msg: Message) -> None:
        if msg.mem:
            return
        size = message_size(msg)
        msg.mem = size
        self._add(msg.destination, size)

    def release(self, msg: Message) -> None:
        size = msg.mem
        if not size:
            return
        msg.mem = 0
        self._sub(msg.destination, size)

    def reserve(self, destination: str, size: int) -> None:
        """Count ``size`` bytes held by an open transaction for ``destination``."""
        self.reserved += size
        self._add(destination, size)

    def unreserve(self, destination: str, size: int, *, settle: bool = True) -> None:
        """The transaction was aborted, or committed: then its messages are charged as they
        are enqueued, so the caller passes ``settle=False`` and calls :meth:`settle` after
        them (flow control is not released and engaged again in between)."""
        self.reserved -= size
        self._sub(destination, size, settle=settle)

    def settle(self, destinations: Iterable[str]) -> None:
        """Release flow control where usage is now low enough (after ``settle=False``)."""
        released = self._release_global()
        for dest in destinations:
            released = self._release_destination(dest) or released
        if released:
            self.wake_waiters()

    def hold_preauth(self, delta: int) -> None:
        """``delta`` more (or, negative, fewer) bytes buffered by connections that have not
        logged in (a partial frame: connection/stream.py). They count in ``usage``, so in
        ``memory_limit``, but belong to no destination."""
        self.preauth += delta
        if delta >= 0:
            self._add_global(delta)
            return
        self.usage += delta
        if self.full and self._release_global():
            self.wake_waiters()

    def _add_global(self, size: int) -> None:
        self.usage += size
        if self.usage > self.peak:
            self.peak = self.usage
        if not self.full and self.usage >= self.limit:
            self.full = True
            self.full_since = self._clock()
            self.engaged += 1
            log.warning(
                "memory limit reached (%d bytes in use, memory_limit=%d): producer flow control engaged",
                self.usage,
                self.limit,
            )

    def _add(self, dest: str, size: int) -> None:
        self._add_global(size)
        d = self.by_destination.get(dest, 0) + size
        self.by_destination[dest] = d
        dl = self.destination_limit
        if dl and d >= dl and dest not in self.full_destinations:
            self.full_destinations.add(dest)
            self.engaged += 1
            log.warning(
                "destination %s reached its memory limit (%d bytes, destination_memory_limit=%d): "
                "producer flow control engaged for it",
                dest,
                d,
                dl,
            )

    def _sub(self, dest: str, size: int, *, settle: bool = True) -> None:
        self.usage -= size
        d = self.by_destination.get(dest, 0) - size
        if d > 0:
            self.by_destination[dest] = d
        else:
            self.by_destination.pop(dest, None)
        if settle and (self.full or self.full_destinations):
            released = self._release_global()
            released = self._release_destination(dest) or released
            if released:
                self.wake_waiters()

    def _release_global(self) -> bool:
        if self.full and self.usage <= self.limit * self.low_water:
            self.full = False
            self.full_since = None
            log.warning("memory usage down to %d bytes: producer flow control released", self.usage)
            return True
        return False

    def _release_destination(self, dest: str) -> bool:
        if dest not in self.full_destinations:
            return False
        d = self.by_destination.get(dest, 0)
        if d > self.destination_limit * self.low_water:
            return False
        self.full_destinations.discard(dest)
        log.warning("destination %s down to %d bytes: producer flow control released for it", dest, d)
        return True

    def wake_waiters(self) -> None:
        """Tell every parked connection to try again (here: memory released; also called
        when the store's flow control releases)."""
        for wake in list(self._waiters.values()):
            try:
                wake()
            except Exception:  # noqa: BLE001 - one waiter's bug must not stop the others
                log.exception("flow-control waiter failed")

    def release_all(self, msgs: list[Message]) -> None:
        for m in msgs:
            self.release(m)

    # ------------------------------------------------------------------ flow control
    def blocked(self, destination: str | None = None) -> bool:
        """True while a SEND (to ``destination``) must wait."""
        if self.full:
            return True
        return destination is not None and destination in self.full_destinations

    def paging(self, destination: str) -> bool:
        """Past the low-water mark (globally, or for ``destination``): new persistent
        messages should wait paged rather than in memory (see queues.py)."""
        if self.usage >= self.limit * self.low_water:
            return True
        dl = self.destination_limit
        return bool(dl) and self.by_destination.get(destination, 0) >= dl * self.low_water

    def add_waiter(self, key: int, wake: Callable[[], None]) -> None:
        self._waiters[key] = wake

    def remove_waiter(self, key: int) -> None:
        self._waiters.pop(key, None)

    def blocked_count(self) -> int:
        """Connections with frames parked by flow control."""
        return len(self._waiters)

    def stats(self) -> dict[str, object]:
        return {
            "usage": self.usage,
            "transactions": self.reserved,
            "preauth": self.preauth,
            "limit": self.limit,
            "peak": self.peak,
            "percent": round(100.0 * self.usage / self.limit, 1) if self.limit else 0.0,
            "flow_control": self.full,
            "blocked_destinations": sorted(self.full_destinations),
            "engaged": self.engaged,
            "blocked_producers": len(self._waiters),
        }
