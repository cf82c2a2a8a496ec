"""The option models: names, defaults, strict values, frozen, unknown keys rejected."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from amqtransport.options import (
    SSL_ONLY_OPTIONS,
    FailoverOptions,
    LeafOptions,
    StaticOptions,
    activemq_name,
    option_names,
)


def test_defaults_are_activemqs() -> None:
    f = FailoverOptions()
    assert (f.initial_reconnect_delay, f.max_reconnect_delay, f.use_exponential_backoff) == (10, 30000, True)
    assert (f.reconnect_delay_exponent, f.max_reconnect_attempts, f.startup_max_reconnect_attempts) == (2.0, -1, -1)
    assert (f.randomize, f.timeout, f.priority_backup, f.priority_uris) == (True, -1, False, ())
    assert (f.backup, f.backup_pool_size, f.track_messages, f.max_cache_size) == (False, 1, False, 131072)
    assert (f.warn_after_reconnect_attempts, f.update_uris_url, f.reconnect_jitter) == (10, None, 0.0)
    s = StaticOptions()
    assert (s.initial_reconnect_delay, s.max_reconnect_delay, s.use_exponential_backoff) == (1000, 30000, True)
    assert (s.backoff_multiplier, s.max_reconnect_attempts, s.min_connect_time) == (2, 0, 5000)
    leaf = LeafOptions()
    assert (leaf.connect_timeout, leaf.heart_beat, leaf.heartbeat, leaf.host, leaf.verify) == (
        10000, "10000,10000", (10000, 10000), None, True,
    )


def test_both_spellings_and_the_alias() -> None:
    assert FailoverOptions(initial_reconnect_delay=5) == FailoverOptions.model_validate({"initialReconnectDelay": 5})
    assert FailoverOptions.model_validate({"backOffMultiplier": "3"}).reconnect_delay_exponent == 3.0
    assert FailoverOptions.model_validate({"reconnect_delay_exponent": 3}).reconnect_delay_exponent == 3.0
    assert StaticOptions.model_validate({"backOffMultiplier": "4"}).backoff_multiplier == 4
    assert StaticOptions(backoff_multiplier=4) == StaticOptions.model_validate({"backOffMultiplier": 4})
    assert LeafOptions.model_validate({"serverHostname": "x"}).server_hostname == "x"


def test_activemq_names() -> None:
    assert activemq_name(FailoverOptions, "use_exponential_backoff") == "useExponentialBackOff"
    assert activemq_name(FailoverOptions, "priority_uris") == "priorityURIs"
    assert activemq_name(FailoverOptions, "update_uris_url") == "updateURIsURL"
    assert option_names(FailoverOptions)["backOffMultiplier"] == "reconnect_delay_exponent"
    assert set(option_names(LeafOptions)) >= SSL_ONLY_OPTIONS
    assert list(StaticOptions().effective()) == [
        "initialReconnectDelay", "maxReconnectDelay", "useExponentialBackOff",
        "backOffMultiplier", "maxReconnectAttempts", "minConnectTime",
    ]


def test_frozen_and_unknown_keys_rejected() -> None:
    f = FailoverOptions()
    with pytest.raises(ValidationError):
        f.randomize = False  # type: ignore[misc]
    with pytest.raises(ValidationError):
        FailoverOptions.model_validate({"bogus": 1})
    with pytest.raises(ValidationError):
        StaticOptions.model_validate({"randomize": True})
    with pytest.raises(ValidationError):
        LeafOptions.model_validate({"connect_timout": 1})
    assert hash(f) == hash(FailoverOptions())


@pytest.mark.parametrize("value", ["true", "TRUE", "True", " true ", True])
def test_bool_true(value: object) -> None:
    assert FailoverOptions.model_validate({"randomize": value}).randomize is True


@pytest.mark.parametrize("value", ["false", "FALSE", "False", False])
def test_bool_false(value: object) -> None:
    assert FailoverOptions.model_validate({"randomize": value}).randomize is False


@pytest.mark.parametrize("value", ["yes", "no", "1", "0", "on", "off", "t", "", 1, 0, None, 1.0])
def test_bool_rejects_everything_else(value: object) -> None:
    with pytest.raises(ValidationError):
        FailoverOptions.model_validate({"randomize": value})


@pytest.mark.parametrize("value", ["1.5", "1e3", "", "ten", True, 1.0, "0x10", "1" * 19])
def test_int_is_strict(value: object) -> None:
    with pytest.raises(ValidationError):
        FailoverOptions.model_validate({"initialReconnectDelay": value})


@pytest.mark.parametrize(("value", "expected"), [("5", 5), (" 7 ", 7), ("+3", 3), (9, 9), ("0", 0)])
def test_int_accepts(value: object, expected: int) -> None:
    assert FailoverOptions.model_validate({"initialReconnectDelay": value}).initial_reconnect_delay == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("initialReconnectDelay", -1), ("maxReconnectDelay", -1), ("maxReconnectAttempts", -2),
        ("startupMaxReconnectAttempts", -2), ("timeout", -2), ("backupPoolSize", -1),
        ("maxCacheSize", -1), ("warnAfterReconnectAttempts", -1), ("reconnectJitter", 1.01),
        ("reconnectJitter", -0.01), ("reconnectDelayExponent", 0.99), ("reconnectDelayExponent", "inf"),
        ("reconnectJitter", "nan"), ("updateURIsURL", ""), ("updateURIsURL", "a\nb"),
        ("priorityURIs", 5), ("priorityURIs", [1]),
    ],
)
def test_failover_ranges(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        FailoverOptions.model_validate({field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [("initialReconnectDelay", -1), ("backOffMultiplier", 0), ("backOffMultiplier", "2.5"),
     ("maxReconnectAttempts", "x"), ("minConnectTime", -1)],
)
def test_static_ranges(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        StaticOptions.model_validate({field: value})


@pytest.mark.parametrize(("value", "expected"), [("1,2", "1,2"), (" 0 , 0 ", "0,0"), ((5, 6), "5,6"), ("007,1", "7,1")])
def test_heartbeat_normalised(value: object, expected: str) -> None:
    assert LeafOptions.model_validate({"heartBeat": value}).heart_beat == expected


@pytest.mark.parametrize("value", ["1", "1,2,3", "-1,2", "a,b", "", 5, "1;2"])
def test_heartbeat_rejected(value: object) -> None:
    with pytest.raises(ValidationError):
        LeafOptions.model_validate({"heartBeat": value})


def test_priority_uris_comma_list() -> None:
    f = FailoverOptions.model_validate({"priorityURIs": " tcp://a:1 ,, tcp://b:2,"})
    assert f.priority_uris == ("tcp://a:1", "tcp://b:2")
    assert FailoverOptions(priority_uris=("tcp://a:1",)).priority_uris == ("tcp://a:1",)


def test_given_effective_non_default() -> None:
    f = FailoverOptions.model_validate({"randomize": "true", "timeout": "5", "priorityURIs": "tcp://a:1"})
    assert f.given() == {"randomize": True, "timeout": 5, "priorityURIs": ("tcp://a:1",)}
    assert f.non_default() == {"timeout", "priorityURIs"}  # randomize=true is the default
    eff = f.effective()
    assert eff["priorityURIs"] == ["tcp://a:1"] and eff["timeout"] == 5 and len(eff) == 18
