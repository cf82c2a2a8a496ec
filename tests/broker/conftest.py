"""Fixtures for broker tests: an in-process EmbeddedBroker per test (real sockets)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amqtransport.broker import BrokerConfig, EmbeddedBroker


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    """Factory: start a broker with config overrides; every one is stopped at teardown."""
    started: list[EmbeddedBroker] = []

    def make(
        users: dict[str, str] | None = None, data_dir: Path | None = None, **overrides: Any
    ) -> EmbeddedBroker:
        cfg = BrokerConfig(**overrides)
        b = EmbeddedBroker(
            port=0, data_dir=data_dir or tmp_path / f"broker{len(started)}", users=users, config=cfg
        )
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def broker(make_broker: Callable[..., EmbeddedBroker]) -> EmbeddedBroker:
    return make_broker()


@pytest.fixture(autouse=True)
def no_broker_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Whatever a test's clients do, the broker (in this process) must not log an error."""
    yield
    bad = [
        f"{r.name}: {r.getMessage()}"
        for r in [*caplog.get_records("call"), *caplog.get_records("teardown")]
        if r.levelno >= logging.ERROR and r.name.startswith(("amqtransport.broker", "asyncio"))
    ]
    assert bad == [], bad
