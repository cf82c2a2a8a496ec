"""The nemesis's client-port probe (chaos/nemesis/probe.py) counts a CONNECTED as the
probed node's only when the session id names that node: a relaying node passes a
CONNECT on to its master, and that answer is the master's (else the checker's
two-masters rule would see two nodes serving). With ``--relay-port`` a slave relays on
a port of its own, not on the client port the probe looks at; the check stays."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from chaos.nemesis.probe import probe_once


@pytest.fixture
def answering() -> Iterator[tuple[int, list[bytes]]]:
    """A listener answering each connection's CONNECT with the next queued frame."""
    srv = socket.create_server(("127.0.0.1", 0))
    answers: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(answers.pop(0))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], answers
    finally:
        srv.close()


def test_a_connected_from_another_node_is_not_this_nodes_answer(answering: tuple[int, list[bytes]]) -> None:
    port, answers = answering
    own = b"CONNECTED\nversion:1.2\nsession:b-x1-42-1\nserver:amqtransport/0.1\n\n\x00"
    relayed = b"CONNECTED\nversion:1.2\nsession:a-x1-41-7\nserver:amqtransport/0.1\n\n\x00"
    answers += [own, relayed, relayed, b"ERROR\nmessage:no\n\n\x00"]
    assert probe_once("127.0.0.1", port, 5.0, node="b")[0] is True
    assert probe_once("127.0.0.1", port, 5.0, node="b")[0] is False  # relayed to master a
    assert probe_once("127.0.0.1", port, 5.0)[0] is True  # no node named: any CONNECTED
    assert probe_once("127.0.0.1", port, 5.0, node="b")[0] is False
