"""The URI grammar: every form of docs/uris.md's "Grammar", desugaring and errors."""

from __future__ import annotations

import pytest

from amqtransport.errors import UriError
from amqtransport.options import FailoverOptions, LeafOptions, StaticOptions
from amqtransport.uri import CompositeUri, LeafUri, parse_uri


def leaf(scheme: str, host: str, port: int, **options: object) -> LeafUri:
    return LeafUri(scheme, host, port, None, LeafOptions.model_validate(options))


def err(text: str) -> UriError:
    with pytest.raises(UriError) as info:
        parse_uri(text)
    assert isinstance(info.value, ValueError)
    return info.value


# ---------------------------------------------------------------- leaves
@pytest.mark.parametrize(
    ("text", "scheme", "host", "port"),
    [
        ("tcp://a:1", "tcp", "a", 1),
        ("tcp://a", "tcp", "a", 61613),
        ("tcp://a:", "tcp", "a", 61613),
        ("stomp://h.example.com:61614", "tcp", "h.example.com", 61614),
        ("ssl://h", "ssl", "h", 61612),
        ("stomp+ssl://h:9", "ssl", "h", 9),
        ("STOMP+SSL://h:9", "ssl", "h", 9),
        ("tcp://10.0.0.1:61613", "tcp", "10.0.0.1", 61613),
        ("tcp://[::1]:61613", "tcp", "::1", 61613),
        ("tcp://[2001:db8::1]", "tcp", "2001:db8::1", 61613),
        ("tcp://Broker2Master:61616", "tcp", "broker2master", 61616),
        ("tcp://a:1/", "tcp", "a", 1),
        ("  tcp://a:1  ", "tcp", "a", 1),
        ("tcp://a_b-c:65535", "tcp", "a_b-c", 65535),
    ],
)
def test_leaf_forms(text: str, scheme: str, host: str, port: int) -> None:
    node = parse_uri(text)
    assert node == LeafUri(scheme, host, port)
    assert node.name is None


def test_leaf_address_and_str() -> None:
    node = parse_uri("stomp://[::1]:5?connectTimeout=100")
    assert isinstance(node, LeafUri)
    assert node.address == "tcp://[::1]:5"
    assert str(node) == "tcp://[::1]:5?connectTimeout=100"
    assert node.options.connect_timeout == 100


def test_vm_leaf() -> None:
    node = parse_uri("vm://Embedded-1?heartBeat=0,0")
    assert isinstance(node, LeafUri)
    assert (node.scheme, node.host, node.port, node.name) == ("vm", "", 0, "Embedded-1")
    assert node.options.heartbeat == (0, 0)
    assert node.address == "vm://Embedded-1"
    assert node.to_json() == {"scheme": "vm", "name": "Embedded-1", "options": {"heartBeat": "0,0"}}


def test_leaf_options_all() -> None:
    node = parse_uri(
        "ssl://h:1?connectTimeout=5&heartBeat=1,%202&host=%2Fvhost&caFile=/a%20b/ca.pem"
        "&certFile=c&keyFile=k&verify=FALSE&serverHostname=broker.example"
    )
    assert isinstance(node, LeafUri)
    o = node.options
    assert o.connect_timeout == 5
    assert o.heart_beat == "1,2" and o.heartbeat == (1, 2)
    assert o.host == "/vhost"
    assert o.ca_file == "/a b/ca.pem"
    assert (o.cert_file, o.key_file, o.verify, o.server_hostname) == ("c", "k", False, "broker.example")


def test_leaf_json_lists_only_given_options() -> None:
    node = parse_uri("tcp://a:1?connectTimeout=10000")
    assert node.to_json() == {"scheme": "tcp", "host": "a", "port": 1, "options": {"connectTimeout": 10000}}
    assert parse_uri("tcp://a:1").to_json() == {"scheme": "tcp", "host": "a", "port": 1, "options": {}}


# ---------------------------------------------------------------- composites
def test_failover_parenthesised() -> None:
    node = parse_uri("failover:(tcp://a:1,tcp://b:2)?randomize=false&initialReconnectDelay=5")
    assert isinstance(node, CompositeUri)
    assert node.scheme == "failover"
    assert node.components == (leaf("tcp", "a", 1), leaf("tcp", "b", 2))
    assert isinstance(node.options, FailoverOptions)
    assert node.options.randomize is False
    assert node.options.initial_reconnect_delay == 5
    assert node.options.max_reconnect_delay == 30000


