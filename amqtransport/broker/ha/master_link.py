"""The master's end of one replication link (:class:`MasterLink`).

It takes over the socket a slave opened, sends the full sync (the snapshot's messages
read back from the journal, one bounded step per loop turn while the socket takes it),
then the records appended since, then every record as it is appended, and hands the
slave's ``ACK`` s to its :class:`~.replication.ReplicationMaster`, whose receipt gate they
open. The protocol and the gate are described in :mod:`.replication`; the frames in
:mod:`.wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Protocol

from ..store import RECEIPT_PATH, JournalError, MessageStore, RecordError
from ..store.sync import SnapshotReader, TailReader
from .wire import (
    ACK,
    BYE,
    KINDS,
    MAX_SLAVE_FRAME,
    PING,
    RECORDS,
    SNAP,
    SYNC_END,
    ReplicationError,
    WireDecoder,
    pack,
    pack_seq,
    record_frames,
    unpack_seq,
)

__all__ = ["LinkOwner", "MasterLink", "SYNC_STEP_BYTES"]

log = logging.getLogger(__name__)

#: bytes of records one step of a full sync reads back and sends (the loop serves between steps)
SYNC_STEP_BYTES = 1 << 20
SNAPSHOT, CATCHUP, LIVE = "snapshot", "catch-up", "live"


class LinkOwner(Protocol):
    """What a link needs of its :class:`~.replication.ReplicationMaster`: the seam between
    the two (the link reports acks and its loss; it reads the store and the sequence)."""

    loop: asyncio.AbstractEventLoop
    store: MessageStore
    link_timeout: float
    seq: int

    def _on_ack(self, link: MasterLink, seq: int) -> None: ...

    def _link_lost(self, link: MasterLink, reason: str) -> None: ...


class MasterLink(asyncio.Protocol):
    """The master's end of one slave connection (takes over the accepted socket)."""

    def __init__(self, master: LinkOwner, transport: asyncio.Transport, slave: str, base: int) -> None:
        self.master = master
        self.loop = master.loop
        self.transport = transport
        self.slave = slave
        self.base = base
        self.acked = 0
        self.synced = False
        self.synced_at = 0.0
        self.synced_loop_time = 0.0
        self.bye = False
        self.closed = False
        self.info: dict[str, str] = {}
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._decoder = WireDecoder(MAX_SLAVE_FRAME)
        self._pending: list[bytes] = []
        self._first = 0
        self._flush_scheduled = False
        self._pushed_at = 0.0  # perf_counter() of the first record waiting in _pending (live)
        self._sent: deque[tuple[int, float]] = deque()  # (last seq, perf_counter()) per live RECORDS write
        self._last_read = self.loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._phase = SNAPSHOT
        self._snapshot: SnapshotReader | None = None
        self._tail: TailReader | None = None
        self._next_seq = base + 1  # the next record the tail reader sends
        self._buffer_from: int | None = None  # live pushes kept from this seq on, while syncing
        self._writing_paused = False
        self._pump_scheduled = False

    @property
    def sync_ended(self) -> bool:
        """``SYNC_END`` has been written: from then on the slave may count its copy complete
        (it marks itself synced, and may take over, once ``SYNC_END`` is durable on its disk,
        before its ack of it can reach us), so losing this link is losing a synced slave."""
        return self._phase != SNAPSHOT

    def start(self, answer: bytes, snapshot: SnapshotReader) -> None:
        """Answer the slave, then stream the full sync (see :meth:`_pump`)."""
        self._snapshot = snapshot
        self._tail = TailReader(self.master.store, snapshot.position)
        self._next_seq = self.base + 1
        self.transport.set_protocol(self)
        self.transport.resume_reading()
        self.transport.write(answer)
        self._schedule_pump()
        self._timer = self.loop.call_later(self.master.link_timeout / 4, self._tick)

    # the full sync: SNAP frames, SYNC_END, the journal's records since, then live records
    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._schedule_pump()

    def _schedule_pump(self, delay: float = 0.0) -> None:
        if not self._pump_scheduled and not self.closed and self._phase != LIVE:
            self._pump_scheduled = True
            if delay:
                self.loop.call_later(delay, self._pump)
            else:
                self.loop.call_soon(self._pump)

    def _pump(self) -> None:
        """One step of the full sync, at most one frame (the loop serves clients between
        steps; the transport's buffer bounds what waits for the slave): a batch of the
        snapshot read back from the journal (:class:`SnapshotReader`); then SYNC_END; then
        the records appended since the snapshot, read back from the journal
        (:class:`TailReader`) until the reader has caught up with what live pushes hold
        from ``_buffer_from`` on; then live streaming (:meth:`push`)."""
        self._pump_scheduled = False
        if self.closed or self._writing_paused:
            return
        assert self._snapshot is not None and self._tail is not None, "the sync has started"
        try:
            if self._phase == SNAPSHOT:
                payloads = self._snapshot.next(SYNC_STEP_BYTES)
                if payloads:
                    for frame in record_frames(SNAP, 0, payloads):
                        self.transport.write(frame)
                    self._schedule_pump()
                    return
                self._snapshot.close()
                self.transport.write(pack(SYNC_END, pack_seq(self.base)))
                self._phase = CATCHUP
            if self._buffer_from is not None and self._next_seq >= self._buffer_from:
                self._go_live()
                return
            payloads = self._tail.next(SYNC_STEP_BYTES)
            if self._buffer_from is not None and len(payloads) > self._buffer_from - self._next_seq:
                # the reader went past where live pushes start (the writer wrote on since it
                # caught up): those records wait in _pending already; sending them here too
                # made the slave apply them twice (an Enq twice, one ACK: the message came
                # back after a takeover)
                payloads = payloads[: self._buffer_from - self._next_seq]
            if payloads:
                for frame in record_frames(RECORDS, self._next_seq, payloads):
                    self.transport.write(frame)
                self._next_seq += len(payloads)
            if self._tail.caught_up and self._buffer_from is None:
                # everything numbered up to now will be written soon; keep what comes next
                self._buffer_from = self.master.seq + 1
                self._first = self._buffer_from
            if self._buffer_from is not None and self._next_seq >= self._buffer_from:
                self._go_live()
            else:
                self._schedule_pump(0.0 if payloads else 0.002)
        except (JournalError, RecordError, OSError) as exc:
            self.abort(f"full sync failed reading the journal: {exc}")
        except Exception as exc:  # a bug: this is a loop callback, nobody else would see it
            log.exception("replication: slave %s: full sync step failed", self.slave)
            self.abort(f"full sync failed: {exc!r}")  # the slave reconnects: a new sync

    def _go_live(self) -> None:
        assert self._snapshot is not None and self._tail is not None, "the sync has started"
        self._phase = LIVE
        self._tail.close()
        log.info("replication: slave %s: full sync sent (%d messages), streaming from seq %d",
                 self.slave, self._snapshot.messages, self._next_seq)
        self._flush()

    def push(self, seq: int, payload: bytes) -> None:
        if self.closed:
            return
        if self._phase != LIVE:
            if self._buffer_from is None or seq < self._buffer_from:
                return  # the tail reader will read it from the journal
        elif not self._pending:
            if not self._flush_scheduled:
                # the first record since the last write goes at once (the slave's fsync
                # then overlaps ours); what follows in this loop turn is coalesced into
                # one write at its end
                for frame in record_frames(RECORDS, seq, (payload,)):
                    self.transport.write(frame)
                RECEIPT_PATH.replication_send.observe(0.0)
                self._sent.append((seq, time.perf_counter()))
                self._flush_scheduled = True
                self.loop.call_soon(self._flush)
                return
            self._first = seq
            self._pushed_at = time.perf_counter()
        self._pending.append(payload)
        if self._phase == LIVE and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or not self._pending or self._phase != LIVE:
            return
        pending, self._pending = self._pending, []
        for frame in record_frames(RECORDS, self._first, pending):
            self.transport.write(frame)
        now = time.perf_counter()
        if self._pushed_at:  # (not the records buffered during the full sync)
            RECEIPT_PATH.replication_send.observe(now - self._pushed_at)
            self._sent.append((self._first + len(pending) - 1, now))
        self._pushed_at = 0.0

    def _release_readers(self) -> None:
        if self._snapshot is not None:
            self._snapshot.close()
        if self._tail is not None:
            self._tail.close()

    def _tick(self) -> None:
        self._timer = None
        if self.closed:
            return
        if self.loop.time() - self._last_read > self.master.link_timeout:
            self.abort(f"slave silent for more than {self.master.link_timeout} s")
            return
        self.transport.write(pack(PING))
        self._timer = self.loop.call_later(self.master.link_timeout / 4, self._tick)

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        try:
            frames = self._decoder.feed(data)
            for kind, payload in frames:
                if kind == ACK:
                    seq = unpack_seq(payload)
                    sent = self._sent
                    if sent and sent[0][0] <= seq:
                        now = time.perf_counter()
                        while sent and sent[0][0] <= seq:
                            RECEIPT_PATH.slave_ack.observe(now - sent.popleft()[1])
                    self.master._on_ack(self, seq)  # noqa: SLF001
                elif kind == BYE:
                    self.bye = True
                elif kind != PING:
                    raise ReplicationError(f"unexpected {KINDS[kind]} from the slave")
        except ReplicationError as exc:
            self.abort(f"protocol error: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._release_readers()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        reason = "slave said goodbye" if self.bye else (str(exc) if exc else "connection closed")
        self.master._link_lost(self, reason)  # noqa: SLF001

    def hand_over(self, frame: bytes) -> None:
        """End a live link with the master's ``HANDOVER`` ``frame``: the records not yet
        written go first, then the frame, then the connection is closed (not aborted: what
        is buffered is sent). The owner has stopped receipting and detached us."""
        if self.closed:
            return
        if self._phase == LIVE:
            self._flush()
            self.transport.write(frame)
            log.warning("replication: handing over to slave %s (every record up to seq %d streamed)", self.slave,
                        self.master.seq)
        self.closed = True
        self._release_readers()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(Exception):
            self.transport.close()

    def abort(self, reason: str) -> None:
        if self.closed:
            return
        log.warning("replication: dropping slave %s: %s", self.slave, reason)
        self.closed = True
        self._release_readers()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.master._link_lost(self, reason)  # noqa: SLF001
        with contextlib.suppress(Exception):
            self.transport.abort()
