"""Soak: repeated SIGKILL/restart of the broker under a producer and a consumer.

Excluded from the default run (``-m soak`` to run it): about a minute."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import amqtransport
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = [pytest.mark.soak, pytest.mark.timeout(600)]


def test_many_kills_lose_nothing_and_show_no_duplicates(tmp_path: Path) -> None:
    kills = 8
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path / "logs") as broker:
        uri = f"failover:({broker.uri})?initialReconnectDelay=20&maxReconnectDelay=200"
        received: list[str] = []
        stop = threading.Event()
        with amqtransport.connect(uri, heartbeat=(500, 500)) as consumer, \
                amqtransport.connect(uri, heartbeat=(500, 500)) as producer:
            sub = consumer.subscribe("/queue/soak", ack="client-individual")

            def consume() -> None:
                while not stop.is_set():
                    msg = sub.receive(0.2)
                    if msg is not None:
                        received.append(msg.text)
                        msg.ack()

            def chaos() -> None:
                for _ in range(kills):
                    time.sleep(1.0)
                    broker.kill()
                    time.sleep(0.2)
                    broker.start()

            reader = threading.Thread(target=consume)
            killer = threading.Thread(target=chaos)
            reader.start()
            killer.start()
            sent = 0
            with producer.producer(window=50) as p:
                while killer.is_alive():
                    p.send("/queue/soak", f"m{sent}", idempotency_key=f"soak-{sent}")
                    sent += 1
            killer.join()
            deadline = time.monotonic() + 60
            while len(set(received)) < sent and time.monotonic() < deadline:
                time.sleep(0.1)
            stop.set()
            reader.join()
        assert sent > 1000
        assert set(received) == {f"m{i}" for i in range(sent)}
        assert len(received) == len(set(received))
