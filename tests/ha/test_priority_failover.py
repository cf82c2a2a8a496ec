"""Priority after a takeover: the slave has every message's record (its headers carry the
priority), so after a SIGKILL of the master the new master delivers them by priority,
FIFO within one, like the old one would have."""

from __future__ import annotations

import random
from pathlib import Path

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


def test_a_deep_paged_backlog_keeps_exact_priority_order_across_a_takeover(tmp_path: Path) -> None:
    """300 mixed priorities with ``page_window`` 20 (so nearly all of them paged, on the
    master and then on the new master, which learns each priority from its record)."""
    rng = random.Random(24)
    sent = [(f"d{i}", rng.randrange(10)) for i in range(300)]
    cfg = tmp_path / "broker.toml"
    cfg.write_text("[broker]\npage_window = 20\n")
    with BrokerPair("replicated", tmp_path / "pair", extra_args=["--config", str(cfg)]) as bp:
        bp.wait_in_sync(30)
        with amqtransport.connect(bp.uri) as c:
            p = c.producer(window=100)
            for body, prio in sent:
                p.send("/queue/prio-ha-deep", body, headers={"priority": str(prio)})
            p.flush()
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe("/queue/prio-ha-deep", ack="client-individual", prefetch=1)
            got = []
            while len(got) < len(sent) and (m := sub.receive(timeout=10)) is not None:
                got.append(m.text)
                m.ack()
    assert got == [b for b, _p in sorted(sent, key=lambda e: -e[1])]
