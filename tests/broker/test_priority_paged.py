"""Exact priority order over a paged backlog (issue 22): a broker process whose queue is
far deeper than its memory window (``page_window``), with mixed priorities, delivers
highest priority first, FIFO within a priority -- across the paging boundary, after a
clean restart (the queue comes back from a checkpoint, which does not hold priorities:
the store reads them back) and after a SIGKILL (a checkpoint and the journal's tail).
The differential test against ActiveMQ is tests/interop/test_activemq_priority.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import amqtransport
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(180)

Q = "/queue/deep-prio"


def send_all(uri: str, items: list[tuple[str, int]]) -> None:
    with amqtransport.connect(uri) as c:
        p = c.producer(window=100)
        for body, prio in items:
            p.send(Q, body, headers={"priority": str(prio)})
        p.flush()  # every receipt: on disk


def take(uri: str, count: int) -> list[str]:
    """``count`` messages, acked one by one (prefetch 1: what the broker ranks first now)."""
    out: list[str] = []
    with amqtransport.connect(uri) as c:
        sub = c.subscribe(Q, ack="client-individual", prefetch=1)
        while len(out) < count and (m := sub.receive(timeout=20)) is not None:
            out.append(m.text)
            m.ack()
        c.send("/queue/fence", "x", receipt=True)  # the acks before it are processed
    return out


def ranked(items: list[tuple[str, int]]) -> list[str]:
    return [b for b, _p in sorted(items, key=lambda e: -e[1])]  # stable: FIFO within a priority


def test_a_deep_paged_backlog_drains_in_exact_priority_order_also_after_restarts(tmp_path: Path) -> None:
    rng = random.Random(22)
    first = [(f"a{i}", rng.randrange(10)) for i in range(400)]  # 20 resident, 380 paged
    cfg = tmp_path / "broker.toml"
    cfg.write_text("[broker]\npage_window = 20\n")
    with BrokerProcess(tmp_path / "data", args=["--config", str(cfg)], log_dir=tmp_path) as bp:
        send_all(bp.uri, first)
        want = ranked(first)
        got = take(bp.uri, 120)
        assert got == want[:120]
        left = [e for e in first if e[0] not in set(got)]

        bp.restart()  # clean: the queue comes back from the checkpoint written at close
        later = [(f"b{i}", rng.randrange(10)) for i in range(150)]  # behind the restored ones
        send_all(bp.uri, later)
        want = ranked([*left, *later])
        got = take(bp.uri, 150)
        assert got == want[:150]
        left = [e for e in [*left, *later] if e[0] not in set(got)]

        bp.restart(hard=True)  # SIGKILL: a checkpoint and the journal's tail
        got = take(bp.uri, len(left))
        assert got == ranked(left)
        assert "ERROR" not in bp.log_text()
