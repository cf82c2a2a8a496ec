"""The master's end of a full sync fails cleanly whatever goes wrong in it.

A step of the full sync (``MasterLink._pump``) runs as a plain loop callback: an error it
did not expect was logged by asyncio and nothing else happened, so the link stayed open,
the sync never ended and the slave never came back in sync (seen once: an empty payload
read back made ``SnapshotReader`` raise ``IndexError``; the pair then held every receipt
until it was stopped). Now any error in a step drops the slave with the reason, and the
slave's reconnect starts a new sync.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from amqtransport.broker.ha.master_link import MasterLink
from amqtransport.broker.store.store import MessageStore
from amqtransport.broker.store.sync import SnapshotReader


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None

    def set_protocol(self, protocol: object) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


class _Owner:
    def __init__(self, loop: asyncio.AbstractEventLoop, store: MessageStore) -> None:
        self.loop = loop
        self.store = store
        self.link_timeout = 5.0
        self.seq = 0
        self.lost: list[str] = []

    def _on_ack(self, link: MasterLink, seq: int) -> None:
        pass

    def _link_lost(self, link: MasterLink, reason: str) -> None:
        self.lost.append(reason)


class _BrokenSnapshot(SnapshotReader):
    def next(self, max_bytes: int) -> list[bytes]:
        raise IndexError("index out of range")


def test_an_unexpected_error_in_a_sync_step_drops_the_slave_rather_than_stalling(tmp_path: Path) -> None:
    async def scenario() -> tuple[_Owner, _Transport, MasterLink]:
        store = MessageStore(tmp_path / "store")
        store.open()
        try:
            owner = _Owner(asyncio.get_running_loop(), store)
            transport = _Transport()
            link = MasterLink(owner, transport, "b", 0)  # type: ignore[arg-type]
            link.start(b"answer", _BrokenSnapshot(store))
            for _ in range(20):
                await asyncio.sleep(0)
            link.abort("test over")  # (idempotent: a no-op when the step dropped it already)
            return owner, transport, link
        finally:
            store.close()

    owner, transport, link = asyncio.run(scenario())
    assert link.closed and transport.aborted
    assert owner.lost and owner.lost[0].startswith("full sync failed"), owner.lost
    assert "IndexError" in owner.lost[0]
