"""Message priority, differential: the same scenarios against our broker and ActiveMQ 5.17
with ``prioritizedMessages`` on (one JVM for this module), asserting one outcome.

Every test takes ``broker_uri``, parametrized over ``amq`` (an in-process
``EmbeddedBroker`` with its defaults: priority is on) and ``activemq``. What ActiveMQ
does is the specification; where we refuse input it accepts (a priority outside 0-9),
the test says so and checks each broker's own behaviour. Paging, restart, takeover and
``prioritized_messages = false`` are tests/broker/test_priority.py and
tests/ha/test_priority_failover.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from differential import BROKERS, broker

import amqtransport
import amqtransport.aio
from amqtransport.cli.main import cli
from amqtransport.errors import AmqTransportError, BrokerError

pytestmark = pytest.mark.timeout(180)

#: ActiveMQ's queues are FIFO unless a policy entry turns prioritizedMessages on
PRIORITY_POLICY = """    <destinationPolicy><policyMap><policyEntries>
      <policyEntry queue=">" prioritizedMessages="true"/>
    </policyEntries></policyMap></destinationPolicy>"""


@pytest.fixture(scope="module", params=BROKERS)
def broker_uri(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tcp://`` of our broker or of ActiveMQ 5.17 (one JVM for the whole module)."""
    with broker(request.param, tmp_path_factory, "priority", extra_xml=PRIORITY_POLICY) as uri:
        yield uri


def unique() -> str:
    return f"/queue/prio.{uuid.uuid4().hex[:10]}"


def bodies(sub: amqtransport.Subscription, count: int, quiet: float = 0.3) -> list[str]:
    out: list[str] = []
    while len(out) < count and (m := sub.receive(timeout=10.0)) is not None:
        out.append(m.text)
        m.ack()
    while (m := sub.receive(timeout=quiet)) is not None:
        out.append(m.text)
        m.ack()
    return out


MIXED = [(f"m{i}", (i * 7) % 10) for i in range(30)]
BY_PRIORITY = [b for b, _p in sorted(MIXED, key=lambda e: -e[1])]  # stable: FIFO within a priority


def test_higher_priority_first_fifo_within(broker_uri: str) -> None:
    q = unique()
    with amqtransport.connect(broker_uri) as c:
        for body, prio in MIXED:
            c.send(q, body, priority=prio)
        sub = c.subscribe(q, ack="client-individual", prefetch=1)
        assert bodies(sub, len(MIXED)) == BY_PRIORITY


def test_a_backlog_deeper_than_the_memory_window_in_exact_order(broker_uri: str) -> None:
    """1,500 mixed priorities sent before anyone consumes: more than our ``page_window``
    (1000, so ours pages 500 of them) and than ActiveMQ's ``maxPageSize`` (200). Both
    deliver highest first, FIFO within a priority, from the first message to the last
    (ActiveMQ's cursor holds them all in memory, sorted; ours pages in by priority)."""
    q = unique()
    # the 1,001st (the first one ours pages) is a 9: the 0s held in memory must wait for it
    items = [(f"d{i}", (i * 7) % 10 if i < 1000 else 9 - (i * 3) % 10) for i in range(1500)]
    with amqtransport.connect(broker_uri) as c:
        p = c.producer(window=200)
        for body, prio in items:
            p.send(q, body, headers={"priority": str(prio)})
        p.flush()
        sub = c.subscribe(q, ack="client-individual", prefetch=1)
        assert bodies(sub, len(items)) == [b for b, _p in sorted(items, key=lambda e: -e[1])]


def test_no_priority_is_4_and_the_header_works_too(broker_uri: str) -> None:
    q = unique()
    with amqtransport.connect(broker_uri) as c:
        c.send(q, "low", priority=3)
        c.send(q, "default")
        c.send(q, "header", headers={"priority": "5"})
        c.send(q, "four", priority=4)
        sub = c.subscribe(q, ack="client-individual", prefetch=1)
        assert bodies(sub, 4) == ["header", "default", "four", "low"]


def test_asyncio_client_and_a_transaction(broker_uri: str) -> None:
    q = unique()

    async def run() -> list[str]:
        async with amqtransport.aio.connect(broker_uri) as c:
            async with c.transaction() as tx:
                await tx.send(q, "tx-low", priority=1)
                await tx.send(q, "tx-high", priority=8)
            await c.send(q, "mid", priority=5)
            sub = await c.subscribe(q, ack="client-individual", prefetch=1)
            out = []
            for _ in range(3):
                m = await sub.receive(timeout=10)
                assert m is not None
                out.append(m.text)
                await m.ack()
            return out

    assert asyncio.run(run()) == ["tx-high", "mid", "tx-low"]


def test_cli_send_priority(broker_uri: str) -> None:
    q = unique()
    for prio in ("2", "9"):
        r = CliRunner().invoke(cli, ["send", broker_uri, q, "-n", "2", "--priority", prio, "--id-prefix", f"p{prio}",
                                     "--no-progress"])
        assert r.exit_code == 0, r.output
    bad = CliRunner().invoke(cli, ["send", broker_uri, q, "-n", "1", "--priority", "10"])
    assert bad.exit_code == 2 and "--priority" in bad.output
    with amqtransport.connect(broker_uri) as c:
        sub = c.subscribe(q, ack="client-individual", prefetch=1)
        assert bodies(sub, 4) == ["p9-0", "p9-1", "p2-0", "p2-1"]


def test_the_client_refuses_a_priority_outside_0_to_9(broker_uri: str) -> None:
    with amqtransport.connect(broker_uri) as c:
        for bad in (10, -1, True, "5"):
            with pytest.raises(ValueError, match="priority must be an integer from 0 to 9"):
                c.send(unique(), "x", priority=bad)  # type: ignore[arg-type]


def test_priority_header_outside_0_to_9_differs_on_purpose(broker_uri: str) -> None:
    """Ours: ERROR naming the header, the connection keeps working. ActiveMQ 5.17 casts the
    number to a byte and clamps it to 0-9 (12 -> 9, -1 -> 0, 256 -> 0); a header that is not
    a number closes its connection without an ERROR."""
    q = unique()
    with amqtransport.connect(broker_uri) as c:
        ours = c.server is None or "ActiveMQ" not in c.server
        if ours:
            with pytest.raises(BrokerError, match=r"priority header must be an integer from 0 to 9, got '12'"):
                c.send(q, "twelve", headers={"priority": "12"})
            c.send(q, "fine", priority=0)
            sub = c.subscribe(q)
            assert bodies(sub, 1) == ["fine"]
            return
        c.send(q, "zero", priority=0)
        c.send(q, "twelve", headers={"priority": "12"})  # clamped to 9
        c.send(q, "minus", headers={"priority": "-1"})  # clamped to 0
        sub = c.subscribe(q, ack="client-individual", prefetch=1)
        assert bodies(sub, 3) == ["twelve", "zero", "minus"]
    with pytest.raises(AmqTransportError):
        with amqtransport.connect(broker_uri + "?maxReconnectAttempts=0") as c:
            c.send(q, "word", headers={"priority": "high"})