def test_failover_slashes_and_spaces() -> None:
    a = parse_uri("failover://( tcp://a:1 , tcp://b:2 ) ?randomize=false")
    b = parse_uri("failover:(tcp://a:1,tcp://b:2)?randomize=false")
    assert a == b


def test_failover_without_parentheses_options_belong_to_the_failover() -> None:
    node = parse_uri("failover:tcp://a:1,tcp://b:2?randomize=false")
    assert node == parse_uri("failover:(tcp://a:1,tcp://b:2)?randomize=false")
    single = parse_uri("failover:tcp://a:1?maxReconnectAttempts=3")
    assert isinstance(single, CompositeUri)
    assert single.options.max_reconnect_attempts == 3
    assert single.components == (leaf("tcp", "a", 1),)


def test_failover_without_parentheses_leaf_options_on_earlier_leaves() -> None:
    node = parse_uri("failover:tcp://a:1?connectTimeout=7,tcp://b:2?randomize=false")
    assert isinstance(node, CompositeUri)
    assert node.components[0] == leaf("tcp", "a", 1, connectTimeout=7)
    assert node.options.randomize is False


def test_failover_without_parentheses_leaf_options_at_end_are_the_last_uris() -> None:
    # as in ActiveMQ (URISupport.parseComposite): only broker options -> the last broker URI's
    node = parse_uri("failover:tcp://a:1,tcp://b:2?connectTimeout=5&soTimeout=100")
    assert str(node) == "failover:(tcp://a:1,tcp://b:2?connectTimeout=5&soTimeout=100)"
    # failover options (or a mix) stay the failover's: a broker option among them is an error
    e = err("failover:tcp://a:1?randomize=false&connectTimeout=5")
    assert e.option == "connectTimeout"
    assert "failover:(" in str(e)


def test_whitespace_and_newlines_between_elements() -> None:
    text = "failover:(\n  tcp://a:1,\n\ttcp://b:2\n)\n?randomize=false&\n maxReconnectAttempts=3\n"
    assert parse_uri(text) == parse_uri("failover:(tcp://a:1,tcp://b:2)?randomize=false&maxReconnectAttempts=3")
    e = err("failover:(tcp://a:1,tcp://b\n:2)")
    assert "column" in str(e) and "\n" not in str(e)


def test_ipv6_zone() -> None:
    a = parse_uri("tcp://[fe80::1%25eth0]:1")
    assert a == parse_uri("tcp://[FE80::1%eth0]:1")
    assert isinstance(a, LeafUri) and a.host == "fe80::1%eth0"
    assert str(a) == "tcp://[fe80::1%eth0]:1"
    assert "zone" in str(err("tcp://[fe80::1%e(t)h]:1"))


def test_static_and_masterslave_without_parentheses() -> None:
    assert parse_uri("static:tcp://a:1,tcp://b:2?minConnectTime=1") == parse_uri(
        "static:(tcp://a:1,tcp://b:2)?minConnectTime=1"
    )
    assert parse_uri("masterslave:tcp://a:1,tcp://b:2") == parse_uri("masterslave:(tcp://a:1,tcp://b:2)")


def test_priority_uris_inside_a_list_need_encoded_commas() -> None:
    e = err("static:(failover:(tcp://a:1,tcp://b:2)?priorityURIs=tcp://a:1,tcp://b:2)")
    assert e.option == "priorityURIs" and "%2C" in str(e)
    node = parse_uri("static:(failover:(tcp://a:1,tcp://b:2)?priorityURIs=tcp://a:1%2Ctcp://b:2)")
    inner = node.components[0]  # type: ignore[union-attr]
    assert inner.options.priority_uris == ("tcp://a:1", "tcp://b:2")  # type: ignore[union-attr]
    # the canonical form never trips over it
    assert parse_uri(str(node)) == node
    # priorityURIs as the only option, and a broker URI after the failover in the list
    lone = parse_uri("static:(failover:(tcp://a:1,tcp://b:2)?priorityURIs=tcp://b:2&randomize=true,tcp://c:3)")
    assert str(lone) == "static:(failover:(tcp://a:1,tcp://b:2)?priorityURIs=tcp://b:2&randomize=true,tcp://c:3)"
    assert parse_uri(str(lone)) == lone
    e = err("static:(failover:(tcp://a:1,tcp://b:2)?priorityURIs=tcp://b:2,tcp://c:3)")
    assert e.option == "priorityURIs"
    assert "%2C" in str(node)


