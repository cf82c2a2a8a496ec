"""The pure reconnect plan (transports/reconnect.py): the schedule's attempts as
steps, the probe on every wait except the one after a failed probe-cut connect."""

from __future__ import annotations

from amqtransport.backoff import Attempt, failover_schedule
from amqtransport.options import FailoverOptions
from amqtransport.transports.reconnect import ConnectStep, ReconnectPlan


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
