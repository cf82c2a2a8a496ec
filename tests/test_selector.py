"""The pure selector module: ActiveMQ 5.17's grammar and semantics, errors with their
position, the STOMP -> JMS mapping, and fuzzing (only SelectorError ever escapes
compile_selector; a compiled selector never raises while it evaluates).

The expected values are ActiveMQ's (read from its filter classes and checked against a
live broker by tests/interop/test_activemq_selectors.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.selector import JLong, MessageView, SelectorError, compile_selector, message_view


def view(**headers: str) -> MessageView:
    return message_view(list(headers.items()), message_id="ID:test-1-1", destination="/queue/q", timestamp_ms=1_000)


def ev(selector: str, **headers: str) -> bool | None:
    """True (matches), False (FALSE or null) or None (an evaluation error: Java throws)."""
    return compile_selector(selector).evaluate(view(**headers))


@pytest.mark.parametrize(
    ("selector", "headers", "expected"),
    [
        ("color = 'red'", {"color": "red"}, True),
        ("color <> 'red'", {"color": "red"}, False),
        ("color = 'red'", {}, False),
        # '=' with one null side: null on the left, FALSE on the right (so NOT is TRUE)
        ("missing <> 'x'", {}, False),
        ("'x' <> missing", {}, True),
        ("a = b", {}, True),  # both null: equal
        ("missing IS NULL", {}, True),
        ("color IS NOT NULL", {"color": ""}, True),
        # NOT binds tighter than '=': (NOT color) = 'blue' throws in Java -> no match
        ("NOT color = 'blue'", {"color": "red"}, None),
        ("NOT (color = 'blue')", {"color": "red"}, True),
        ("NOT missing = 'blue'", {}, False),
        # convert_string_expressions: strings meet numbers through Integer/Long/Double.valueOf
        ("price > 10", {"price": "20"}, True),
        ("price > 10", {"price": "10.5"}, False),
        ("price > 10.0", {"price": "10.5"}, True),
        ("price > 10.0", {"price": " 10.5 "}, True),  # Double.valueOf trims
        ("price > 10", {"price": " 20"}, False),  # Integer.valueOf does not
        ("price = 20", {"price": "+20"}, True),
        ("price < 3000000000", {"price": "2999999999"}, True),
        ("price > 1", {"price": "3000000000"}, False),  # not an Integer
        ("price > 1.0", {"price": "NaN"}, True),  # Double.compare: NaN above everything
        ("price > 1.0", {"price": "0x1p4"}, True),
        ("flag", {"flag": "true"}, False),  # a bare property is TRUE only for a Boolean
        ("flag = TRUE", {"flag": "TRUE"}, True),
        ("price = '20'", {"price": "20"}, True),
        # arithmetic: Java types, wrapping, Double division
        ("2147483647 + 1 < 0", {}, True),
        ("2147483647L + 1 > 0", {}, False),  # the literal is an Integer anyway: wraps
        ("2147483648 + 1 > 0", {}, True),  # a Long
        ("1 / 0 > 1000000", {}, True),  # Infinity
        ("-1 / 0 < 0", {}, True),
        ("7 % 0 = 7 % 0", {}, True),  # NaN equals NaN (Double.compare)
        ("7 % 2 = 1", {}, True),
        ("-7 % 2 = -1", {}, True),
        ("3 / 2 = 1.5", {}, True),
        ("'a' + 1 = 'a1'", {}, True),
        ("'a' + 1.5 = 'a1.5'", {}, True),
        ("'a' + 1e10 = 'a1.0E10'", {}, True),
        ("-'a' IS NULL", {}, True),
        ("price - 1 > 10", {"price": "20"}, None),  # arithmetic on a string: an evaluation error
        ("JMSRedelivered = 'false'", {}, None),  # Boolean meets String: ClassCastException
        # LIKE, IN, BETWEEN
        ("s LIKE 'a%c'", {"s": "abbc"}, True),
        ("s LIKE 'a_c'", {"s": "abbc"}, False),
        ("s LIKE 'a!_c' ESCAPE '!'", {"s": "a_c"}, True),
        ("s LIKE 'a!_c' ESCAPE '!'", {"s": "abc"}, False),
        ("s LIKE 'a.c'", {"s": "abc"}, False),
        ("s LIKE '%'", {"s": "line\nbreak"}, True),
        ("s NOT LIKE 'a%'", {}, False),  # NOT null is null: no match
        ("1 LIKE '1'", {}, False),
        ("s IN ('a', 'b')", {"s": "b"}, True),
        ("s NOT IN ('a', 'b')", {"s": "c"}, True),
        ("s NOT IN ('a', 'b')", {}, False),
        ("n BETWEEN 1 AND 3", {"n": "2"}, True),
        ("n NOT BETWEEN 1 AND 3", {"n": "5"}, True),
        ("n BETWEEN 1 AND 3", {"n": "x"}, False),
        # literals, case, comments
        ("n = 0x10 AND m = 010", {"n": "16", "m": "8"}, True),
        ("n = 99999999999999999999", {"n": "1"}, False),  # a BigDecimal compares with nothing else
        ("18446744073709551617 = 1", {}, True),  # Java keeps its low 32 bits: Integer 1
        ("n = 1.5E1", {"n": "15"}, True),
        ("color = 'it''s'", {"color": "it's"}, True),
        ("Color = 'x'", {"color": "x"}, False),  # names are case-sensitive
        ("color = 'x' and NOT (n is null)", {"color": "x", "n": "1"}, True),
        ("color = 'x' /* block */ -- line\n", {"color": "x"}, True),
        ("TRUE", {}, True),
        ("NULL", {}, False),
        ("TRUE OR missing > 1", {}, True),
        ("FALSE AND missing - 1 > 1", {}, False),  # short-circuit: no evaluation error
    ],
)
def test_activemq_semantics(selector: str, headers: dict[str, str], expected: bool | None) -> None:
    assert ev(selector, **headers) is expected


def test_strings_compare_as_utf16_when_both_are_properties() -> None:
    # Java compares UTF-16 code units: U+10000 (D800 DC00) sorts below U+FFFF
    assert ev("a < b", a="\U00010000", b="\uffff") is True
    assert ev("a < b", a="abc", b="abd") is True


@pytest.mark.parametrize(
    ("headers", "selector"),
    [
        ({"priority": "7"}, "JMSPriority = 7"),
        ({}, "JMSPriority = 4"),
        ({"type": "t1"}, "JMSType = 't1'"),
        ({"correlation-id": "c1"}, "JMSCorrelationID = 'c1'"),
        ({"persistent": "true"}, "JMSDeliveryMode = 'PERSISTENT'"),
        ({"persistent": "TRUE"}, "JMSDeliveryMode = 'NON_PERSISTENT'"),  # "true".equals(...)
        ({"expires": "5000"}, "JMSExpiration = 5000"),
        ({}, "JMSTimestamp = 1000"),
        ({"timestamp": "42"}, "JMSTimestamp = 42"),
        ({"reply-to": "/queue/r"}, "JMSReplyTo = 'queue://r'"),
        ({}, "JMSMessageID = 'ID:test-1-1' AND JMSDestination = 'queue://q'"),
        ({"JMSXGroupID": "g"}, "JMSXGroupID = 'g' AND JMSXGroupSeq = 0"),
        ({"AMQ_SCHEDULED_DELAY": "100"}, "AMQ_SCHEDULED_DELAY + 1 = 101"),  # a Long property
        ({}, "JMSRedelivered = FALSE AND JMSXDeliveryCount = 1"),
        ({"receipt": "r"}, "receipt IS NULL"),  # frame headers are not properties
    ],
)
def test_stomp_headers_map_to_jms_headers_as_activemq_does(headers: dict[str, str], selector: str) -> None:
    assert ev(selector, **headers) is True


class _CountedHeaders(list[tuple[str, str]]):
    reads = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().__iter__()


def test_a_view_reads_the_headers_only_when_a_selector_asks_and_then_once_per_kind() -> None:
    """A deep queue under a selective consumer builds one view per message: it must cost
    nothing until a selector reads it, and a property selector must not pay for the JMS
    headers (docs/brokers/activemq-compat.md, how it scales)."""
    headers = _CountedHeaders([("k", "v"), ("priority", "7"), ("k", "second")])
    v = message_view(headers, message_id="ID:x", destination="/queue/q", timestamp_ms=0)
    assert headers.reads == 0
    assert compile_selector("k = 'v'").matches(v) and headers.reads == 1  # the properties, once
    assert compile_selector("k <> 'second' AND priority IS NULL").matches(v) and headers.reads == 1
    assert compile_selector("JMSPriority = 7 AND JMSXDeliveryCount = 1").matches(v) and headers.reads == 2
    v.delivery_count = 1  # redelivered: the JMS headers follow without reading the headers again
    assert compile_selector("JMSRedelivered AND JMSXDeliveryCount = 2").matches(v) and headers.reads == 2


def test_delivery_count_is_what_the_view_says() -> None:
    v = message_view([], message_id="ID:x", destination="/topic/t", timestamp_ms=0, delivery_count=2)
    assert compile_selector("JMSRedelivered AND JMSXDeliveryCount = 3").matches(v)
    assert type(v.jms["JMSTimestamp"]) is JLong


@pytest.mark.parametrize(
    ("selector", "column", "words"),
    [
        ("a = = 1", 5, "found '='"),
        ("a >", 4, "end of the selector"),
        ("a = 1 b", 7, "found 'b'"),
        ("NOT a < 1", 1, "boolean expression cannot be compared"),
        ("a = NULL", 5, "NULL cannot be compared"),
        ("TRUE = 1", 6, "TRUE cannot be compared with 1"),
        ("'a' > 1", 1, "cannot be compared"),
        ("a > TRUE", 5, "cannot be compared"),
        ("5", 1, "will not result in a boolean"),
        ("a + 1", 1, "will not result in a boolean"),
        ("a IN (1)", 7, "string literal"),
        ("1 IN ('a')", 1, "IN needs a property"),
        ("a LIKE 'x' ESCAPE 'ab'", 19, "one character"),
        ("a LIKE b", 8, "string literal"),
        ("f(1) = 1", 1, "function calls"),
        ("XPATH '//a'", 1, "not supported"),
        ("a = 'open", 5, "unterminated string"),
        ("a # b", 3, "unexpected character"),
        ("a = 0xFFFFFFFFFFFFFFFF", 5, "too large"),
        ("a = 1 --no line end", 12, "found 'line'"),  # a '--' comment needs a line end: 1 - (-no)
        ("(a = 1", 7, "expected ')'"),
        ("a IS 1", 6, "NULL or NOT NULL"),
        ("", 1, "end of the selector"),
    ],
)
def test_bad_selectors_name_their_column(selector: str, column: int, words: str) -> None:
    with pytest.raises(SelectorError) as err:
        compile_selector(selector)
    assert f"column {column}:" in str(err.value)
    assert words in str(err.value)
    assert err.value.position == column - 1


def test_error_on_a_later_line_names_line_and_column() -> None:
    with pytest.raises(SelectorError, match=r"line 2, column 4"):
        compile_selector("a = 1\nOR = 2")


_TOKENS = [
    "a", "b", "JMSPriority", "JMSRedelivered", "'x'", "''", "'it''s'", "1", "0", "2.5", "1e3", "0x1F", "010",
    "99999999999999999999", "TRUE", "FALSE", "NULL", "NOT", "AND", "OR", "IS", "IN", "LIKE", "ESCAPE",
    "BETWEEN", "=", "<>", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "(", ")", ",", "'%'", "'!'",
]

_VIEWS = [
    view(),
    view(a="1", b="x", priority="9"),
    view(a="abc", b="2.5", persistent="true"),
    message_view([("a", "NaN"), ("b", "")], message_id="ID:f", destination="/topic/t", timestamp_ms=7, delivery_count=3),
]


def _check(text: str) -> None:
    try:
        sel = compile_selector(text)
    except SelectorError as exc:
        assert 0 <= exc.position <= len(text)
        return
    for v in _VIEWS:
        assert sel.evaluate(v) in (True, False, None)
        assert sel.matches(v) in (True, False)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=60))
def test_fuzz_arbitrary_text_only_raises_selector_error(text: str) -> None:
    _check(text)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=14))
def test_fuzz_token_soup_parses_or_fails_cleanly_and_never_raises_when_evaluated(tokens: list[str]) -> None:
    _check(" ".join(tokens))


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(SelectorError):
        compile_selector("(" * 5000 + "a" + ")" * 5000)


def test_string_equality_compares_a_string_property_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    """``prop = 'text'`` on a string property does not go through the general comparison
    (a deep queue evaluates it once per message); other types still do, with its rules."""
    import amqtransport.selector.nodes as nodes

    calls = []
    real = nodes.compare

    def counting(*args: object) -> object:
        calls.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(nodes, "compare", counting)
    sel = compile_selector("k = 'hit'")
    assert sel.matches(view(k="hit")) and not sel.matches(view(k="miss")) and not sel.matches(view())
    assert calls == []
    assert compile_selector("AMQ_SCHEDULED_DELAY = '5'").evaluate(view(AMQ_SCHEDULED_DELAY="5")) is True
    assert len(calls) == 1  # a long against a string: compare converts it
    assert compile_selector("NOT (k = 'hit')").evaluate(view()) is False  # null stays null under NOT