def test_static() -> None:
    node = parse_uri("static:(tcp://a:1,tcp://b:2)?initialReconnectDelay=5&backOffMultiplier=3")
    assert isinstance(node, CompositeUri) and isinstance(node.options, StaticOptions)
    assert node.scheme == "static"
    assert node.options.initial_reconnect_delay == 5
    assert node.options.backoff_multiplier == 3
    assert node.options.max_reconnect_attempts == 0
    assert node.options.min_connect_time == 5000


def test_prefix_chain_options_belong_to_the_inner_failover() -> None:
    text = "static:failover:(tcp://a:1,tcp://b:2)?randomize=false&maxReconnectAttempts=0"
    node = parse_uri(text)
    assert node == parse_uri(
        "static:(failover:(tcp://a:1,tcp://b:2)?randomize=false&maxReconnectAttempts=0)"
    )
    assert isinstance(node, CompositeUri)
    assert node.options == StaticOptions()
    inner = node.components[0]
    assert isinstance(inner, CompositeUri) and isinstance(inner.options, FailoverOptions)
    assert inner.options.randomize is False
    assert inner.options.max_reconnect_attempts == 0


def test_masterslave_desugars_exactly() -> None:
    node = parse_uri("masterslave:(tcp://a:61613,tcp://b:61613)")
    expected = parse_uri("static:(failover:(tcp://a:61613,tcp://b:61613)?randomize=false&maxReconnectAttempts=0)")
    assert node == expected
    assert str(node) == "static:(failover:(tcp://a:61613,tcp://b:61613)?randomize=false&maxReconnectAttempts=0)"
    assert isinstance(node, CompositeUri) and node.desugared_from == "masterslave"


def test_masterslave_three_and_slashes() -> None:
    node = parse_uri("masterslave://(tcp://a:1,tcp://b:2,tcp://c:3)")
    assert isinstance(node, CompositeUri)
    inner = node.components[0]
    assert isinstance(inner, CompositeUri) and len(inner.components) == 3


def test_masterslave_options_go_to_the_static() -> None:
    node = parse_uri("masterslave:(tcp://a:1,tcp://b:2)?initialReconnectDelay=250&minConnectTime=10")
    assert isinstance(node, CompositeUri) and isinstance(node.options, StaticOptions)
    assert node.options.initial_reconnect_delay == 250
    assert node.options.min_connect_time == 10
    e = err("masterslave:(tcp://a:1,tcp://b:2)?randomize=true")
    assert e.option == "randomize"
    assert "minConnectTime" in e.valid


def test_masterslave_needs_two() -> None:
    e = err("masterslave:(tcp://a:1)")
    assert "two or more" in str(e)


def test_nested_composites_inside_a_list() -> None:
    node = parse_uri(
        "static:(failover:(tcp://a:1,tcp://b:2)?randomize=false,failover:(tcp://c:3,tcp://d:4),tcp://e:5)?minConnectTime=1"
    )
    assert isinstance(node, CompositeUri)
    assert [c.scheme for c in node.components] == ["failover", "failover", "tcp"]
    first = node.components[0]
    assert isinstance(first, CompositeUri) and first.options.randomize is False  # type: ignore[union-attr]
    assert [leaf.address for leaf in node.leaves()] == [
        "tcp://a:1", "tcp://b:2", "tcp://c:3", "tcp://d:4", "tcp://e:5",
    ]


