"""static: discovery agent (injected sleep and clock) and the masterslave desugaring."""

from __future__ import annotations

import threading
import time

import pytest

import amqtransport
from amqtransport._backends.memory import MemoryBackend
from amqtransport.errors import UriError
from amqtransport.options import StaticOptions
from amqtransport.transports.discovery import StaticDiscoveryAgent, services_of

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Events:
    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[str] = []
        self.cond = threading.Condition()

    def on_service_added(self, service: str) -> None:
        with self.cond:
            self.added.append(service)
            self.cond.notify_all()

    def on_service_removed(self, service: str) -> None:
        self.removed.append(service)

    def wait_added(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.added) >= n, timeout=5), self.added


def test_services_of_static_and_masterslave() -> None:
    services, opts = services_of("static:(tcp://a:1,tcp://b:2)?initialReconnectDelay=5")
    assert services == ["tcp://a:1", "tcp://b:2"] and opts.initial_reconnect_delay == 5
    services, opts = services_of("masterslave:(tcp://a:1,tcp://b:2)")
    assert len(services) == 1
    inner = amqtransport.parse_uri(services[0])
    assert inner.scheme == "failover"  # type: ignore[union-attr]
    assert inner.options.randomize is False and inner.options.max_reconnect_attempts == 0  # type: ignore[union-attr]
    assert [leaf.address for leaf in inner.leaves()] == ["tcp://a:1", "tcp://b:2"]
    assert opts == StaticOptions.model_validate({})


def test_agent_announces_then_backs_off_and_resets_after_min_connect_time() -> None:
    clock = FakeClock()
    sleeps: list[float] = []
    events = Events()
    opts = StaticOptions.model_validate({"initialReconnectDelay": 100, "maxReconnectDelay": 500,
                                         "minConnectTime": 5000})
    agent = StaticDiscoveryAgent(["svc-a", "svc-b"], opts, events, sleep=sleeps.append, clock=clock)
    agent.start()
    events.wait_added(2)
    assert events.added == ["svc-a", "svc-b"]
    # svc-a fails right after each add: connect failures, the delay grows and caps
    for n in range(5):
        clock.now += 0.5
        agent.service_failed("svc-a", RuntimeError("refused"))
        events.wait_added(3 + n)
    assert [d for s, d in agent.delays] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert events.removed == ["svc-a"] * 5
    # it stays up longer than minConnectTime: the next failure resets the delay
    clock.now += 6.0
    agent.service_failed("svc-a", RuntimeError("lost"))
    events.wait_added(8)
    assert agent.delays[-1] == ("svc-a", 0.1)
    assert sleeps == [0.1, 0.2, 0.4, 0.5, 0.5, 0.1]
    agent.stop()


def test_agent_gives_up_after_max_reconnect_attempts() -> None:
    clock = FakeClock()
    events = Events()
    opts = StaticOptions.model_validate({"initialReconnectDelay": 10, "maxReconnectAttempts": 2})
    agent = StaticDiscoveryAgent(["svc"], opts, events, sleep=lambda s: None, clock=clock)
    agent.start()
    events.wait_added(1)
    agent.service_failed("svc")
    events.wait_added(2)
    agent.service_failed("svc")
    events.wait_added(3)
    agent.service_failed("svc")
    time.sleep(0.05)
    assert len(events.added) == 3
    agent.stop()


def test_raising_listener_does_not_stop_the_agent() -> None:
    class Bad:
        def __init__(self) -> None:
            self.calls = 0

        def on_service_added(self, service: str) -> None:
            self.calls += 1
            raise RuntimeError("user bug")

    bad = Bad()
    agent = StaticDiscoveryAgent(["x", "y"], StaticOptions.model_validate({}), bad, sleep=lambda s: None)
    agent.start()
    deadline = time.monotonic() + 5
    while bad.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    agent.service_failed("x")
    while bad.calls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bad.calls == 3
    agent.stop()


def test_masterslave_client_connection_uses_static_backoff_between_passes() -> None:
    backend = MemoryBackend()
    a, b = backend.add("a:1"), backend.add("b:2")
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 3:
            b.up = True

    class L:
        def __init__(self) -> None:
            self.resumed = threading.Event()

        def on_resumed(self, address: str) -> None:
            self.resumed.set()

    listener = L()
    with amqtransport.connect("masterslave:(tcp://a:1,tcp://b:2)", backend=backend, sleep=sleep,
                              listener=listener) as conn:
        assert conn.connected_uri == "tcp://a:1"
        a.up = b.up = False
        a.drop()
        assert listener.resumed.wait(5)
        assert conn.connected_uri == "tcp://b:2"
    # one pass without delay, then 1 s, 2 s, 4 s (static defaults), never randomized
    assert sleeps == [1.0, 2.0, 4.0]
    assert backend.connect_log == ["a:1"] + ["a:1", "b:2"] * 3 + ["a:1", "b:2"]


def test_static_with_several_services_is_rejected_for_a_client() -> None:
    with pytest.raises(UriError, match="several static services"):
        amqtransport.connect("static:(tcp://a:1,tcp://b:2)", backend=MemoryBackend())
