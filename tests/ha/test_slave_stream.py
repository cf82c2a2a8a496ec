"""The slave's side of the replication stream (broker/ha/slave_link.py): each record applied
once, in order, whatever the master sends.

A full sync ends with the journal's tail read back, then live records. When the tail
reader went past the point where live pushes start, the master sent those records twice
(fixed in master_link.py's MasterLink._pump); the slave applied both copies, so an Enq
was applied twice and its one ACK removed one copy: the message came back after a
takeover (the nemesis's redelivered-after-ack in replicated pairs). Here a scripted
master sends such an overlap, and a gap, to a real SlaveLink over a loopback socket.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.ha.slave_link import JOURNAL_BACKLOG_LIMIT, SlaveLink
from amqtransport.broker.ha.wire import (
    ACK,
    BYE,
    RECORDS,
    SNAP,
    SYNC_END,
    WireDecoder,
    pack,
    pack_seq,
    record_frames,
    unpack_seq,
)
from amqtransport.broker.store import RECEIPT_PATH, Ack, Enq, MessageStore
from amqtransport.broker.store import writer as writer_module
from amqtransport.broker.store.records import encode


def _msg(i: int) -> Message:
    return Message(id=f"m{i}", destination="/queue/a", headers=(("n", str(i)),), body=b"x" * 50,
                   key="", timestamp=1_700_000_000.0 + i, persistent=True)


def _run_slave(tmp_path: Path, frames: list[bytes]) -> tuple[str, MessageStore]:
    """A scripted master writes ``frames`` and keeps the link open; the slave applies
    them until the master closes (``"lost"``) or the stream is refused."""
    store = MessageStore(tmp_path / "replica")
    store.open()

    async def main() -> str:
        async def master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for f in frames:
                writer.write(f)
            await writer.drain()
            await asyncio.sleep(0.5)  # the slave applies and acks meanwhile
            writer.close()

        server = await asyncio.start_server(master, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        link = SlaveLink(store, reader, writer, link_timeout=5.0, on_synced=lambda: None)
        try:
            return await asyncio.wait_for(link.run(asyncio.Event()), 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    outcome = asyncio.run(main())
    store.flush()
    return outcome, store


def test_records_sent_twice_are_applied_once(tmp_path: Path) -> None:
    enq = [encode(Enq(_msg(i))) for i in range(1, 4)]
    frames = [
        *record_frames(SNAP, 0, [encode(Enq(_msg(0)))]),
        pack(SYNC_END, pack_seq(10)),
        *record_frames(RECORDS, 11, enq),  # records 11-13: m1, m2, m3
        *record_frames(RECORDS, 12, enq[1:]),  # 12-13 again (the tail went past the live start)
        *record_frames(RECORDS, 14, [encode(Ack(("m2", "m3"), "/queue/a"))]),
    ]
    outcome, store = _run_slave(tmp_path, frames)
    try:
        assert outcome == "lost"  # the scripted master closed the link
        live = sorted(m.id for m in store.iter_messages())
        assert live == ["m0", "m1"], live  # before the fix: m2 and m3 were back (applied twice, acked once)
        assert store.count == 2
    finally:
        store.close()


def test_the_slaves_reads_and_acks_are_in_the_receipt_path_histograms(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 27: a slave's share of a pair's receipt path is in its ``/metrics`` too: each
    replication read (``amq_receipt_read_seconds``) and, for a read fsynced on its loop,
    read -> ACK written (``amq_receipt_total_seconds``)."""
    monkeypatch.setattr(writer_module, "CHECK_INTERVAL", 60.0)  # the writer idle: the read is fsynced inline
    reads, totals = RECEIPT_PATH.read.snapshot().count, RECEIPT_PATH.total.snapshot().count
    frames = [pack(SYNC_END, pack_seq(0)), *record_frames(RECORDS, 1, [encode(Enq(_msg(1)))])]
    outcome, store = _run_slave(tmp_path, frames)
    try:
        assert outcome == "lost"
        assert RECEIPT_PATH.read.snapshot().count > reads
        assert RECEIPT_PATH.total.snapshot().count > totals
    finally:
        store.close()


def test_a_gap_in_the_records_drops_the_link(tmp_path: Path) -> None:
    frames = [
        pack(SYNC_END, pack_seq(10)),
        *record_frames(RECORDS, 11, [encode(Enq(_msg(1)))]),
        *record_frames(RECORDS, 13, [encode(Enq(_msg(3)))]),  # 12 never came
    ]
    outcome, store = _run_slave(tmp_path, frames)
    try:
        assert outcome == "lost"
        assert sorted(m.id for m in store.iter_messages()) == ["m1"]  # nothing after the gap
    finally:
        store.close()