def test_nested_options_apply_to_every_leaf_and_leaf_wins() -> None:
    node = parse_uri(
        "failover:(tcp://a:1,tcp://b:2?connectTimeout=9)?nested.connectTimeout=500&nested.heartBeat=0,0&randomize=false"
    )
    assert isinstance(node, CompositeUri)
    a, b = node.components
    assert isinstance(a, LeafUri) and isinstance(b, LeafUri)
    assert a.options.connect_timeout == 500 and a.options.heart_beat == "0,0"
    assert b.options.connect_timeout == 9 and b.options.heart_beat == "0,0"
    assert node.options.randomize is False
    # nested.* is sugar: it disappears into the leaves
    assert str(node) == (
        "failover:(tcp://a:1?connectTimeout=500&heartBeat=0,0,tcp://b:2?connectTimeout=9&heartBeat=0,0)"
        "?randomize=false"
    )


def test_nested_options_are_validated_against_leaf_options() -> None:
    e = err("failover:(tcp://a:1)?nested.connectTimeot=5")
    assert e.option == "nested.connectTimeot"
    assert "nested.connectTimeout" in e.valid
    e = err("failover:(tcp://a:1)?nested.connectTimeout=-1")
    assert e.option == "nested.connectTimeout"
    e = err("failover:(tcp://a:1)?nested.verify=false")
    assert "ssl://" in str(e)
    ok = parse_uri("failover:(ssl://a:1)?nested.verify=false")
    assert isinstance(ok, CompositeUri) and ok.components[0].options.verify is False  # type: ignore[union-attr]


def test_url_decoding_of_option_values() -> None:
    node = parse_uri("failover:(tcp://a:1)?updateURIsURL=file%3A%2F%2F%2Ftmp%2Fa%20b%26c&randomize=%66alse")
    assert isinstance(node, CompositeUri) and isinstance(node.options, FailoverOptions)
    assert node.options.update_uris_url == "file:///tmp/a b&c"
    assert node.options.randomize is False
    assert parse_uri(str(node)) == node


def test_backoff_multiplier_alias_on_failover() -> None:
    a = parse_uri("failover:(tcp://a:1)?backOffMultiplier=3")
    b = parse_uri("failover:(tcp://a:1)?reconnectDelayExponent=3.0")
    assert a == b
    assert a.options.reconnect_delay_exponent == 3.0  # type: ignore[union-attr]
    e = err("failover:(tcp://a:1)?backOffMultiplier=3&reconnectDelayExponent=3")
    assert "twice" in str(e)


def test_priority_uris() -> None:
    node = parse_uri(
        "failover:(tcp://a:1,stomp://b:2)?priorityBackup=true&priorityURIs=stomp://b:2,tcp://a:1"
    )
    assert isinstance(node, CompositeUri) and isinstance(node.options, FailoverOptions)
    assert node.options.priority_uris == ("tcp://b:2", "tcp://a:1")
    e = err("failover:(tcp://a:1)?priorityURIs=tcp://zz:1")
    assert e.option == "priorityURIs" and "tcp://a:1" in e.valid
    e = err("failover:(tcp://a:1)?priorityURIs=nope")
    assert e.option == "priorityURIs"


