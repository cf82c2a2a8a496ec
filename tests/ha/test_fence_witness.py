"""A fencing master with a witness hands over to its in-sync slave only after telling the
witness it no longer receipts alone (ha/master.py ``_fenced`` / ``_on_slave_synced``).

Found by a 200-round nemesis run (replicated, --witness): a slave resynced, the master's
disk was full 30 ms later, the master fenced and "handed over", but the witness's last
word from it was still "alone" (its lease loop had not renewed since the slave synced,
and ``_on_slave_synced`` raised on the full disk before asking it to), so the witness
refused the slave mastership for good and the pair stayed without a master. The node
here is a fake; the witness is the real pure lease rules (ha/lease.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from amqtransport.broker.ha.lease import PairLease, renew, takeover
from amqtransport.broker.ha.master import MasterRole

LEASE = 2.0


class _State:
    def __init__(self) -> None:
        self.synced = True
        self.peer_may_be_master = False
        self.peer = _Peer()

    def save(self, data_dir: Path) -> None:
        raise OSError(28, "No space left on device")


class _Peer(dict[str, str]):
    def update(self, *args: Any, name: str = "", **kw: Any) -> None:
        super().update(*args, **kw)


class _Node:
    """What MasterRole touches of the node, with the witness's record as ``lease``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, alone_before: bool) -> None:
        self.name = "b"
        self.loop = loop
        self.data_dir = Path("/nonexistent")
        self.state = _State()
        self.opts = SimpleNamespace(link_timeout=1.0)
        self.witness = object()
        self.demote_event = asyncio.Event()
        self.now = 0.0
        self.lease = renew(PairLease("k"), "b", 7, alone_before, LEASE, self.now).lease
        self.link = SimpleNamespace(synced=True, slave="a", info={})
        self.repl = SimpleNamespace(link=self.link)
        self.said: list[str] = []
        self.listening = True

    async def renew_lease(self, *, alone: bool) -> Any:
        v = renew(self.lease, "b", 7, alone, LEASE, self.now)
        self.lease = v.lease
        return SimpleNamespace(granted=v.granted, fence=v.fence, reason=v.reason)

    def say(self, text: str) -> None:
        self.said.append(text)


def _run(alone_before: bool) -> tuple[_Node, MasterRole]:
    async def main() -> tuple[_Node, MasterRole]:
        node = _Node(asyncio.get_running_loop(), alone_before)
        role = MasterRole(node)  # type: ignore[arg-type]
        role.renew_now = asyncio.Event()
        role._on_slave_synced(node.link)  # type: ignore[arg-type]  # noqa: SLF001  (its save fails: full disk)
        assert role.renew_now.is_set(), "the witness must hear of the in-sync slave even when the save fails"
        node.now = 0.03
        role._fenced("journal write failed: [Errno 28] No space left on device")  # noqa: SLF001
        await asyncio.wait_for(node.demote_event.wait(), 10)
        return node, role

    return asyncio.run(main())


def test_a_fencing_master_tells_the_witness_before_it_hands_over() -> None:
    node, _role = _run(alone_before=True)
    assert not node.lease.alone
    # once the master's lease has run out, the in-sync slave is granted mastership
    assert takeover(node.lease, "a", 8, LEASE, node.now + LEASE).granted