def test_a_slave_with_a_slow_disk_holds_a_bounded_backlog_during_a_full_sync(tmp_path: Path) -> None:
    """A full sync arrives as fast as loopback carries it; this slave's journal takes 30
    ms per batch (a batch hook: a slow disk, or a busy host). The slave must stop
    reading while its journal backlog is over JOURNAL_BACKLOG_LIMIT, so what waits in
    its memory stays bounded; before the fix the whole stream piled up in the journal's
    queue (the default suite saw a slave at 166 MB RSS for a 200 MB store under load)."""
    body = b"y" * 2500
    snapshot = [encode(Enq(Message(id=f"m{i}", destination="/queue/a", headers=(), body=body, key="",
                                   timestamp=1_700_000_000.0 + i, persistent=True)))
                for i in range(16_000)]  # 40 MB
    frames = [*record_frames(SNAP, 0, snapshot), pack(SYNC_END, pack_seq(len(snapshot)))]
    store = MessageStore(tmp_path / "replica")
    store.open()
    backlog: list[int] = []

    def slow_disk(payloads: list[bytes]) -> None:
        backlog.append(store.journal.backlog_bytes)
        time.sleep(0.03)

    store.journal.add_batch_hook(slow_disk)

    async def main() -> str:
        async def master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for f in frames:  # as the real master: only while the socket takes it
                writer.write(f)
                await writer.drain()
            await asyncio.sleep(1.0)
            writer.close()

        server = await asyncio.start_server(master, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        link = SlaveLink(store, reader, writer, link_timeout=5.0, on_synced=lambda: None)
        try:
            return await asyncio.wait_for(link.run(asyncio.Event()), 120)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    try:
        assert asyncio.run(main()) == "lost"  # the scripted master closed the link after the sync
        store.flush()
        assert store.count == len(snapshot)  # everything arrived
        limit = JOURNAL_BACKLOG_LIMIT + (2 << 20)  # plus at most one read and one frame
        assert max(backlog) <= limit, f"journal backlog reached {max(backlog)} bytes (bound {limit})"
    finally:
        store.close()


#: a scripted master: writes to the slave, and awaits the slave's ACK of a sequence number
MasterScript = Callable[[asyncio.StreamWriter, Callable[[int], Awaitable[None]]], Awaitable[None]]


def _link_against(tmp_path: Path, master_script: MasterScript, link_timeout: float,
                  stop_after_sync: bool) -> tuple[str, list[int], float]:
    """Run a SlaveLink against a scripted master (``master_script(reader, writer)``);
    with ``stop_after_sync`` the node's stop event is set once the slave acked the
    SYNC_END. Returns (outcome, the frame kinds the master read, seconds the link ran)."""
    received: list[int] = []

    async def main(store: MessageStore) -> tuple[str, float]:
        stop = asyncio.Event()
        acked = asyncio.Event()
        highest = [-1]
        ack_seen = asyncio.Condition()

        async def master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            decoder = WireDecoder()

            async def read_all() -> None:
                while data := await reader.read(1 << 16):
                    for kind, payload in decoder.feed(data):
                        received.append(kind)
                        if kind == ACK:
                            acked.set()
                            async with ack_seen:
                                highest[0] = max(highest[0], unpack_seq(payload))
                                ack_seen.notify_all()

            async def wait_ack(seq: int) -> None:
                async with ack_seen:
                    await asyncio.wait_for(ack_seen.wait_for(lambda: highest[0] >= seq), 30)

            reading = asyncio.ensure_future(read_all())
            await master_script(writer, wait_ack)
            await asyncio.sleep(30)  # keeps the link open (and silent): the slave ends it
            reading.cancel()

        server = await asyncio.start_server(master, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        link = SlaveLink(store, reader, writer, link_timeout=link_timeout, on_synced=lambda: None)
        started = time.monotonic()
        run = asyncio.ensure_future(link.run(stop))
        if stop_after_sync:
            await asyncio.wait_for(acked.wait(), 30)
            stop.set()
        try:
            return await asyncio.wait_for(run, 60), time.monotonic() - started
        finally:
            writer.close()
            server.close()

    store = MessageStore(tmp_path / "replica")
    store.open()
    try:
        outcome, took = asyncio.run(main(store))
    finally:
        store.close()
    return outcome, received, took


async def _sync_only(writer: asyncio.StreamWriter, wait_ack: Callable[[int], Awaitable[None]]) -> None:
    writer.write(pack(SYNC_END, pack_seq(0)))
    await writer.drain()


def test_a_stopping_slave_says_goodbye_while_it_waits_for_the_stream(tmp_path: Path) -> None:
    """The node stops while the link waits in its read (issue 27 made that read a plain
    ``await reader.read``): the link ends with ``"stop"`` and the master gets ``BYE``."""
    outcome, received, _took = _link_against(tmp_path, _sync_only, link_timeout=30.0, stop_after_sync=True)
    assert outcome == "stop"
    assert BYE in received


def test_a_silent_master_is_lost_after_the_link_timeout(tmp_path: Path) -> None:
    """A master that sends nothing more (not even a PING) for ``link_timeout``: the link
    ends with ``"lost"``, not before the timeout and long before the test's own."""
    outcome, received, took = _link_against(tmp_path, _sync_only, link_timeout=1.0, stop_after_sync=False)
    assert outcome == "lost"
    assert ACK in received  # the SYNC_END was acked: the link was up
    assert took >= 1.0


def test_the_live_stream_applies_each_record_once_and_a_gap_drops_the_link(tmp_path: Path) -> None:
    """Once the stream is live the slave handles each read as it arrives (issue 27: its
    socket's protocol hands the read over, no task waits for it); the rules hold there
    too: a copy of an applied record is skipped, a gap ends the link, and each record is
    acked once durable. The scripted master waits for each ACK, so every read after the
    SYNC_END's is handled by the live path."""
    enq = [encode(Enq(_msg(i))) for i in range(1, 4)]

    async def master(writer: asyncio.StreamWriter, wait_ack: Callable[[int], Awaitable[None]]) -> None:
        writer.write(pack(SYNC_END, pack_seq(10)))
        await wait_ack(10)
        for seq, payload in enumerate(enq, 11):  # records 11-13, one read each
            writer.writelines(record_frames(RECORDS, seq, [payload]))
            await wait_ack(seq)
        writer.writelines(record_frames(RECORDS, 12, enq[1:]))  # 12-13 again: skipped
        writer.writelines(record_frames(RECORDS, 14, [encode(Ack(("m2",), "/queue/a"))]))
        await wait_ack(14)
        writer.writelines(record_frames(RECORDS, 16, [encode(Enq(_msg(6)))]))  # 15 never came

    outcome, received, _took = _link_against(tmp_path, master, link_timeout=30.0, stop_after_sync=False)
    assert outcome == "lost"  # the gap
    assert received.count(ACK) >= 5  # 10, 11, 12, 13, 14
    store = MessageStore(tmp_path / "replica")
    store.open()
    try:
        assert sorted(m.id for m in store.iter_messages()) == ["m1", "m3"]  # m2 acked once, m6 after the gap
    finally:
        store.close()


#: a slave's link in a process of its own, whose store blocks in the apply of message
#: ``m1`` (after saying so), so that the test can kill it there
_SLAVE_THAT_STOPS_IN_THE_APPLY = """
import asyncio, sys, time
from amqtransport.broker.ha.slave_link import SlaveLink
from amqtransport.broker.store import MessageStore, run_completions
from amqtransport.broker.store import writer as writer_module

writer_module.CHECK_INTERVAL = 300.0  # the writer idle: a lone record is fsynced on the link's loop

def apply_of(fold):
    def apply(rec, pos, payload=None, **kw):
        if getattr(getattr(rec, "message", None), "id", "") == "m1":
            print("applying m1", flush=True)
            time.sleep(600)
        fold(rec, pos, payload, **kw)
    return apply

async def main():
    loop = asyncio.get_running_loop()
    # completions on the loop, as a node's replica store has them (slave.fresh_replica_store)
    store = MessageStore(sys.argv[1], notify=lambda items: loop.call_soon_threadsafe(run_completions, items))
    store.open()
    store.apply = apply_of(store.apply)
    reader, writer = await asyncio.open_connection("127.0.0.1", int(sys.argv[2]))
    await SlaveLink(store, reader, writer, link_timeout=60.0, on_synced=lambda: None).run(asyncio.Event())

asyncio.run(main())
"""


def test_the_slave_acks_a_record_before_it_applies_it_and_a_kill_in_between_loses_nothing(tmp_path: Path) -> None:
    """issue 27: the slave's ACK of a batch goes as soon as the batch is fsynced, before
    it is applied to the store's state. A slave process stopped in the apply of ``m1``
    (observable: it says so) has already acked it, and once SIGKILLed there its journal
    still recovers ``m1`` (the journal, not the state, is the store). Before the change
    the apply came before the fsync and the ACK: no ACK of ``m1`` ever came."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(60)
    proc = subprocess.Popen([sys.executable, "-c", _SLAVE_THAT_STOPS_IN_THE_APPLY, str(tmp_path / "replica"),
                             str(server.getsockname()[1])], stdout=subprocess.PIPE, text=True)
    try:
        conn, _ = server.accept()
        conn.settimeout(60)
        decoder = WireDecoder()
        highest = -1

        def wait_ack(seq: int) -> None:
            nonlocal highest
            while highest < seq:
                data = conn.recv(1 << 16)
                assert data, f"the slave closed the link before it acked {seq}"
                highest = max([highest, *(unpack_seq(p) for k, p in decoder.feed(data) if k == ACK)])

        conn.sendall(pack(SYNC_END, pack_seq(0)))
        wait_ack(0)
        conn.sendall(b"".join(record_frames(RECORDS, 1, [encode(Enq(_msg(1)))])))
        wait_ack(1)  # before the change: a timeout (the slave sat in the apply, not yet fsynced)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout.readline().strip() == "applying m1"
        os.kill(proc.pid, signal.SIGKILL)  # after the ACK, in the apply
        proc.wait(30)
        conn.close()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        server.close()
    store = MessageStore(tmp_path / "replica")
    store.open()
    try:
        assert sorted(m.id for m in store.iter_messages()) == ["m1"]
    finally:
        store.close()
