"""The slave's side of the replication stream (broker/ha/slave.py): each record applied
once, in order, whatever the master sends.

A full sync ends with the journal's tail read back, then live records. When the tail
reader went past the point where live pushes start, the master sent those records twice
(fixed in replication.py's MasterLink._pump); the slave applied both copies, so an Enq
was applied twice and its one ACK removed one copy: the message came back after a
takeover (the nemesis's redelivered-after-ack in replicated pairs). Here a scripted
master sends such an overlap, and a gap, to a real SlaveLink over a loopback socket.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from amqtransport.broker.ha.slave import SlaveLink
from amqtransport.broker.ha.wire import RECORDS, SNAP, SYNC_END, pack, pack_seq, record_frames
from amqtransport.broker.message import Message
from amqtransport.broker.store import Ack, Enq, MessageStore
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
