"""Producer flow control on a client connection: SENDs parked while memory is short.

Theory of operation
-------------------
Producer flow control. Before a SEND (or a COMMIT with sends) is processed the
core's :class:`~.memory.MemoryGauge` is asked whether memory is over its limit (for
all destinations, or for this one). If it is, the frame is *parked* in this
connection's :class:`FlowGate` (``held``) -- no receipt, nothing enqueued -- and every later frame
joins it, in order, except ACK and NACK, which are processed at once: they only free
memory, and a connection that both produces and consumes would otherwise deadlock
with its own acks stuck behind its parked SENDs. We keep reading (so those acks and
heart-beats get through) until the parked frames pass ``write_buffer_high`` bytes or
``max_pending_frames`` frames; then the socket is paused and TCP back-pressure blocks
the producer. (We chose "keep reading, park SENDs" over "pause connections whose last
frame was a SEND" because the latter cannot see an ack queued behind a send.) When
the gauge releases (usage down to the low-water mark) the connection is woken via
``call_soon`` and replays its parked frames until one must wait again. The limit on
what a parked connection may buffer means a client that writes more than that many
SENDs ahead of its own acks can still stall itself -- ActiveMQ has the same caveat
and the same advice: produce and consume on separate connections. With
``send_fail_if_no_space`` a SEND that would wait gets an ERROR naming the limit
instead (and, as after every ERROR, the connection is closed).

Composition, not inheritance: a :class:`FlowGate` is a part of its connection
(``BrokerConnection.flow``), which hands it every frame (:meth:`FlowGate.admit`) and
asks it whether reading must stay paused (:meth:`FlowGate.full`); the gate sees the
connection only as a :class:`FlowHost` (frames go ahead through ``handle``) and its
socket as a :class:`FlowStream` (ERRORs, pausing and resuming reading).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol

from amqtransport.stomp import Frame as StompFrame

from ..config import BrokerConfig
from ..dispatch.core import BrokerCore
from .stream import ErrorSent

__all__ = ["FlowGate", "FlowHost", "FlowStream"]

log = logging.getLogger(__name__)


class FlowStream(Protocol):
    """What the gate needs of its connection's socket (:class:`~.stream.StompStream`)."""

    peer: str
    closing: bool

    @property
    def write_paused(self) -> bool: ...

    def error(self, message: str, *, receipt: str | None = None, detail: str = "", close: bool = True,
              in_doubt: bool = False) -> None: ...

    def error_no_raise(self, message: str, receipt: str | None = None) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class FlowHost(Protocol):
    """What the gate needs of its connection."""

    config: BrokerConfig
    loop: asyncio.AbstractEventLoop

    @property
    def stream(self) -> FlowStream: ...

    @property
    def connected(self) -> bool: ...

    def handle(self, frame: StompFrame) -> None:
        """Process a frame (it may go ahead)."""

    def held_by_transactions(self) -> int:
        """Bytes this connection's open transactions hold in the memory gauge."""


class FlowGate:
    """Producer flow control of one connection: SENDs parked while memory (or the store)
    is over its limit."""

    def __init__(self, conn: FlowHost, core: BrokerCore) -> None:
        self.conn = conn
        self.core = core
        self.held: deque[tuple[StompFrame, int]] = deque()  # frames parked by flow control
        self.held_bytes = 0
        self._wake_scheduled = False

    def release(self) -> None:
        """The connection is gone: drop what is parked, stop waiting for memory."""
        self.held.clear()
        self.held_bytes = 0
        self.core.memory.remove_waiter(id(self))

    def admit(self, frame: StompFrame) -> None:
        """Process a frame now, or park it while producer flow control holds this connection."""
        conn = self.conn
        if self.held:
            if frame.command in ("ACK", "NACK"):
                conn.handle(frame)  # acks free memory: never behind a parked SEND
            else:
                self._hold(frame)
            return
        if conn.connected and self.must_wait(frame):
            if conn.config.send_fail_if_no_space:
                conn.stream.error(self._no_space_message(frame), receipt=frame.get("receipt"))
            held = conn.held_by_transactions()
            if held:
                # it would wait for memory its own open transaction may be holding
                conn.stream.error(
                    f"{self._no_space_message(frame, refused=False)}; this connection's open transactions "
                    f"hold {held} bytes, so it cannot wait: send refused, transactions rolled back",
                    receipt=frame.get("receipt"),
                )
            self._hold(frame)
            return
        conn.handle(frame)

    def must_wait(self, frame: StompFrame) -> bool:
        """A SEND waits while memory is over its limit -- except a persistent one outside a
        transaction, which can wait paged on disk instead (queues.py) -- and a persistent
        one while the store is over its limit (a COMMIT never does: its bytes are counted
        already, from the moment each of its SENDs arrived)."""
        if frame.command != "SEND":
            return False
        store = self.core.store
        persistent = store is not None and (frame.get("persistent") or "").lower() == "true"
        if persistent and store is not None and store.full:
            return True
        if persistent and frame.get("transaction") is None:
            return False
        return self.core.memory.blocked(frame.get("destination"))

    def _no_space_message(self, frame: StompFrame, *, refused: bool = True) -> str:
        memory = self.core.memory
        tail = "; send refused (send_fail_if_no_space)" if refused else ""
        store = self.core.store
        dest = frame.get("destination") or "(transaction)"
        if not memory.blocked(dest) and store is not None and store.full:
            return (
                f"producer flow control: broker store limit reached ({store.journal.size} bytes of "
                f"journal, store_limit={store.limit}){tail}"
            )
        if memory.full:
            return (
                f"producer flow control: broker memory limit reached "
                f"({memory.usage} bytes in use, memory_limit={memory.limit}){tail}"
            )
        return (
            f"producer flow control: destination {dest} is over its memory limit "
            f"(destination_memory_limit={memory.destination_limit}){tail}"
        )

    def _hold(self, frame: StompFrame) -> None:
        size = len(frame.body) + 64
        for k, v in frame.headers:
            size += len(k) + len(v)
        self.held.append((frame, size))
        self.held_bytes += size
        memory = self.core.memory
        memory.add_waiter(id(self), self._wake)
        self.core.start_expiry_sweep(self.conn.loop.call_later)
        if self.full():
            self.conn.stream.pause_reading()

    def full(self) -> bool:
        """Parked frames over their bound: reading stays paused (TCP back-pressure)."""
        config = self.conn.config
        return self.held_bytes > config.write_buffer_high or len(self.held) > config.max_pending_frames

    def _wake(self) -> None:
        """Called by the gauge when memory was released (inside dispatch: defer)."""
        if not self._wake_scheduled and not self.conn.stream.closing:
            self._wake_scheduled = True
            self.conn.loop.call_soon(self._replay_held)

    def _replay_held(self) -> None:
        self._wake_scheduled = False
        conn = self.conn
        held = self.held
        try:
            while held and not conn.stream.closing:
                frame, size = held[0]
                if frame.command not in ("ACK", "NACK") and self.must_wait(frame):
                    return  # still full: stay registered, wait for the next release
                held.popleft()
                self.held_bytes -= size
                conn.handle(frame)
        except ErrorSent:
            return
        except Exception as exc:  # noqa: BLE001 - as in data_received
            log.exception("internal error handling a parked frame from %s", conn.stream.peer)
            conn.stream.error_no_raise(f"internal broker error: {exc.__class__.__name__}: {exc}")
            return
        finally:
            if not held:
                self.held_bytes = 0
                self.core.memory.remove_waiter(id(self))
            if not conn.stream.write_paused and not conn.stream.closing:
                conn.stream.resume_reading()  # no-op while the parked frames are still over their bound
