"""The slave's end of one replication link (:class:`SlaveLink`; the theory of the link is in
:mod:`.replication`, the node's slave side in :mod:`.slave`).

Theory of operation
-------------------
A slave that has joined a master (the handshake: :func:`.slave.serve_slave`) wipes its store (:func:`.slave.fresh_replica_store`: a full sync starts from nothing;
a journal the node found damaged at start is first moved into ``quarantine/``) and runs
one :class:`SlaveLink` until the link ends. The link reads the master's frames with the
sans-IO :class:`~.wire.WireDecoder`:

``SNAP``
    snapshot records, imported into the store (durable with the next fsync);
``SYNC_END``
    the snapshot is complete up to the master's sequence number ``base``: once it is
    durable here the node marks its store a complete copy at the master's epoch
    (``on_synced``), :attr:`SlaveLink.synced` becomes true and ``base`` is acked;
``RECORDS``
    the stream: each batch is appended to the journal and acked once it is fsynced
    (acks are coalesced: one per loop turn, the highest sequence number durable; the
    ack of a lone record is written as soon as its completion has run); a read that brought at most
    :data:`INLINE_COMMIT_RECORDS` records is fsynced on the link's loop itself when the
    journal's writer thread is idle (``Journal.commit_here``: no thread hand-off between
    the read, the fsync and the ack), a bigger one by the writer thread. The batch is
    applied to the store's state (index, queues) *after* that: see "Ack, then apply". Once the
    ``SYNC_END`` is applied and nothing is left buffered, the stream is *live*: the
    socket's protocol (:class:`_LiveProtocol`) hands each read to the link as it arrives,
    so no task is woken for it (the full sync's reads are awaited: their back-pressure
    and the stop are simpler there);
``PING``
    the master is alive;
``HANDOVER``
    the master leaves its role on purpose and hands over: a request signed with the
    cluster secret, at the link's epoch, answering the challenge this slave put in its
    replication ``CONNECT`` (:func:`.slave.handover_refusal`). A verified one ends the link
    (``"handover"``): the node takes over at once (decide.py, "Handovers"); any other is
    a broken link (``"lost"``).

Ack, then apply (issue 27). A read's records are imported in two steps
(:meth:`~..store.MessageStore.append_payloads`, then
:meth:`~..store.MessageStore.apply_appended`; the store's docstring, "Importing"): decoded
and appended, fsynced and acked, and only then folded into the state, at the end of the
same read's handling, so the apply is off the ACK's path (when the writer thread fsyncs
a bigger read, the apply runs while it does). The rules:

* the ACK still means "fsynced on this slave's disk": it is written from the fsync's
  completion, never before;
* a crash after the ACK and before the apply loses nothing: the records are in the
  journal, which recovery replays whatever the state held (no checkpoint is captured
  between the two steps: :meth:`~..store.MessageStore.close` applies first);
* the slave never serves before every appended record is applied: the apply ends each
  read's handling, whatever ends it (an outcome, an error), before anything else runs on
  the loop, the snapshot is applied before the store is marked synced, and the takeover
  path closes the replica's store, which applies what is left before its checkpoint;
* the applies are in the order of the appends (one queue, folded first to last; a
  ``Fan`` or ``Tx`` batch, named from the state, applies what precedes it first);
* an apply failure is fatal to the link, as before: it raises out of :meth:`SlaveLink.run`,
  and the store is marked diverged (it writes no checkpoint from that state).

The slave pings every quarter of ``--link-timeout`` and treats a link silent for
``--link-timeout`` as lost, like a broken or closed one, or a malformed frame. When
the node stops it says goodbye (``BYE``), so the master does not count it as a slave
that may be taking over, and flushes its journal. A journal failure -- a write error, or
a data directory deleted or replaced under it (:mod:`..store.guard`) -- drops the link
(the master then counts this slave as lost) and returns ``"failed"``: the copy is no
longer complete, so the node marks itself not synced (in memory too: the state file may
be gone with the directory), closes the store and, a second later (doubling to 30 s
while it keeps failing), joins the master again with a fresh store (a full sync) -- it
never takes over with it.
:meth:`SlaveLink.run` returns ``"stop"``, ``"lost"``, ``"handover"`` or ``"failed"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import cast

from ..store import RECEIPT_PATH, Callback, MessageStore, after_completions, run_completions
from .wire import (
    ACK,
    BYE,
    HANDOVER,
    HANDOVER_HEADER,
    PING,
    RECORDS,
    SNAP,
    SYNC_END,
    ReplicationError,
    WireDecoder,
    pack,
    pack_seq,
    unpack_handover,
    unpack_records,
    unpack_seq,
)

__all__ = ["INLINE_COMMIT_RECORDS", "JOURNAL_BACKLOG_LIMIT", "READ_BYTES", "SlaveLink"]

log = logging.getLogger("amqtransport.broker.ha.slave")  # the slave's logger, as before the move

#: bytes the slave lets wait for its disk before it reads more of the stream (a full
#: sync arrives as fast as the network; without this bound a slave whose disk or CPU is
#: slower held the difference in memory, up to the size of the master's store)
JOURNAL_BACKLOG_LIMIT = 8 << 20
#: the most one read of the link takes (a read that took less left nothing buffered)
READ_BYTES = 1 << 20
#: at most this many records read in one go are fsynced on the link's own loop
#: (``Journal.commit_here``); more go to the journal's writer thread, whose group commit
#: overlaps the next read with the fsync
INLINE_COMMIT_RECORDS = 4


class _LiveProtocol(asyncio.Protocol):
    """The link's socket once the stream is live (:meth:`SlaveLink.run`): each read is
    handed to ``on_data`` as it arrives; the end of the connection to ``on_lost``."""

    def __init__(self, on_data: Callable[[bytes], None], on_lost: Callable[[str], None]) -> None:
        self.on_data = on_data
        self.on_lost = on_lost

    def data_received(self, data: bytes) -> None:
        self.on_data(data)

    def eof_received(self) -> bool:
        self.on_lost("replication link closed by the master")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost(f"replication link broke: {exc}" if exc else "replication link closed by the master")


class _Tending:
    """What both of the link's loops do on their way round: a PING every quarter of the
    link timeout (the master is told this slave lives) and a compaction a second."""

    def __init__(self, store: MessageStore, writer: asyncio.StreamWriter, link_timeout: float, now: float) -> None:
        self.store = store
        self.writer = writer
        self.tick = link_timeout / 4
        self.last_ping = self.last_compact = now

    def tend(self, now: float) -> None:
        if now - self.last_ping >= self.tick:
            self.writer.write(pack(PING))
            self.last_ping = now
        if now - self.last_compact >= 1.0:
            self.last_compact = now
            with contextlib.suppress(Exception):
                self.store.compact()


class SlaveLink:
    """One replication link, slave side: apply what the master sends, ack what is durable.

    Back-pressure: after each read, a journal backlog over :data:`JOURNAL_BACKLOG_LIMIT`
    stops the reading until the journal has caught up (PINGs go on meanwhile), so the
    socket's window, and then the master's ``pause_writing``, hold the rest of the
    stream back: the slave's memory stays bounded whatever the store's size."""

    def __init__(
        self,
        store: MessageStore,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        link_timeout: float,
        on_synced: Callable[[], None],
        check_handover: Callable[[Mapping[str, str]], str | None] = lambda _h: "no handover expected",
    ) -> None:
        self.store = store
        self.reader = reader
        self.writer = writer
        self.link_timeout = link_timeout
        self.on_synced = on_synced
        self.check_handover = check_handover  # why a HANDOVER is refused (None: it is authentic)
        self.up = False  # the link is open
        self.synced = False  # the full sync is durable here
        self.handed_over = False  # the master handed over on this link (verified, while synced)

    async def run(self, stop: asyncio.Event) -> str:
        """Apply the stream until ``stop`` is set (``"stop"``, after a goodbye), the
        master hands over (``"handover"``) or the link is lost (``"lost"``)."""
        store, reader, writer = self.store, self.reader, self.writer
        decoder = WireDecoder()
        loop = asyncio.get_running_loop()
        acked = -1
        ack_scheduled = False
        to_ack = -1

        def send_ack() -> None:
            nonlocal ack_scheduled, acked
            ack_scheduled = False
            if to_ack > acked and not writer.is_closing():
                acked = to_ack
                writer.write(pack(ACK, pack_seq(to_ack)))

        def durable_up_to(seq: int) -> Callback:
            def done(err: BaseException | None) -> None:
                nonlocal to_ack, ack_scheduled
                if err is not None:
                    log.error("slave journal failed: %s; dropping the link", err)
                    writer.transport.abort()
                    return
                if seq > to_ack:
                    to_ack = seq
                if not ack_scheduled:
                    ack_scheduled = True
                    if not after_completions(send_ack):  # the ack goes once this batch's completions ran
                        loop.call_soon(send_ack)

            return done

        def sync_done(base: int) -> Callback:
            def done(err: BaseException | None) -> None:
                if err is not None:
                    log.error("slave journal failed during the full sync: %s", err)
                    writer.transport.abort()
                    return
                try:
                    store.apply_appended()  # the snapshot is applied before the store counts as a copy
                except Exception as exc:  # noqa: BLE001 - the store diverged: handle() raises it
                    log.error("slave store failed to apply the full sync: %s; dropping the link", exc)
                    writer.transport.abort()
                    return
                self.on_synced()
                self.synced = True
                durable_up_to(base)(None)

            return done

        applied: int | None = None  # the last record taken (numbered from SYNC_END's base; applied by handle's end)
        store.journal.wake_on_append = False  # each read ends in commit_here, which wakes the writer if need be

        def handle(data: bytes) -> str | None:
            """One read of the stream: append what it brought, fsync and ack it, then apply
            it; an outcome (``"handover"``, ``"lost"``) ends the link."""
            try:
                return append_and_ack(data)
            finally:
                # the apply, off the ACK's path, before anything else runs on the loop (a
                # takeover, compaction, a checkpoint); a failure raises: the link fails
                store.apply_appended()
                if store.diverged is not None:
                    raise RuntimeError(f"the replica's state is short of its journal: {store.diverged!r}")

        def append_and_ack(data: bytes) -> str | None:
            nonlocal applied
            got = time.perf_counter()
            for kind, payload in decoder.feed(data):
                if kind == RECORDS:
                    first, payloads = unpack_records(payload)
                    if applied is not None:
                        # each record once, in order: a record numbered at or below
                        # what is applied is a copy (applying an Enq twice would bring
                        # the message back after its ACK); a gap is a lost record
                        if first > applied + 1:
                            raise ReplicationError(f"records {applied + 1} to {first - 1} are missing "
                                                   f"from the stream (got {first})")
                        payloads = payloads[applied + 1 - first :]
                        first = applied + 1
                        if not payloads:
                            continue
                        applied = first + len(payloads) - 1
                    store.append_payloads(payloads, durable_up_to(first + len(payloads) - 1))
                elif kind == SNAP:
                    _first, payloads = unpack_records(payload)
                    store.append_payloads(payloads)
                elif kind == SYNC_END:
                    applied = unpack_seq(payload)
                    store.journal.on_durable(sync_done(applied))
                elif kind == HANDOVER:
                    return self._handover(unpack_handover(payload))
                elif kind != PING:
                    raise ReplicationError(f"unexpected frame kind {kind} from the master")
            RECEIPT_PATH.read.observe(time.perf_counter() - got)
            # a few records and an idle writer (one receipted send at a time): fsync them
            # here and ack at once, without the writer thread's two hand-offs
            completions = store.journal.commit_here(INLINE_COMMIT_RECORDS)
            if completions:
                run_completions(completions)
                RECEIPT_PATH.total.observe(time.perf_counter() - got)
            return None

        async def live() -> str:
            """The live stream: the socket's protocol hands each read to ``handle`` as it
            arrives (no task wakes for it: a slave woken for each record, as in a pair,
            answered it 8-11 us sooner than with ``await reader.read``, issue 27); this
            coroutine only watches for the end, a stop, silence, pings, compaction and a
            journal backlog (reading paused until it is durable)."""
            transport = cast(asyncio.Transport, writer.transport)
            ended: asyncio.Future[str] = loop.create_future()
            poke: asyncio.Future[None] = loop.create_future()
            failure: list[BaseException] = []
            last_data = loop.time()
            paused = False

            def finish(outcome: str) -> None:
                if not ended.done():
                    ended.set_result(outcome)
                if not poke.done():
                    poke.set_result(None)

            def on_data(data: bytes) -> None:
                nonlocal last_data, paused
                if ended.done():
                    return
                last_data = loop.time()
                try:
                    outcome = handle(data)
                except ReplicationError as exc:
                    log.error("replication stream error: %s", exc)
                    outcome = "lost"
                except Exception as exc:  # noqa: BLE001 - raised by run(), as from the read loop
                    failure.append(exc)
                    outcome = "lost"
                if outcome is not None:
                    finish(outcome)
                elif store.journal.failed is not None or store.journal.backlog_bytes > JOURNAL_BACKLOG_LIMIT:
                    if store.journal.failed is None:
                        transport.pause_reading()
                        paused = True
                    if not poke.done():
                        poke.set_result(None)

            def on_lost(reason: str) -> None:
                if not ended.done():
                    log.warning("%s", reason)
                finish("lost")

            transport.set_protocol(_LiveProtocol(on_data, on_lost))
            tending = _Tending(store, writer, self.link_timeout, loop.time())
            try:
                while not ended.done():
                    if stop_wait.done():
                        return await self._goodbye()
                    if store.journal.failed is not None:
                        log.error("slave journal failed: %s; dropping the link", store.journal.failed)
                        return "failed"
                    if paused:
                        await self._journal_caught_up(stop_wait.done)
                        paused = False
                        transport.resume_reading()
                        continue
                    now = loop.time()
                    if now - last_data >= self.link_timeout:
                        log.warning("replication link silent for %.1f s: treating the master as lost",
                                    self.link_timeout)
                        return "lost"
                    tending.tend(now)
                    if poke.done():
                        poke = loop.create_future()
                    watched = cast("set[asyncio.Future[object]]", {ended, poke, stop_wait})
                    await asyncio.wait(watched, timeout=min(tending.tick, last_data + self.link_timeout - now),
                                       return_when=asyncio.FIRST_COMPLETED)
            finally:
                finish("ended")  # what the connection does from now on is the caller's: no log
            if failure:
                raise failure[0]
            return ended.result()

        # one plain ``await reader.read`` per read, not an asyncio.wait on a new task per
        # read (issue 27: a slave woken for each record, as in a pair, answers it 26-42 us
        # sooner; BENCHMARKS.md, benchmarks/ab_slave_link.py); a stop or a silent link
        # interrupts the read by cancelling this task, only while it waits in that read
        task = asyncio.current_task()
        assert task is not None, "SlaveLink.run runs in a task"
        reading = False
        read_since = loop.time()
        interrupted: str | None = None  # why the read was cancelled: "stop" or "silent"
        watchdog: asyncio.TimerHandle | None = None

        def interrupt(why: str) -> None:
            nonlocal interrupted
            if reading and interrupted is None:
                interrupted = why
                task.cancel()

        def watch() -> None:
            """The silence watchdog: one timer, re-armed for the running read's deadline."""
            nonlocal watchdog
            now = loop.time()
            due = read_since + self.link_timeout if reading else now + self.link_timeout
            if reading and now >= due:
                interrupt("silent")
                due = now + self.link_timeout
            watchdog = loop.call_at(due, watch)

        watchdog = loop.call_at(loop.time() + self.link_timeout, watch)
        stop_wait = asyncio.ensure_future(stop.wait())
        stop_wait.add_done_callback(lambda _f: interrupt("stop"))
        tending = _Tending(store, writer, self.link_timeout, loop.time())
        self.up = True
        try:
            while True:
                if store.journal.failed is not None:
                    log.error("slave journal failed: %s; dropping the link", store.journal.failed)
                    return "failed"
                if stop_wait.done():
                    return await self._goodbye()
                now = loop.time()
                tending.tend(now)
                reading, read_since = True, now
                try:
                    data = await reader.read(READ_BYTES)
                except asyncio.CancelledError:
                    if interrupted is None:
                        raise  # cancelled from outside
                    task.uncancel()
                    if interrupted == "stop":
                        return await self._goodbye()
                    log.warning("replication link silent for %.1f s: treating the master as lost", self.link_timeout)
                    return "lost"
                except (OSError, ConnectionError) as exc:
                    log.warning("replication link broke: %s", exc)
                    return "lost"
                finally:
                    reading = False
                if not data:
                    log.warning("replication link closed by the master")
                    return "lost"
                outcome = handle(data)
                if outcome is not None:
                    return outcome
                if store.journal.backlog_bytes > JOURNAL_BACKLOG_LIMIT:
                    await self._journal_caught_up(stop_wait.done)
                elif applied is not None and len(data) < READ_BYTES:
                    # the stream is live and the reader holds nothing more (the read took
                    # less than it could): from now on each read is handled as it arrives
                    return await live()
        except ReplicationError as exc:
            log.error("replication stream error: %s", exc)
            return "lost"
        finally:
            self.up = False
            if watchdog is not None:
                watchdog.cancel()
            stop_wait.cancel()

    async def _goodbye(self) -> str:
        """The node stops: say goodbye (the master then does not count this slave as one
        that may be taking over), flush the journal; ``"stop"``."""
        with contextlib.suppress(Exception):
            self.writer.write(pack(BYE))
            await asyncio.wait_for(self.writer.drain(), 1.0)
        self.store.flush(5)
        return "stop"

    def _handover(self, headers: Mapping[str, str]) -> str:
        """The master hands over: ``"handover"`` once verified (and this copy is synced;
        what it streamed before is appended, and goes to disk as the store closes), else
        the link counts as lost."""
        reason = self.check_handover(headers)
        if reason is None and not self.synced:
            reason = "this store is not in sync yet"
        if reason is not None:
            log.error("replication link: the master's handover is refused (%s): treating the master as lost", reason)
            return "lost"
        log.warning("replication link: the master %s hands over at epoch %s", headers.get(HANDOVER_HEADER),
                    headers.get("amq-ha-epoch"))
        self.handed_over = True
        return "handover"

    async def _journal_caught_up(self, stopping: Callable[[], bool]) -> None:
        """Wait until everything appended is durable, pinging the master meanwhile (or
        until a stop is asked for: the read loop handles it)."""
        loop = asyncio.get_running_loop()
        durable: asyncio.Future[None] = loop.create_future()

        def resolve() -> None:
            if not durable.done():
                durable.set_result(None)

        def on_durable(_err: BaseException | None) -> None:
            loop.call_soon_threadsafe(resolve)

        self.store.journal.on_durable(on_durable)
        while not durable.done() and not stopping():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(durable), self.link_timeout / 4)
            if not durable.done() and not self.writer.is_closing():
                self.writer.write(pack(PING))
