"""A durable subscription's selector is in its Sub record, which the slave receives like
every record: after a SIGKILL of the master the new master keeps filtering the copies."""

from __future__ import annotations

import pytest

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(120)


def test_durable_selector_survives_a_takeover(tmp_path: object) -> None:
    with BrokerPair("replicated", tmp_path) as bp:  # type: ignore[arg-type]
        bp.wait_in_sync(30)
        with amqtransport.connect(bp.uri, client_id="sel-client") as c:
            c.subscribe("/topic/prices", durable_name="eu", selector="region = 'eu' AND price > 10")
        with amqtransport.connect(bp.uri) as c:
            c.send("/topic/prices", "before-eu", headers={"region": "eu", "price": "20"})
            c.send("/topic/prices", "before-us", headers={"region": "us", "price": "20"})
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        with amqtransport.connect(bp.uri) as c:
            c.send("/topic/prices", "after-cheap", headers={"region": "eu", "price": "5"})
            c.send("/topic/prices", "after-eu", headers={"region": "eu", "price": "11"})
        with amqtransport.connect(bp.uri, client_id="sel-client") as c:
            sub = c.subscribe("/topic/prices", durable_name="eu", selector="region = 'eu' AND price > 10")
            got = []
            while len(got) < 2 and (m := sub.receive(timeout=10)) is not None:
                got.append(m.text)
            while (m := sub.receive(timeout=0.3)) is not None:
                got.append(m.text)
        assert got == ["before-eu", "after-eu"]
