"""A receipted SEND to a queue whose backlog is paged, with a selective consumer: the
broker's loop appends the record, then (in the same turn, before the turn's own commit)
scans the paged backlog for the consumer -- the new record among it -- and reads it back.
That read must wake the journal's writer, not wait for its idle round: it stalled the
loop (every client, the HA pings) for ``CHECK_INTERVAL`` per read, seconds per send after
a shared-store takeover under the nemesis (p50 receipt 0.5-3 s). Here the idle round is
taken out of the way (60 s), so a stall would be a hang."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import amqtransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.broker.store import writer as writer_module

pytestmark = pytest.mark.timeout(120)

Q = "/queue/paged-selective"


def test_receipted_sends_past_a_selective_consumer_of_a_paged_queue_do_not_wait_for_the_writer(
        make_broker: Callable[..., EmbeddedBroker], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "CHECK_INTERVAL", 60.0)
    b = make_broker(page_window=5)
    with amqtransport.connect(b.uri) as c:
        for i in range(30):  # a backlog deeper than the window: paged
            c.send(Q, f"old-{i}", headers={"k": "miss"})
        sub = c.subscribe(Q, selector="k = 'hit'", ack="client-individual")
        for i in range(10):  # each: appended, scanned for the consumer, receipted
            c.send(Q, f"new-{i}", headers={"k": "miss"}, timeout=10)
        c.send(Q, "wanted", headers={"k": "hit"})
        msg = sub.receive(timeout=20)
        assert msg is not None and msg.text == "wanted"
        msg.ack()
