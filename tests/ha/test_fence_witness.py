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


class _Started(Exception):
    pass


def test_a_term_with_a_witness_says_alone_before_its_first_receipt() -> None:
    """A node granted mastership by the witness (its record: holder at the new epoch, "not
    alone") starts its term with no in-sync slave: before the broker opens (start(), the
    first moment a receipt is possible) the witness's record must say it receipts alone --
    else, were the new master cut from the witness from then on, its lease would run out
    with the record still saying "not alone" and the witness could grant the other node
    past it (lease.takeover_epoch) without the receipts it gave. Before the fix the record
    still said "not alone" when the term started."""

    class State:
        epoch, role, synced = 7, "slave", True

        def save(self, data_dir: Path) -> None:
            pass

    seen: list[tuple[bool, float]] = []

    class Role(MasterRole):
        async def start(self, *, replicate: bool) -> None:
            node: Any = self.node
            seen.append((node.lease.alone, node.lease_until))
            raise _Started

    async def main(witness_answers: bool) -> None:
        loop = asyncio.get_running_loop()
        node: Any = SimpleNamespace(name="b", loop=loop, data_dir=Path("/nonexistent"), state=State(),
                                    granted_epoch=8, lease_until=0.0, witness=object())
        node.lease = takeover(renew(PairLease("k"), "a", 7, False, LEASE, 0.0).lease, "b", 8, LEASE, 10.0).lease
        assert node.lease.holder == "b" and not node.lease.alone

        async def renew_lease(*, alone: bool) -> Any:
            if not witness_answers:
                return SimpleNamespace(granted=False, fence=False, reason="witness unreachable")
            v = renew(node.lease, "b", node.state.epoch, alone, LEASE, 10.1)
            node.lease = v.lease
            if v.granted:
                node.lease_until = loop.time() + LEASE
            return SimpleNamespace(granted=v.granted, fence=v.fence, reason=v.reason)

        node.renew_lease = renew_lease
        try:
            await Role(node).serve()
        except _Started:
            pass

    asyncio.run(main(True))
    assert seen[-1][0] is True and seen[-1][1] > 0, seen  # the record says alone; the term has its lease
    asyncio.run(main(False))
    assert seen[-1] == (False, 0.0), seen  # no renewal: no lease (the term starts suspect)
