"""A store whose apply failed after the append (its state is behind its journal) writes
no checkpoint from that state and deletes no segment by it, so the next start recovers
every appended record from the journal (store.py, "A failed apply"). Real files, no
sockets; the failure is injected into ``MessageStore.apply`` (the fold every path uses)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from amqtransport.broker import EmbeddedBroker
from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.store import Enq, MessageStore, Record, Tx, encode
from amqtransport.stomp import Frame


def _msg(i: int, size: int = 100) -> Message:
    return Message(id=f"m{i}", destination="/queue/a", headers=(), body=b"x" * size, key="",
                   timestamp=1_700_000_000.0 + i, persistent=True)


def _names(rec: Record) -> set[str]:
    inner = rec.records if isinstance(rec, Tx) else (rec,)
    return {r.message.id for r in inner if isinstance(r, Enq)}


def _fail_apply_of(store: MessageStore, monkeypatch: pytest.MonkeyPatch, message_id: str) -> None:
    """The store's apply raises for the record that carries ``message_id``."""
    fold = store.apply

    def failing(rec: Record, pos: int, payload: bytes | memoryview | None = None, *, keep: bool = False) -> None:
        if message_id in _names(rec):
            raise ValueError("the apply broke")
        fold(rec, pos, payload, keep=keep)

    monkeypatch.setattr(store, "apply", failing)


DIVERGED = ("the store's state is behind its journal after a failed apply: no checkpoint written; "
            "the next start recovers from the journal")


def _logged_diverged(caplog: pytest.LogCaptureFixture) -> bool:
    """The store said at ERROR what happened (then forgotten: conftest.py fails a test
    on any ERROR it does not expect)."""
    said = any(r.levelno == logging.ERROR and DIVERGED in r.getMessage() for r in caplog.records)
    caplog.clear()
    return said


def _recovered(path: Path) -> list[str]:
    again = MessageStore(path)
    again.open()
    try:
        return sorted(m.id for m in again.iter_messages())
    finally:
        again.close()


def test_an_import_whose_apply_fails_partway_loses_nothing_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The slave's import (stream and full sync alike): m1 applies, m2 fails, m3 never
    applies; all three are on the journal. Before the fix close() wrote a checkpoint at
    the batch's end from a state holding only m1, and the restart recovered ["m0", "m1"]."""
    path = tmp_path / "replica"
    store = MessageStore(path)
    store.open()
    store.import_payloads([encode(Enq(_msg(0)))])
    _fail_apply_of(store, monkeypatch, "m2")
    with pytest.raises(ValueError, match="the apply broke"):
        store.import_payloads([encode(Enq(_msg(i))) for i in (1, 2, 3)])
    store.close()
    assert _recovered(path) == ["m0", "m1", "m2", "m3"]
    assert _logged_diverged(caplog)
    assert store.diverged is not None


@pytest.mark.parametrize("end", ["close", "crash"])
def test_a_failed_apply_of_the_stores_own_write_loses_nothing_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, end: str) -> None:
    """The master's own append+apply (a topic's copies in one Tx record), on a store that
    checkpoints after every append: neither the background checkpoints that follow nor
    close() may be taken from the state that misses m2 and m3."""
    path = tmp_path / "master"
    store = MessageStore(path, checkpoint_interval=1)
    store.open()
    store.add(_msg(1))
    _fail_apply_of(store, monkeypatch, "m2")
    with pytest.raises(ValueError, match="the apply broke"):
        store.add_many([_msg(2), _msg(3)])
    store.checkpoints.stop()  # the one m1 started is done: the next append may start one
    store.add(_msg(4, size=20_000))  # the broker goes on: a background checkpoint is due now
    store.checkpoints.stop()
    if end == "close":
        store.close()
    else:  # SIGKILLed: the journal is durable, nothing else happens
        assert store.flush(30)
        store.journal.close()
    assert _recovered(path) == ["m1", "m2", "m3", "m4"]
    assert _logged_diverged(caplog)


def test_compaction_deletes_no_segment_by_a_state_behind_its_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """m1's segment holds no live message by the diverged state (its Enq never applied):
    deleting it would take m1 off the journal too, where no replay finds it again."""
    path = tmp_path / "replica"
    store = MessageStore(path, segment_size=1024)
    store.open()
    _fail_apply_of(store, monkeypatch, "m1")
    with pytest.raises(ValueError, match="the apply broke"):
        store.import_payloads([encode(Enq(_msg(1, size=2000)))])  # a segment of its own
    first = store.journal.head
    for i in range(2, 40):  # on into later segments (m1's is not the head any more)
        store.add(_msg(i))
    assert store.journal.head != first
    assert store.compact(force=True) == []
    store.close()
    assert _recovered(path) == sorted(f"m{i}" for i in range(1, 40))
    assert _logged_diverged(caplog)


def test_a_serving_broker_whose_store_diverges_fences_and_a_restart_recovers_the_message(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A SEND whose apply raises after its append: the broker does not go on serving from
    a state that lacks it (a consumer would never get it, a later checkpoint or compaction
    would drop it); it fences (its clients get ``amq-broker-stopped``, the port closes, an HA
    master hands over), and a restart on the same data dir has the message."""
    from broker_helpers import Raw

    data = tmp_path / "data"
    b = make_broker(data_dir=data)
    c = Raw(b.port)
    assert c.connect().command == "CONNECTED"
    c.send(Frame.make("SEND", {"destination": "/queue/d", "receipt": "r1", "persistent": "true", "amq-idempotency-key": "k1"}, b"m1"))
    assert c.read().command == "RECEIPT"
    store = b.server.store
    assert store is not None
    added = store.dedupe.add

    def failing(scope: str, key: str, accepted_at: float, segment: int = -1) -> None:
        if key == "k2":
            raise RuntimeError("the apply broke")
        added(scope, key, accepted_at, segment)

    monkeypatch.setattr(store.dedupe, "add", failing)  # inside the inline apply of add(), after the append
    c.send(Frame.make("SEND", {"destination": "/queue/d", "receipt": "r2", "persistent": "true", "amq-idempotency-key": "k2"}, b"m2"))
    err = c.read()  # not RECEIPT r2: the request failed
    assert err.command == "ERROR" and "the apply broke" in (err.get("message") or ""), err.headers
    deadline = time.monotonic() + 30
    while b.server.fenced is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b.server.fenced is not None and "behind its journal" in b.server.fenced
    assert store.diverged is not None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", b.port), timeout=2).close()  # the port is closed
    b.stop()
    caplog.clear()  # the failed apply and the fence are logged at ERROR: the point here
    again = make_broker(data_dir=data)
    c = Raw(again.port)
    assert c.connect().command == "CONNECTED"
    c.send(Frame.make("SUBSCRIBE", {"destination": "/queue/d", "id": "s", "ack": "auto"}))
    bodies = sorted(c.read().body for _ in range(2))
    assert bodies == [b"m1", b"m2"]
