"""ActiveMQ wildcard semantics for include/exclude rules (bridge/destinations.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqtransport.errors import ConfigError
from bridge.destinations import (
    Destination,
    DestinationFilter,
    advisory_topic,
    overlaps,
    parse_destination,
    parse_pattern,
    watched_destination,
)

TABLE = [
    # pattern, destination, matches
    ("/queue/orders", "/queue/orders", True),
    ("/queue/orders", "/queue/orders.eu", False),
    ("/queue/orders", "/topic/orders", False),
    ("/queue/*", "/queue/orders", True),
    ("/queue/*", "/queue/orders.eu", False),
    ("/queue/orders.*", "/queue/orders.eu", True),
    ("/queue/orders.*", "/queue/orders", False),
    ("/queue/orders.*", "/queue/orders.eu.paris", False),
    ("/queue/orders.>", "/queue/orders.eu", True),
    ("/queue/orders.>", "/queue/orders.eu.paris", True),
    ("/queue/orders.>", "/queue/orders", True),  # ActiveMQ: "A matches A.>"
    ("/queue/orders.>", "/queue/ordersx.eu", False),
    ("/queue/>", "/queue/a", True),
    ("/queue/>", "/queue/a.b.c", True),
    ("/queue/>", "/topic/a", False),
    ("/topic/*.prices.>", "/topic/eu.prices.fx.spot", True),
    ("/topic/*.prices.>", "/topic/eu.quotes.fx", False),
    ("/topic/*.*", "/topic/a.b", True),
    ("/topic/*.*", "/topic/a", False),
    ("queue://orders.>", "/queue/orders.x", True),
    ("/queue/orders.>", "queue://orders.x", True),
]


@pytest.mark.parametrize(("pattern", "dest", "expected"), TABLE)
def test_wildcard_table(pattern: str, dest: str, expected: bool) -> None:
    assert parse_pattern(pattern).matches(dest) is expected


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("orders", "must start with /queue/ or /topic/"),
        ("/queue/", "empty name"),
        ("/queue/a..b", "empty segment"),
        ("/queue/.a", "empty segment"),
        ("/queue/a.>.b", "'>' may only be the last segment"),
        ("/queue/a.b*", "must be whole segments"),
        ("/queue/a>", "must be whole segments"),
        ("/exchange/a", "must start with"),
    ],
)
def test_bad_patterns_name_the_problem(bad: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_pattern(bad)
    assert fragment in str(info.value)


def test_filter_exclusion_wins() -> None:
    f = DestinationFilter.of(["/queue/orders.>", "/topic/prices"], ["/queue/orders.local.>"])
    assert f.allows("/queue/orders.eu")
    assert f.allows("/topic/prices")
    assert not f.allows("/queue/orders.local.x")
    assert f.excluded("/queue/orders.local.x")
    assert not f.allows("/queue/other")


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("/queue/a.>", "/queue/a.b", True),
        ("/queue/a.>", "/queue/a", True),
        ("/queue/a.*", "/queue/*.b", True),
        ("/queue/a.*", "/queue/b.*", False),
        ("/queue/>", "/queue/x.y.z", True),
        ("/queue/a.*", "/queue/a.b.c", False),
        ("/queue/a.*.c", "/queue/a.>", True),
        ("/queue/a", "/topic/a", False),
        ("/queue/*", "/queue/a.>", True),  # both match /queue/a
        ("/queue/*", "/queue/a.b.>", False),
    ],
)
def test_overlaps(a: str, b: str, expected: bool) -> None:
    assert overlaps(parse_pattern(a), parse_pattern(b)) is expected
    assert overlaps(parse_pattern(b), parse_pattern(a)) is expected


def test_advisory_names_round_trip() -> None:
    assert advisory_topic(parse_pattern("/queue/events.>")) == "/topic/ActiveMQ.Advisory.Consumer.Queue.events.>"
    assert advisory_topic(parse_destination("/topic/prices")) == "/topic/ActiveMQ.Advisory.Consumer.Topic.prices"
    assert watched_destination("/topic/ActiveMQ.Advisory.Consumer.Queue.events.eu") == Destination("queue", "events.eu")
    assert watched_destination("/topic/ActiveMQ.Advisory.Consumer.Topic.p") == Destination("topic", "p")
    assert watched_destination("/topic/ActiveMQ.Advisory.Producer.Queue.x") is None
    assert watched_destination("/queue/x") is None


segment = st.sampled_from(["a", "b", "c"])
pattern_segment = st.sampled_from(["a", "b", "c", "*"])


@st.composite
def patterns(draw: st.DrawFn) -> str:
    segs = draw(st.lists(pattern_segment, min_size=1, max_size=4))
    if draw(st.booleans()):
        segs.append(">")
    return "/queue/" + ".".join(segs)


@given(patterns(), patterns(), st.lists(segment, min_size=1, max_size=6))
def test_overlap_is_consistent_with_matching(a: str, b: str, path: list[str]) -> None:
    """If a concrete destination matches both patterns, overlaps() must say so."""
    dest = "/queue/" + ".".join(path)
    pa, pb = parse_pattern(a), parse_pattern(b)
    if pa.matches(dest) and pb.matches(dest):
        assert overlaps(pa, pb)


@given(st.text(max_size=40))
def test_pattern_parser_raises_only_config_error(text: str) -> None:
    try:
        parse_pattern(text)
    except ConfigError:
        pass