def test_all_failover_options_by_activemq_name() -> None:
    node = parse_uri(
        "failover:(tcp://a:1)?initialReconnectDelay=1&maxReconnectDelay=2&useExponentialBackOff=false"
        "&reconnectDelayExponent=1.5&maxReconnectAttempts=3&startupMaxReconnectAttempts=4&randomize=false"
        "&timeout=5&priorityBackup=true&priorityURIs=tcp://a:1&backup=true&backupPoolSize=6"
        "&trackMessages=true&maxCacheSize=7&warnAfterReconnectAttempts=8&updateURIsURL=file:/x"
        "&reconnectJitter=0.25"
    )
    assert isinstance(node, CompositeUri)
    assert node.options == FailoverOptions(
        initial_reconnect_delay=1, max_reconnect_delay=2, use_exponential_backoff=False,
        reconnect_delay_exponent=1.5, max_reconnect_attempts=3, startup_max_reconnect_attempts=4,
        randomize=False, timeout=5, priority_backup=True, priority_uris=("tcp://a:1",), backup=True,
        backup_pool_size=6, track_messages=True, max_cache_size=7, warn_after_reconnect_attempts=8,
        update_uris_url="file:/x", reconnect_jitter=0.25,
    )
    assert parse_uri(str(node)) == node


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("text", "column", "words"),
    [
        ("failover:(tcp://a:1", 10, "'(' is never closed"),
        ("failover:(tcp://a:1))", 21, "')' without"),
        ("static:(failover:(tcp://a:1)", 8, "never closed"),
        ("failover:()", 10, "empty list"),
        ("failover:( )", 10, "empty list"),
        ("failover:", 10, "needs a list"),
        ("failover://", 12, "needs a list"),
        ("failover:(tcp://a:1,)", 21, "empty element"),
        ("failover:(,tcp://a:1)", 11, "empty element"),
        ("failover:(tcp://a:1,,tcp://b:1)", 21, "empty element"),
        ("failover:(tcp://a:1)x", 21, "after ')'"),
        ("foo://a:1", 1, "unknown scheme"),
        ("failover:(foo://a:1)", 11, "unknown scheme"),
        ("a:1", 1, "unknown scheme"),
        ("localhost:61613", 1, "unknown scheme"),
        ("//a", 1, "no scheme"),
        ("tcp://", 7, "missing host"),
        ("tcp://:1", 7, "missing host"),
        ("tcp:a:1", 5, "tcp://host:port"),
        ("tcp://a:0", 9, "bad port"),
        ("tcp://a:65536", 9, "bad port"),
        ("tcp://a:x1", 9, "bad port"),
        ("tcp://a:-1", 9, "bad port"),
        ("tcp://[::1]:99999", 13, "bad port"),
        ("tcp://[zz]:1", 7, "bad host"),
        ("tcp://[::1", 7, "']'"),
        ("tcp://a b:1", 8, "whitespace"),
        ("tcp://a\tb:1", 8, "whitespace"),
        ("tcp://a%20b:1", 7, "bad host"),
        ("tcp://a..b:1", 7, "bad host"),
        ("tcp://u:p@a:1", 10, "user info"),
        ("tcp://a:1/path", 10, "path"),
        ("tcp://a:1#frag", 10, "fragment"),
        ("vm://", 6, "broker name"),
        ("vm://a/b", 6, "bad vm broker name"),
        ("tcp://a:1\n", None, None),  # trailing whitespace is fine: see test below
        ("failover:(tcp://a:1)?\x00", 22, "unexpected character"),
        ("failover:(tcp://a:1)?randomize", 22, "needs a value"),
        ("failover:(tcp://a:1)?=1", 22, "without a name"),
        ("failover:(tcp://a:1)?randomize=true&randomize=false", 37, "twice"),
    ],
)
def test_errors_report_the_column(text: str, column: int | None, words: str | None) -> None:
    if words is None:
        assert parse_uri(text) == LeafUri("tcp", "a", 1)
        return
    e = err(text)
    assert words in str(e), str(e)
    assert e.column == column, str(e)
    assert f"column {column}" in str(e)
    assert e.uri == text


