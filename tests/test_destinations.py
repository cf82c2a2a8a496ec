"""The destination grammar (amqtransport/destinations.py), which the broker and the bridge share.

The table tests say what the grammar means. The property tests pin the unification:
the broker and the bridge each had their own copy of the grammar (``broker/dispatch/core.py``'s
``split_destination``, ``_pattern`` and ``_matches``; ``bridge/destinations.py``);
those copies are kept below, verbatim but for names, as oracles, and on generated
names the one grammar must give the answers each of them gave.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqtransport.broker.dispatch.errors import CoreError
from amqtransport.broker.dispatch.names import check_send_destination, split_destination
from amqtransport.destinations import (
    Destination,
    Pattern,
    advisory_name,
    advisory_topic,
    match,
    overlaps,
    parse_destination,
    parse_pattern,
    watched_destination,
    wildcard_segments,
)
from amqtransport.errors import AmqTransportError, DestinationError

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


def test_no_pattern_matches_a_temporary_destination() -> None:
    assert not parse_pattern("/queue/>").matches(parse_destination("/temp-queue/a"))
    assert parse_pattern("/queue/>").matches(parse_destination("/queue/a"))


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
        ("/temp-queue/a", "must start with"),  # temporary destinations are never configured
    ],
)
def test_bad_patterns_name_the_problem(bad: str, fragment: str) -> None:
    with pytest.raises(DestinationError) as info:
        parse_pattern(bad)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/queue/a.b", Destination("queue", "a.b")),
        ("/topic/a", Destination("topic", "a")),
        ("/temp-queue/x", Destination("queue", "x", temporary=True)),
        ("/temp-topic/x", Destination("topic", "x", temporary=True)),
        ("/remote-temp-queue/ID:b-1:1", Destination("queue", "ID:b-1:1", temporary=True, remote=True)),
        ("/remote-temp-topic/ID:b-1:2", Destination("topic", "ID:b-1:2", temporary=True, remote=True)),
        ("/queue/a..b", Destination("queue", "a..b")),  # a broker takes any name
    ],
)
def test_wire_destinations(text: str, expected: Destination) -> None:
    parsed = parse_destination(text)
    assert parsed == expected
    assert str(parsed) == text


def test_uri_form_is_for_what_people_write() -> None:
    assert parse_destination("queue://a", uri_form=True) == Destination("queue", "a")
    assert str(parse_destination("topic://a", uri_form=True)) == "/topic/a"
    with pytest.raises(DestinationError, match=r"must start with /queue/ or /topic/$"):
        parse_destination("queue://a")
    with pytest.raises(DestinationError, match=r"\(or queue:// / topic://\)"):
        parse_destination("/temp-queue/a", uri_form=True)


def test_destination_errors_are_in_the_family() -> None:
    with pytest.raises(AmqTransportError):
        parse_destination("/exchange/x")
    with pytest.raises(ValueError):  # what the bridge's config validators expect
        parse_pattern("/queue/a.>.b")


def test_the_lenient_reading_of_a_subscription() -> None:
    assert wildcard_segments("a.*.c") == ("a", "*", "c")
    assert wildcard_segments("a.>") == ("a", ">")
    assert wildcard_segments("a.b*") is None  # literal
    assert wildcard_segments("a.b") is None
    assert match(("a", ">", "b"), ("a", "x", "y"))  # a '>' ends the match wherever it stands


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
    assert advisory_name("queue", "a.b") == "ActiveMQ.Advisory.Consumer.Queue.a.b"
    assert advisory_topic(parse_pattern("/queue/events.>")) == "/topic/ActiveMQ.Advisory.Consumer.Queue.events.>"
    assert advisory_topic(parse_destination("/topic/prices")) == "/topic/ActiveMQ.Advisory.Consumer.Topic.prices"
    assert watched_destination("/topic/ActiveMQ.Advisory.Consumer.Queue.events.eu") == Destination("queue", "events.eu")
    assert watched_destination("/topic/ActiveMQ.Advisory.Consumer.Topic.p") == Destination("topic", "p")
    assert watched_destination("/topic/ActiveMQ.Advisory.Producer.Queue.x") is None
    assert watched_destination("/queue/x") is None


def test_the_broker_maps_a_bad_name_to_its_error_frame() -> None:
    with pytest.raises(CoreError, match=r"destination '/exchange/x' must start with /queue/ or /topic/"):
        split_destination("/exchange/x")
    with pytest.raises(CoreError, match="empty name"):
        split_destination("/topic/")
    with pytest.raises(CoreError, match="cannot SEND to '/queue/a.>'"):
        check_send_destination("/queue/a.>")
    assert check_send_destination("/queue/a.b*") == ("queue", "a.b*")  # literal, not a wildcard


# -- properties ------------------------------------------------------------------------

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
def test_parsers_raise_only_destination_error(text: str) -> None:
    for parse in (parse_pattern, parse_destination, lambda t: parse_destination(t, uri_form=True)):
        try:
            parse(text)
        except DestinationError:
            pass


# The two copies the grammar replaces, as they were (broker/dispatch/core.py and
# bridge/destinations.py before the unification), for the agreement properties.

def old_broker_split(destination: str) -> tuple[str, str]:
    for prefix, kind in (("/queue/", "queue"), ("/topic/", "topic"), ("/temp-queue/", "queue"), ("/temp-topic/", "topic")):
        if destination.startswith(prefix):
            name = destination[len(prefix) :]
            if not name:
                raise ValueError(f"destination {destination!r} has an empty name")
            return kind, name
    raise ValueError(f"destination {destination!r} must start with /queue/ or /topic/")


def old_broker_pattern(name: str) -> tuple[str, ...] | None:
    parts = tuple(name.split("."))
    return parts if ("*" in parts or ">" in parts) else None


def old_broker_matches(pattern: tuple[str, ...], parts: Sequence[str]) -> bool:
    for i, p in enumerate(pattern):
        if p == ">":
            return True
        if i >= len(parts) or (p != "*" and p != parts[i]):
            return False
    return len(parts) == len(pattern)


def old_bridge_split_kind(text: str) -> tuple[str, str]:
    for kind in ("queue", "topic"):
        for prefix in (f"/{kind}/", f"{kind}://"):
            if text.startswith(prefix):
                return kind, text[len(prefix) :]
    raise ValueError(f"destination {text!r} must start with /queue/ or /topic/ (or queue:// / topic://)")


def old_bridge_parse_destination(text: str) -> tuple[str, str]:
    kind, name = old_bridge_split_kind(text)
    if not name:
        raise ValueError(f"destination {text!r} has an empty name")
    return kind, name


def old_bridge_parse_pattern(text: str) -> tuple[str, tuple[str, ...]]:
    kind, name = old_bridge_split_kind(text)
    if not name:
        raise ValueError(f"destination {text!r} has an empty name")
    segments = tuple(name.split("."))
    for i, seg in enumerate(segments):
        if seg == "":
            raise ValueError(f"destination {text!r} has an empty segment (segments are separated by '.')")
        if seg == ">" and i != len(segments) - 1:
            raise ValueError(f"destination {text!r}: '>' may only be the last segment")
        if seg not in ("*", ">") and ("*" in seg or ">" in seg):
            raise ValueError(f"destination {text!r}: wildcards '*' and '>' must be whole segments (segment {seg!r})")
    return kind, segments


def old_bridge_overlap(a: Sequence[str], b: Sequence[str]) -> bool:
    if not a and not b:
        return True
    if (a and a[0] == ">") or (b and b[0] == ">"):
        return True
    if not a or not b:
        return False
    if a[0] == "*" or b[0] == "*" or a[0] == b[0]:
        return old_bridge_overlap(a[1:], b[1:])
    return False


# names made of the characters that matter (separators, wildcards), as free text and as
# segments (mostly well-formed, so that matching is exercised, not only refusals)
name_text = st.one_of(
    st.text(alphabet="ab.*>", max_size=8),
    st.lists(st.sampled_from(["a", "b", "*", ">", "", "a*"]), min_size=1, max_size=5).map(".".join),
)
prefixes = st.sampled_from(["/queue/", "/topic/", "/temp-queue/", "/temp-topic/", "queue://", "topic://", "/q/", ""])
names = st.builds(lambda p, n: p + n, prefixes, name_text)
# what a bridge's config holds: mostly well-formed, so that matching is exercised
config_names = st.builds(lambda p, n: p + n, st.sampled_from(["/queue/", "queue://", "/topic/", "topic://"]), name_text)


def _outcome(fn: object, *args: object) -> tuple[str, object]:
    try:
        return "ok", fn(*args)  # type: ignore[operator]
    except (ValueError, DestinationError) as exc:
        return "error", str(exc)


@given(names)
def test_broker_split_agrees_with_the_old_one(text: str) -> None:
    def new(t: str) -> tuple[str, str]:
        d = parse_destination(t)
        return d.kind, d.name

    assert _outcome(new, text) == _outcome(old_broker_split, text)


@given(st.one_of(st.tuples(name_text, name_text), st.deferred(lambda: near_names())))
def test_broker_wildcards_agree_with_the_old_ones(names: tuple[str, str]) -> None:
    pattern_name, name = names
    assert wildcard_segments(pattern_name) == old_broker_pattern(pattern_name)
    pattern = wildcard_segments(pattern_name)
    if pattern is not None:
        assert match(pattern, name.split(".")) == old_broker_matches(pattern, name.split("."))


@given(names)
def test_bridge_parsers_agree_with_the_old_ones(text: str) -> None:
    def new_destination(t: str) -> tuple[str, str]:
        d = parse_destination(t, uri_form=True)
        return d.kind, d.name

    def new_pattern(t: str) -> tuple[str, tuple[str, ...]]:
        p = parse_pattern(t)
        return p.kind, p.segments

    assert _outcome(new_destination, text) == _outcome(old_bridge_parse_destination, text)
    assert _outcome(new_pattern, text) == _outcome(old_bridge_parse_pattern, text)


@st.composite
def near_names(draw: st.DrawFn) -> tuple[str, str]:
    """A name and one made from it (wildcards filled in or cut), so that they often match."""
    well_formed = st.builds(
        lambda segs, rest: ".".join([*segs, *rest]),
        st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=3),
        st.sampled_from([[], [">"]]),
    )
    segments = draw(st.one_of(well_formed, name_text)).split(".")
    out: list[str] = []
    for seg in segments:
        if seg == ">":
            seg = draw(st.sampled_from(["", "a", "b", "a.b"]))
        elif draw(st.booleans()):
            seg = draw(st.sampled_from(["a", "b", seg]))
        out.append(seg)
    return ".".join(segments), ".".join(out).rstrip(".")


@st.composite
def near(draw: st.DrawFn) -> tuple[str, str]:
    """:func:`near_names` as config destinations (in both spellings)."""
    prefix = draw(st.sampled_from(["/queue/", "queue://", "/topic/", "topic://"]))
    pattern, name = draw(near_names())
    return prefix + pattern, prefix + name


@given(near(), config_names, st.one_of(config_names, names))
def test_bridge_matching_and_overlap_agree_with_the_old_ones(a_dest: tuple[str, str], b: str, other: str) -> None:
    a, near_a = a_dest
    for dest in (near_a, other):
        _bridge_agree(a, b, dest)


def _bridge_agree(a: str, b: str, dest: str) -> None:
    try:
        old_a = old_bridge_parse_pattern(a)
    except ValueError:
        return
    pa = parse_pattern(a)
    try:
        old_b = old_bridge_parse_pattern(b)
    except ValueError:
        pass
    else:
        assert overlaps(pa, parse_pattern(b)) == (old_a[0] == old_b[0] and old_bridge_overlap(old_a[1], old_b[1]))
    try:
        kind, name = old_bridge_parse_destination(dest)
    except ValueError:
        with pytest.raises(DestinationError):
            pa.matches(dest)
        return
    # the bridge's _match was the same loop as the broker's _matches
    assert pa.matches(dest) == (kind == old_a[0] and old_broker_matches(old_a[1], name.split(".")))


def test_pattern_is_hashable_and_printable() -> None:
    p = parse_pattern("queue://a.*")
    assert p == Pattern("queue", ("a", "*")) and str(p) == "/queue/a.*" and p.has_wildcard
    assert {p: 1}[Pattern("queue", ("a", "*"))] == 1


@given(st.sampled_from(["/temp-queue/", "/temp-topic/", "/remote-temp-queue/", "/remote-temp-topic/"]),
       st.text(max_size=12))
def test_temporary_names_round_trip_or_are_refused(prefix: str, name: str) -> None:
    """Every temporary spelling parses back to itself (remote ones stay remote); an
    empty name is refused, naming the destination."""
    if not name:
        with pytest.raises(DestinationError, match="has an empty name"):
            parse_destination(prefix + name)
        return
    parsed = parse_destination(prefix + name)
    assert parsed.temporary and parsed.remote == prefix.startswith("/remote-")
    assert str(parsed) == prefix + name
