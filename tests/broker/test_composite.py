"""Composite destinations in our broker beyond the differential test: a SEND to
``/queue/a,/topic/t,/queue/b`` is one atomic journal record holding every copy (the
durable subscribers' too), receipted once it is durable, so a SIGKILL right after the
receipt loses no copy and a torn record loses all of them (never some); idempotency
keys count per destination, one per copy."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_helpers import tear_last_record
from hypothesis import given
from hypothesis import strategies as st

import amqtransport
from amqtransport.broker.dispatch.errors import CoreError
from amqtransport.broker.dispatch.names import send_targets, split_destination
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(120)

COMPOSITE = "/queue/ca,/topic/ct,/queue/cb"


def uri(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def durable(port: int) -> amqtransport.Connection:
    return amqtransport.connect(uri(port), client_id="comp")


def everything(port: int) -> dict[str, list[str]]:
    """What each part of COMPOSITE holds (the topic: its durable subscription's queue)."""
    out: dict[str, list[str]] = {}
    with durable(port) as c:
        for dest in ("/queue/ca", "/queue/cb", "/topic/ct"):
            sub = c.subscribe(dest, durable_name="d" if dest.startswith("/topic/") else None)
            got: list[str] = []
            while (m := sub.receive(timeout=1.0)) is not None:
                got.append(m.text)
            out[dest] = got
    return out


def test_a_receipted_composite_send_survives_kill_9(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        with durable(bp.port) as c:
            c.subscribe("/topic/ct", durable_name="d").unsubscribe()
        with amqtransport.connect(uri(bp.port)) as c:
            c.send(COMPOSITE, "m1")  # returns once its receipt is in
        bp.kill()
        bp.start()
        assert everything(bp.port) == {"/queue/ca": ["m1"], "/queue/cb": ["m1"], "/topic/ct": ["m1"]}


def test_a_torn_composite_record_takes_every_copy_or_none(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with BrokerProcess(data, log_dir=tmp_path) as bp:
        with durable(bp.port) as c:
            c.subscribe("/topic/ct", durable_name="d").unsubscribe()
        with amqtransport.connect(uri(bp.port)) as c:
            c.send(COMPOSITE, "m1")
        bp.kill()
        seg = max((data / "journal").glob("seg-*.log"))
        tear_last_record(seg, 10)  # the crash tore the record's tail
        bp.start()
        assert everything(bp.port) == {"/queue/ca": [], "/queue/cb": [], "/topic/ct": []}


def test_an_idempotency_key_counts_per_destination_one_per_copy(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        with durable(bp.port) as c:
            c.subscribe("/topic/ct", durable_name="d").unsubscribe()
        with amqtransport.connect(uri(bp.port)) as c:
            c.send("/queue/ca", "alone", idempotency_key="k1")
            c.send(COMPOSITE, "composite", idempotency_key="k1")  # /queue/ca had k1: that copy is a repeat
            c.send(COMPOSITE, "again", idempotency_key="k1")  # a resend (after a failover): all repeats
        bp.kill()
        bp.start()  # the keys are durable with their copies
        with amqtransport.connect(uri(bp.port)) as c:
            c.send(COMPOSITE, "after restart", idempotency_key="k1")
        assert everything(bp.port) == {
            "/queue/ca": ["alone"], "/queue/cb": ["composite"], "/topic/ct": ["composite"]}


@given(st.text(alphabet="/queutopi-m,ab. *>", max_size=40))
def test_composite_parsing_fuzz_refuses_with_a_core_error_or_names_concrete_destinations(text: str) -> None:
    try:
        targets = send_targets(text, ())
    except CoreError as exc:
        assert str(exc)
        return
    for dest, headers in targets:
        assert split_destination(dest)[0] in ("queue", "topic") and "," not in dest
        assert (len(targets) > 1) == any(k == "original-destination" for k, _v in headers)
