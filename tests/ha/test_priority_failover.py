"""Priority after a takeover: the slave has every message's record (its headers carry the
priority), so after a SIGKILL of the master the new master delivers them by priority,
FIFO within one, like the old one would have."""

from __future__ import annotations

import pytest

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(120)


def test_priority_order_survives_a_takeover(tmp_path: object) -> None:
    sent = [(f"m{i}", (i * 3) % 10) for i in range(30)]
    with BrokerPair("replicated", tmp_path) as bp:  # type: ignore[arg-type]
        bp.wait_in_sync(30)
        with amqtransport.connect(bp.uri) as c:
            for body, prio in sent:
                c.send("/queue/prio-ha", body, priority=prio)
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/prio-ha", "after", priority=9)
            sub = c.subscribe("/queue/prio-ha", ack="client-individual", prefetch=1)
            got = []
            while len(got) < 31 and (m := sub.receive(timeout=10)) is not None:
                got.append(m.text)
                m.ack()
    want = [b for b, _p in sorted([*sent, ("after", 9)], key=lambda e: -e[1])]
    assert got == want
