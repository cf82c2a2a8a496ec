"""The pure reconnect schedules: exact sequences, limits, ordering, jitter."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.backoff import (
    Attempt,
    describe_failover,
    describe_static,
    failed_last,
    failover_delay_ms,
    failover_schedule,
    pass_limit,
    static_delays,
)
from amqtransport.options import FailoverOptions, StaticOptions
from amqtransport.uri import CompositeUri, parse_uri

EPS = ["tcp://a:1", "tcp://b:2", "tcp://c:3"]


def take(it: object, n: int) -> list[Attempt[str]]:
    return list(itertools.islice(it, n))  # type: ignore[call-overload]


def opts(**kw: object) -> FailoverOptions:
    return FailoverOptions.model_validate(kw)


def pass_delays(options: FailoverOptions, passes: int) -> list[float]:
    """Delay (ms) of the first attempt of each pass."""
    schedule = failover_schedule(["x"], options, startup=False)
    return [round(a.delay * 1000, 6) for a in take(schedule, passes)]


def test_default_exponential_sequence_capped() -> None:
    assert pass_delays(FailoverOptions(), 16) == [
        0, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240, 20480, 30000, 30000, 30000,
    ]


def test_exponent_and_cap() -> None:
    o = opts(initialReconnectDelay=100, maxReconnectDelay=1000, reconnectDelayExponent=3)
    assert pass_delays(o, 6) == [0, 100, 300, 900, 1000, 1000]
    o = opts(initialReconnectDelay=100, maxReconnectDelay=1000, backOffMultiplier=1.5)
    assert pass_delays(o, 5) == [0, 100, 150, 225, 337.5]


def test_constant_without_exponential_backoff() -> None:
    o = opts(useExponentialBackOff=False, initialReconnectDelay=250)
    assert pass_delays(o, 6) == [0, 250, 250, 250, 250, 250]


def test_huge_pass_numbers_do_not_overflow() -> None:
    assert failover_delay_ms(FailoverOptions(), 10**6) == 30000
    assert failover_delay_ms(opts(reconnectDelayExponent=1000), 5000) == 30000


def test_no_delay_inside_a_pass_and_every_endpoint_once_per_pass() -> None:
    o = opts(randomize=False, maxReconnectAttempts=3)
    got = list(failover_schedule(EPS, o, startup=False))
    assert [(a.endpoint, round(a.delay, 6), a.pass_number) for a in got] == [
        ("tcp://a:1", 0.0, 1), ("tcp://b:2", 0.0, 1), ("tcp://c:3", 0.0, 1),
        ("tcp://a:1", 0.01, 2), ("tcp://b:2", 0.0, 2), ("tcp://c:3", 0.0, 2),
        ("tcp://a:1", 0.02, 3), ("tcp://b:2", 0.0, 3), ("tcp://c:3", 0.0, 3),
    ]


@pytest.mark.parametrize(
    ("max_attempts", "startup_max", "startup", "passes"),
    [
        (0, -1, False, 1),
        (0, -1, True, 1),
        (1, -1, False, 1),
        (4, -1, False, 4),
        (4, -1, True, 4),
        (4, 2, True, 2),
        (4, 2, False, 4),
        (-1, 3, True, 3),
        (0, 5, True, 5),
        (5, 0, True, 1),
    ],
)
def test_attempt_limits(max_attempts: int, startup_max: int, startup: bool, passes: int) -> None:
    o = opts(maxReconnectAttempts=max_attempts, startupMaxReconnectAttempts=startup_max, randomize=False)
    got = list(failover_schedule(EPS[:2], o, startup=startup))
    assert len(got) == 2 * passes
    assert got[-1].pass_number == passes
    assert pass_limit(o, startup=startup) == passes


def test_unlimited_goes_on() -> None:
    o = opts(maxReconnectAttempts=-1)
    got = take(failover_schedule(EPS, o, startup=False), 3 * 1000)
    assert len(got) == 3000 and got[-1].pass_number == 1000
    assert pass_limit(o, startup=False) is None
    assert pass_limit(opts(startupMaxReconnectAttempts=-1), startup=True) is None


def test_empty_endpoint_list_ends_at_once() -> None:
    assert list(failover_schedule([], FailoverOptions(), startup=False)) == []


def test_randomize_shuffles_each_pass_reproducibly_with_a_seed() -> None:
    o = opts(maxReconnectAttempts=50)
    eps = [f"tcp://h{i}:1" for i in range(6)]
    a = list(failover_schedule(eps, o, startup=False, rng=random.Random(7)))
    b = list(failover_schedule(eps, o, startup=False, rng=random.Random(7)))
    assert a == b
    orders = set()
    for n in range(1, 51):
        this_pass = [x.endpoint for x in a if x.pass_number == n]
        assert sorted(this_pass) == sorted(eps)  # every endpoint exactly once per pass
        orders.add(tuple(this_pass))
    assert len(orders) > 10  # really shuffled, and per pass


def test_no_randomize_keeps_order() -> None:
    o = opts(randomize=False, maxReconnectAttempts=5)
    for n, group in itertools.groupby(failover_schedule(EPS, o, startup=False), key=lambda a: a.pass_number):
        assert [a.endpoint for a in group] == EPS, n


def test_priority_backup_puts_the_first_uri_first_even_when_randomized() -> None:
    o = opts(priorityBackup=True, maxReconnectAttempts=30)
    got = list(failover_schedule(EPS, o, startup=False, rng=random.Random(1)))
    firsts = [a.endpoint for a in got if a.delay > 0 or a.pass_number == 1][:1]
    assert firsts == ["tcp://a:1"]
    for n in range(1, 31):
        this_pass = [a.endpoint for a in got if a.pass_number == n]
        assert this_pass[0] == "tcp://a:1"
        assert sorted(this_pass) == sorted(EPS)
    rest_orders = {tuple(a.endpoint for a in got if a.pass_number == n)[1:] for n in range(1, 31)}
    assert len(rest_orders) == 2  # the others are still shuffled


def test_priority_uris_order_and_normalisation() -> None:
    node = parse_uri(
        "failover:(tcp://a:1,tcp://b:2,tcp://c:3)?priorityBackup=true&priorityURIs=stomp://c:3,tcp://b:2&randomize=false"
    )
    assert isinstance(node, CompositeUri) and isinstance(node.options, FailoverOptions)
    leaves = list(node.leaves())
    got = take(failover_schedule(leaves, node.options, startup=True), 3)
    assert [a.endpoint.address for a in got] == ["tcp://c:3", "tcp://b:2", "tcp://a:1"]
    # plain strings as endpoints work too
    o = FailoverOptions(priority_backup=True, priority_uris=("stomp://c:3",), randomize=False)
    assert [a.endpoint for a in take(failover_schedule(EPS, o, startup=False), 3)] == [
        "tcp://c:3", "tcp://a:1", "tcp://b:2",
    ]


def test_priority_uris_without_priority_backup_change_nothing() -> None:
    o = FailoverOptions(priority_uris=("tcp://c:3",), randomize=False)
    assert [a.endpoint for a in take(failover_schedule(EPS, o, startup=False), 3)] == EPS


def test_jitter_bounds_and_reproducibility() -> None:
    o = opts(reconnectJitter=0.5, randomize=False, initialReconnectDelay=100, maxReconnectDelay=800)
    rng = random.Random(3)
    got = [a for a in take(failover_schedule(["x"], o, startup=False, rng=rng), 400)]
    assert got[0].delay == 0
    seen_extra = []
    for a in got[1:]:
        base = failover_delay_ms(o, a.pass_number - 1) / 1000
        assert base <= a.delay <= base * 1.5
        seen_extra.append((a.delay - base) / base)
    assert min(seen_extra) < 0.05 and max(seen_extra) > 0.45  # spread over the range
    again = [a for a in take(failover_schedule(["x"], o, startup=False, rng=random.Random(3)), 400)]
    assert again == got


def test_zero_jitter_is_exact() -> None:
    got = take(failover_schedule(["x"], FailoverOptions(), startup=False, rng=random.Random(1)), 4)
    assert [a.delay for a in got] == [0.0, 0.01, 0.02, 0.04]


def test_equal_endpoints_each_keep_their_slot() -> None:
    o = opts(priorityBackup=True, maxReconnectAttempts=20)
    eps = ["tcp://a:1", "tcp://a:1", "tcp://b:2"]
    got = list(failover_schedule(eps, o, startup=False, rng=random.Random(5)))
    for n in range(1, 21):
        this_pass = [a.endpoint for a in got if a.pass_number == n]
        assert sorted(this_pass) == sorted(eps)
        assert this_pass[0] == "tcp://a:1"
    o = FailoverOptions(priority_backup=True, priority_uris=("tcp://a:1",), max_reconnect_attempts=3)
    got = list(failover_schedule(eps, o, startup=False, rng=random.Random(5)))
    for n in range(1, 4):
        this_pass = [a.endpoint for a in got if a.pass_number == n]
        assert this_pass == ["tcp://a:1", "tcp://a:1", "tcp://b:2"]


def test_unhashable_endpoints() -> None:
    eps = [{"h": 1}, {"h": 2}]
    o = opts(priorityBackup=True, maxReconnectAttempts=2)
    got = list(failover_schedule(eps, o, startup=False, rng=random.Random(0)))
    assert [a.endpoint for a in got][::2] == [{"h": 1}, {"h": 1}]
    assert len(got) == 4


def test_endpoints_of_any_type() -> None:
    o = opts(randomize=False, maxReconnectAttempts=2)
    got = list(failover_schedule([1, 2], o, startup=False))
    assert [a.endpoint for a in got] == [1, 2, 1, 2]


# ---------------------------------------------------------------- static
def test_static_delays_default() -> None:
    assert list(itertools.islice(static_delays(StaticOptions()), 8)) == [1, 2, 4, 8, 16, 30, 30, 30]


def test_static_delays_options() -> None:
    o = StaticOptions.model_validate(
        {"initialReconnectDelay": 100, "maxReconnectDelay": 1000, "backOffMultiplier": 3, "maxReconnectAttempts": 4}
    )
    assert list(static_delays(o)) == [0.1, 0.3, 0.9, 1.0]
    const = StaticOptions(use_exponential_backoff=False, initial_reconnect_delay=50)
    assert list(itertools.islice(static_delays(const), 4)) == [0.05] * 4
    unlimited = list(itertools.islice(static_delays(StaticOptions()), 10_000))
    assert len(unlimited) == 10_000


def test_descriptions() -> None:
    assert describe_failover(FailoverOptions()) == (
        "reconnect delays: 0 (pass 1), 10 ms, 20 ms, 40 ms, 80 ms, 160 ms, ... capped at 30000 ms; "
        "attempts: unlimited; a TCP probe every 100 ms cuts a wait or an unanswered CONNECT short (probeInterval)"
    )
    assert describe_failover(opts(probeInterval=0)).endswith("; no probe while waiting (probeInterval=0)")
    assert "one pass" in describe_failover(FailoverOptions(max_reconnect_attempts=0))
    text = describe_failover(opts(maxReconnectAttempts=3, startupMaxReconnectAttempts=7))
    assert text.startswith("reconnect delays: 0 (pass 1), 10 ms, 20 ms;")
    assert "3 passes" in text and "7 passes" in text
    assert describe_static(StaticOptions()).startswith(
        "re-add delays after a failure: 1000 ms, 2000 ms, 4000 ms, 8000 ms, 16000 ms, ... capped at 30000 ms; attempts: unlimited"
    )


# ---------------------------------------------------------------- properties
@st.composite
def failover_opts(draw: st.DrawFn) -> FailoverOptions:
    return FailoverOptions(
        initial_reconnect_delay=draw(st.integers(0, 10**6)),
        max_reconnect_delay=draw(st.integers(0, 10**7)),
        use_exponential_backoff=draw(st.booleans()),
        reconnect_delay_exponent=draw(st.floats(1.0, 100.0)),
        max_reconnect_attempts=draw(st.integers(-1, 6)),
        startup_max_reconnect_attempts=draw(st.integers(-1, 6)),
        randomize=draw(st.booleans()),
        priority_backup=draw(st.booleans()),
        reconnect_jitter=draw(st.floats(0.0, 1.0)),
    )


@settings(max_examples=300, deadline=None)
@given(failover_opts(), st.integers(1, 5), st.booleans(), st.integers(0, 2**32))
def test_schedule_invariants(o: FailoverOptions, n: int, startup: bool, seed: int) -> None:
    eps = [f"tcp://h{i}:1" for i in range(n)]
    got = take(failover_schedule(eps, o, startup=startup, rng=random.Random(seed)), 8 * n)
    limit = pass_limit(o, startup=startup)
    passes = sorted({a.pass_number for a in got})
    assert passes == list(range(1, len(passes) + 1))
    if limit is not None:
        assert len(got) == n * min(limit, 8)
    previous = 0.0
    for p in passes:
        this_pass = [a for a in got if a.pass_number == p]
        assert sorted(a.endpoint for a in this_pass) == eps  # every endpoint once per pass
        assert all(a.delay == 0 for a in this_pass[1:])  # no delay inside a pass
        if o.priority_backup:
            assert this_pass[0].endpoint == eps[0]
        if not o.randomize:
            assert [a.endpoint for a in this_pass][1 if o.priority_backup else 0 :] == [
                e for e in eps if not (o.priority_backup and e == eps[0])
            ]
        if p == 1:
            assert this_pass[0].delay == 0
            continue
        base = failover_delay_ms(o, p - 1) / 1000
        assert base <= this_pass[0].delay <= base * (1 + o.reconnect_jitter) + 1e-9
        if o.use_exponential_backoff:
            assert base <= o.max_reconnect_delay / 1000 + 1e-9
            assert base >= previous - 1e-9  # never shrinks
        previous = base


def test_failed_last_puts_the_lost_broker_at_the_end_of_every_pass() -> None:
    schedule = failed_last(failover_schedule(EPS, opts(randomize=False, initialReconnectDelay=10), startup=False),
                           "tcp://a:1")
    got = take(schedule, 6)
    assert [a.endpoint for a in got] == ["tcp://b:2", "tcp://c:3", "tcp://a:1"] * 2
    assert [a.delay for a in got] == [0.0, 0.0, 0.0, 0.01, 0.0, 0.0]  # the pass's delay stays first
    assert [a.pass_number for a in got] == [1, 1, 1, 2, 2, 2]


def test_failed_last_without_a_lost_broker_or_with_an_unknown_one_changes_nothing() -> None:
    plain = take(failover_schedule(EPS, opts(randomize=False), startup=False), 6)
    assert take(failed_last(failover_schedule(EPS, opts(randomize=False), startup=False), None), 6) == plain
    assert take(failed_last(failover_schedule(EPS, opts(randomize=False), startup=False), "tcp://z:9"), 6) == plain


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), failed=st.sampled_from(EPS), passes=st.integers(1, 4))
def test_failed_last_keeps_each_shuffled_pass_with_the_lost_broker_last(seed: int, failed: str, passes: int) -> None:
    options = opts(randomize=True, maxReconnectAttempts=passes)
    before = list(failover_schedule(EPS, options, startup=False, rng=random.Random(seed)))
    after = list(failed_last(failover_schedule(EPS, options, startup=False, rng=random.Random(seed)), failed))
    assert len(after) == len(before) == 3 * passes
    for n in range(passes):
        got, was = after[3 * n:3 * n + 3], before[3 * n:3 * n + 3]
        assert got[-1].endpoint == failed
        assert [a.endpoint for a in got[:-1]] == [a.endpoint for a in was if a.endpoint != failed]
        assert [a.delay for a in got] == [was[0].delay, 0.0, 0.0]