@pytest.mark.parametrize(
    ("text", "option", "words"),
    [
        ("failover:(tcp://a:1)?randomise=false", "randomise", "did you mean randomize"),
        ("failover:(tcp://a:1)?RANDOMIZE=false", "RANDOMIZE", "did you mean randomize"),
        ("failover:(tcp://a:1)?randomize=yes", "randomize", "true or false"),
        ("failover:(tcp://a:1)?randomize=1", "randomize", "true or false"),
        ("failover:(tcp://a:1)?initialReconnectDelay=-1", "initialReconnectDelay", "greater than or equal to 0"),
        ("failover:(tcp://a:1)?initialReconnectDelay=1.5", "initialReconnectDelay", "integer"),
        ("failover:(tcp://a:1)?maxReconnectAttempts=-2", "maxReconnectAttempts", "-1"),
        ("failover:(tcp://a:1)?startupMaxReconnectAttempts=x", "startupMaxReconnectAttempts", "integer"),
        ("failover:(tcp://a:1)?timeout=-5", "timeout", "-1"),
        ("failover:(tcp://a:1)?reconnectJitter=1.5", "reconnectJitter", "less than or equal to 1"),
        ("failover:(tcp://a:1)?reconnectJitter=-0.1", "reconnectJitter", "greater than or equal to 0"),
        ("failover:(tcp://a:1)?reconnectDelayExponent=nan", "reconnectDelayExponent", "number"),
        ("failover:(tcp://a:1)?reconnectDelayExponent=0.5", "reconnectDelayExponent", "greater than or equal to 1"),
        ("failover:(tcp://a:1)?backupPoolSize=-1", "backupPoolSize", "greater than or equal to 0"),
        ("failover:(tcp://a:1)?updateURIsURL=", "updateURIsURL", "non-empty"),
        ("static:(tcp://a:1)?backOffMultiplier=1.5", "backOffMultiplier", "integer"),
        ("static:(tcp://a:1)?maxReconnectAttempts=x", "maxReconnectAttempts", "integer"),
        ("static:(tcp://a:1)?randomize=false", "randomize", "unknown static option"),
        ("static:(tcp://a:1)?nested.connectTimeout=1", "nested.connectTimeout", "unknown static option"),
        ("tcp://a:1?connectTimeout=abc", "connectTimeout", "integer"),
        ("tcp://a:1?heartBeat=1", "heartBeat", "cx,cy"),
        ("tcp://a:1?heartBeat=-1,5", "heartBeat", "cx,cy"),
        ("tcp://a:1?verify=false", "verify", "ssl:// broker URIs only"),
        ("tcp://a:1?randomize=false", "randomize", "unknown tcp:// option"),
        ("tcp://a:1?nested.x=1", "nested.x", "failover"),
        ("ssl://a:1?verify=0", "verify", "true or false"),
    ],
)
def test_option_errors_name_the_option_and_list_valid_names(text: str, option: str, words: str) -> None:
    e = err(text)
    assert e.option == option, str(e)
    assert words in str(e), str(e)
    assert e.column is not None and text[e.column - 1 :].startswith(option)
    if "unknown" in words:
        assert e.valid and "valid: " in str(e)
        for name in e.valid:
            assert name in str(e)


def test_activemq_options_are_accepted_with_their_meaning() -> None:
    # refused before issue 29 ("does not implement" / "OpenWire settings do not apply")
    node = parse_uri("failover:(tcp://a:1)?updateURIsSupported=false&nested.wireFormat.maxInactivityDuration=0")
    assert isinstance(node, CompositeUri)
    assert node.amq == (("updateURIsSupported", "false"),)
    assert "ignored" in node.to_json()["meanings"]["updateURIsSupported"]
    leaf = node.components[0]
    assert isinstance(leaf, LeafUri) and leaf.amq == (("wireFormat.maxInactivityDuration", "0"),)
    assert "became" in leaf.to_json()["meanings"]["wireFormat.maxInactivityDuration"]
    # ActiveMQ's bean rule: the first letter may be upper case, nothing else
    ok = parse_uri("failover:(tcp://a:1)?Randomize=false")
    assert isinstance(ok, CompositeUri) and ok.options.randomize is False  # type: ignore[union-attr]
    assert err("tcp://a:1?wireFormat.maxInactivityDuratio=0").option == "wireFormat.maxInactivityDuratio"


def test_unknown_failover_option_lists_every_failover_name() -> None:
    e = err("failover:(tcp://a:1)?bogus=1")
    for name in FailoverOptions.model_fields:
        alias = FailoverOptions.model_fields[name].serialization_alias or FailoverOptions.model_fields[name].alias
        assert alias in e.valid


def test_unknown_scheme_lists_valid_schemes() -> None:
    e = err("amqp://a:1")
    assert set(e.valid) >= {"tcp", "stomp", "ssl", "stomp+ssl", "vm", "failover", "static", "masterslave"}


@pytest.mark.parametrize(
    "text",
    [
        "failover:(failover:(tcp://a:1))",
        "failover:(static:(tcp://a:1))",
        "static:(static:(tcp://a:1))",
        "static:masterslave:(tcp://a:1,tcp://b:2)",
        "masterslave:(failover:(tcp://a:1),tcp://b:2)",
    ],
)
def test_structure_rules(text: str) -> None:
    e = err(text)
    assert e.valid


def test_deep_nesting_is_an_error_not_a_recursion_error() -> None:
    text = "static:" * 500 + "tcp://a:1"
    e = err(text)
    assert "nested" in str(e)
    text = "static:(" * 300 + "tcp://a:1" + ")" * 300
    err(text)


def test_non_string_input() -> None:
    with pytest.raises(UriError):
        parse_uri(b"tcp://a:1")  # type: ignore[arg-type]
