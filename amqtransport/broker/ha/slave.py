"""The slave's side of a replication link (the theory is in :mod:`.replication`).

Theory of operation
-------------------
A slave that has joined a master (the handshake is the node's: :meth:`HaNode._serve_slave`)
wipes its store (:func:`fresh_replica_store`: a full sync starts from nothing) and runs
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
    (acks are coalesced: one per loop turn, the highest sequence number durable);
``PING``
    the master is alive.

The slave pings every quarter of ``--link-timeout`` and treats a link silent for
``--link-timeout`` as lost, like a broken or closed one, or a malformed frame. When
the node stops it says goodbye (``BYE``), so the master does not count it as a slave
that may be taking over, and flushes its journal. A journal failure drops the link
(the master then counts this slave as lost). :meth:`SlaveLink.run` returns ``"stop"``
or ``"lost"``; what the node does after a loss is in :mod:`.node`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from ..config import BrokerConfig
from ..store import Callback, MessageStore, run_completions
from .wire import (
    ACK,
    BYE,
    PING,
    RECORDS,
    SNAP,
    SYNC_END,
    ReplicationError,
    WireDecoder,
    pack,
    pack_seq,
    unpack_records,
    unpack_seq,
)

__all__ = ["SlaveLink", "fresh_replica_store"]

log = logging.getLogger(__name__)


def fresh_replica_store(data_dir: Path, config: BrokerConfig, loop: asyncio.AbstractEventLoop) -> MessageStore:
    """Wipe ``data_dir/journal`` and open an empty store there for a full sync; its
    journal completions run on ``loop``."""
    shutil.rmtree(data_dir / "journal", ignore_errors=True)

    def notify(items: list[tuple[Callback, BaseException | None]]) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(run_completions, items)

    store = MessageStore(
        data_dir / "journal",
        segment_size=config.segment_size,
        fsync=config.fsync,
        dedupe_max_keys=config.dedupe_window_size,
        dedupe_max_age=config.dedupe_window_seconds,
        notify=notify,
    )
    store.open()
    return store


class SlaveLink:
    """One replication link, slave side: apply what the master sends, ack what is durable."""

    def __init__(
        self,
        store: MessageStore,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        link_timeout: float,
        on_synced: Callable[[], None],
    ) -> None:
        self.store = store
        self.reader = reader
        self.writer = writer
        self.link_timeout = link_timeout
        self.on_synced = on_synced
        self.up = False  # the link is open
        self.synced = False  # the full sync is durable here

    async def run(self, stop: asyncio.Event) -> str:
        """Apply the stream until ``stop`` is set (``"stop"``, after a goodbye) or the
        link is lost (``"lost"``)."""
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
                    loop.call_soon(send_ack)

            return done

        def sync_done(base: int) -> Callback:
            def done(err: BaseException | None) -> None:
                if err is not None:
                    log.error("slave journal failed during the full sync: %s", err)
                    writer.transport.abort()
                    return
                self.on_synced()
                self.synced = True
                durable_up_to(base)(None)

            return done

        stop_wait = asyncio.ensure_future(stop.wait())
        last_ping = loop.time()
        last_compact = loop.time()
        self.up = True
        try:
            while True:
                now = loop.time()
                if now - last_ping >= self.link_timeout / 4:
                    writer.write(pack(PING))
                    last_ping = now
                if now - last_compact >= 1.0:
                    last_compact = now
                    with contextlib.suppress(Exception):
                        store.compact()
                read = asyncio.ensure_future(reader.read(1 << 20))
                done, _ = await asyncio.wait(
                    {read, stop_wait}, timeout=self.link_timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if stop_wait in done:
                    read.cancel()
                    with contextlib.suppress(Exception):
                        writer.write(pack(BYE))
                        await asyncio.wait_for(writer.drain(), 1.0)
                    store.flush(5)
                    return "stop"
                if read not in done:
                    read.cancel()
                    log.warning("replication link silent for %.1f s: treating the master as lost", self.link_timeout)
                    return "lost"
                try:
                    data = read.result()
                except (OSError, ConnectionError) as exc:
                    log.warning("replication link broke: %s", exc)
                    return "lost"
                if not data:
                    log.warning("replication link closed by the master")
                    return "lost"
                for kind, payload in decoder.feed(data):
                    if kind == RECORDS:
                        first, payloads = unpack_records(payload)
                        store.import_payloads(payloads, durable_up_to(first + len(payloads) - 1))
                    elif kind == SNAP:
                        _first, payloads = unpack_records(payload)
                        store.import_payloads(payloads)
                    elif kind == SYNC_END:
                        store.journal.on_durable(sync_done(unpack_seq(payload)))
                    elif kind != PING:
                        raise ReplicationError(f"unexpected frame kind {kind} from the master")
        except ReplicationError as exc:
            log.error("replication stream error: %s", exc)
            return "lost"
        finally:
            self.up = False
            stop_wait.cancel()
