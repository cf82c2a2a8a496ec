"""A slow non-durable topic subscriber's backlog is bounded in bytes as well as messages
(real sockets): 40 MiB of 512 KiB messages published to a subscriber that reads nothing
leave at most ``topic_backlog_bytes`` in its backlog, the oldest dropped."""

from __future__ import annotations

import socket
from collections.abc import Callable

from broker_helpers import Raw, StompPy

from amqtransport.broker import EmbeddedBroker
from amqtransport.stomp import Frame

MIB = 1024 * 1024


def backlog(b: EmbeddedBroker) -> dict[str, int]:
    st = b.stats()["topic_backlog"]
    assert isinstance(st, dict)
    return st


def test_topic_backlog_is_bounded_in_bytes(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(topic_backlog_bytes=4 * MIB, fsync=False)
    stuck = Raw(b.port)  # subscribes, then never reads (no heart-beats: it is not dropped)
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    stuck.connect()
    stuck.send(Frame.make("SUBSCRIBE", {"id": "s", "destination": "/topic/t", "receipt": "sub"}))
    assert stuck.read().get("receipt-id") == "sub"
    p = StompPy(b.port)
    body = "x" * (512 * 1024)
    p.wait_receipts([p.send("/topic/t", body, persistent=False, seq=str(i)) for i in range(80)], 60)
    st = backlog(b)
    assert 0 < st["bytes"] <= 4 * MIB, st  # before: every message not yet written, ~30 MiB
    assert st["dropped"] > 0 and st["messages"] <= 8, st
    assert st["messages"] + st["dropped"] <= 80
    p.close()
    stuck.close()
