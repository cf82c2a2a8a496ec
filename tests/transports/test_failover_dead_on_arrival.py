"""A link that dies together with its CONNECTED frame (scripted in-memory backend).

The broker's CONNECTED and the close of its socket can reach the client together: a
master killed while a proxy with latency still holds its answer (the nemesis's N5:
a bridge rebuilt on a dying master stopped forwarding for good). The link's reader
then reports the loss before the failover transport has made the link current, and
the transport ignored it: it stayed "connected" to a dead link with no reader left to
notice, and every request waited forever. Such a link must be handled as a loss right
after the connect.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import amqtransport
from amqtransport._backends.memory import MemoryBackend
from amqtransport.errors import ReconnectExhausted
from amqtransport.testing.wait import wait_for

pytestmark = pytest.mark.timeout(30)



class Failures:
    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.event = threading.Event()

    def on_failed(self, error: BaseException) -> None:
        self.errors.append(error)
        self.event.set()


def test_without_reconnects_the_transport_fails_instead_of_waiting_forever() -> None:
    # the bridge's remote side: masterslave: is a failover with maxReconnectAttempts=0,
    # and its on_failed is what tells the bridge to rebuild on the new master
    backend = MemoryBackend()
    a, _b = backend.add("a:1"), backend.add("b:2")
    a.dead_on_arrival = 1
    failures = Failures()
    conn = amqtransport.connect("failover:(tcp://a:1,tcp://b:2)?randomize=false&maxReconnectAttempts=0",
                                backend=backend, listener=failures)
    try:
        assert failures.event.wait(5), "on_failed never called: the transport kept a dead link as current"
        assert isinstance(failures.errors[0], ReconnectExhausted)
        assert not conn.is_connected
        with pytest.raises(ReconnectExhausted):
            conn.send("/queue/x", "never stored")  # raises at once instead of waiting for a receipt
    finally:
        conn.close()


def test_with_reconnects_the_transport_moves_on_and_sends() -> None:
    backend = MemoryBackend()
    a, _b = backend.add("a:1"), backend.add("b:2")
    a.dead_on_arrival = 1
    conn = amqtransport.connect("failover:(tcp://a:1,tcp://b:2)?randomize=false&initialReconnectDelay=1",
                                backend=backend)
    try:
        def live() -> bool:
            link: Any = conn.transport.link
            return conn.is_connected and link is not None and link.alive

        wait_for(live, 5, "a live link")
        assert a.connect_count == 2  # the dead one, then a new one
        done = threading.Event()

        def send() -> None:
            conn.send("/queue/x", "stored")
            done.set()

        threading.Thread(target=send, daemon=True).start()
        assert done.wait(5), "the send waited forever on the dead link"
        assert [f.body for f in a.frames("SEND")] == [b"stored"]  # a's second connection is fine
    finally:
        conn.close()
