"""The pure reconnect plan (transports/reconnect.py): the schedule's attempts as
steps, the probe on every wait except the one after a failed probe-cut connect, and
which endpoints a pending connect races (those that refused in this reconnect)."""

from __future__ import annotations

import logging

import pytest

from amqtransport.backoff import Attempt, failover_schedule
from amqtransport.errors import ConnectError, ConnectRefused
from amqtransport.options import FailoverOptions
from amqtransport.transports.reconnect import ConnectPolicy, ConnectStep, ReconnectPlan


def attempts(*delays: float) -> list[Attempt[str]]:
    return [Attempt(f"e{i}", d, i + 1) for i, d in enumerate(delays)]


def test_steps_follow_the_schedule_and_probe_only_waits() -> None:
    plan = ReconnectPlan(iter(attempts(0, 0.5, 0)))
    steps = []
    while (step := plan.next_step()) is not None:
        steps.append(step)
        plan.failed()
    assert steps == [ConnectStep("e0", 0, False, 1), ConnectStep("e1", 0.5, True, 2), ConnectStep("e2", 0, False, 3)]
    assert plan.attempts == 3
    assert plan.next_step() is None


def test_a_failed_probe_cut_connect_leaves_the_next_wait_unprobed_and_only_that_one() -> None:
    plan = ReconnectPlan(iter(attempts(0.1, 0, 0.2, 0.3)))
    first = plan.next_step()
    assert first is not None and first.probe
    assert plan.cut_short("elsewhere") == "elsewhere"
    plan.failed()
    second = plan.next_step()  # no wait: nothing to probe
    assert second is not None and not second.probe
    plan.failed()
    third = plan.next_step()
    assert third is not None and third.delay == 0.2 and not third.probe
    plan.failed()  # a plain failure: the wait after it is probed again
    fourth = plan.next_step()
    assert fourth is not None and fourth.probe


def test_a_probe_cut_connect_that_succeeded_changes_nothing_and_a_plain_failure_keeps_probing() -> None:
    plan = ReconnectPlan(iter(attempts(0.1, 0.1)))
    step = plan.next_step()
    assert step is not None
    plan.failed()
    again = plan.next_step()
    assert again is not None and again.probe


def test_the_plan_walks_the_real_schedule() -> None:
    opts = FailoverOptions.model_validate({"randomize": False, "maxReconnectAttempts": 2})
    plan = ReconnectPlan(failover_schedule(["a", "b"], opts, startup=False))
    seen = []
    while (step := plan.next_step()) is not None:
        seen.append((step.endpoint, step.delay, step.probe))
        plan.failed()
    assert [s[0] for s in seen] == ["a", "b", "a", "b"]
    assert [s[2] for s in seen] == [False, False, True, False]
    assert plan.attempts == 4


def test_a_pending_connect_races_the_endpoints_that_refused_and_an_abandoned_one_counts_as_failed(
        caplog: pytest.LogCaptureFixture) -> None:
    """Pass 1: a refuses (closed port), b's CONNECT goes unanswered: a is probed beside it;
    a accepts: b's attempt failed ("abandoned"), a is connected to, one more attempt.
    That probe-chosen attempt fails its handshake: no cut for the rest of pass 1, again
    in pass 2. The order of the schedule is kept."""
    opts = FailoverOptions.model_validate({"randomize": False, "maxReconnectAttempts": 2, "initialReconnectDelay": 10})
    policy: ConnectPolicy[str] = ConnectPolicy(opts)
    policy.begin(3, failover_schedule(["a", "b", "c"], opts, startup=False), startup=False, last_error=None)
    plan = policy.plan
    assert [plan.next_step().endpoint, plan.race_targets()] == ["a", []]  # type: ignore[union-attr]
    policy.failed("tcp://a", ConnectRefused("tcp://a: connect failed: Connection refused"))
    assert [plan.next_step().endpoint, plan.race_targets()] == ["b", ["a"]]  # type: ignore[union-attr]
    caplog.set_level(logging.INFO, logger="amqtransport.transports.failover")
    assert policy.abandon("tcp://b", "a", "tcp://a") == "a"
    assert "tcp://a accepts connections while the CONNECT to tcp://b is unanswered: connecting there" in caplog.text
    assert policy.attempts == 3 and policy.failed_attempts == 2
    assert "abandoned: tcp://a accepts connections" in str(policy.last_error)
    policy.failed("tcp://a", ConnectError("tcp://a: handshake failed"))  # the chosen attempt fails
    assert [plan.next_step().endpoint, plan.race_targets()] == ["c", []]  # type: ignore[union-attr]
    policy.failed("tcp://c", ConnectRefused("tcp://c: refused"))
    step = plan.next_step()  # pass 2, after its wait
    assert step is not None and (step.endpoint, step.pass_number, step.probe) == ("a", 2, False)
    policy.failed("tcp://a", ConnectRefused("tcp://a: refused"))
    assert [plan.next_step().endpoint, plan.race_targets()] == ["b", ["c", "a"]]  # type: ignore[union-attr]


def test_probe_interval_zero_races_nothing() -> None:
    opts = FailoverOptions.model_validate({"randomize": False, "probeInterval": 0})
    policy: ConnectPolicy[str] = ConnectPolicy(opts)
    policy.begin(2, failover_schedule(["a", "b"], opts, startup=False), startup=False, last_error=None)
    policy.plan.next_step()
    policy.failed("tcp://a", ConnectRefused("refused"))
    policy.plan.next_step()
    assert policy.plan.race_targets() == []
