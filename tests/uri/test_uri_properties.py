"""Property tests: canonical round trip, surface variants, and fuzzing (only UriError escapes)."""

from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from amqtransport.cli.main import cli
from amqtransport.errors import UriError
from amqtransport.uri import CompositeUri, LeafUri, UriNode, parse_uri

sys.path.insert(0, str(Path(__file__).parent))
from uri_strategies import trees  # noqa: E402

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(trees())
def test_canonical_round_trip(tree: UriNode) -> None:
    text = str(tree)
    parsed = parse_uri(text)
    assert parsed == tree, text
    assert str(parsed) == text
    assert parsed.to_json() == tree.to_json()


def variant(node: UriNode, draw: st.DrawFn, nested: bool = False) -> str:
    """Another spelling of the same tree (scheme aliases, case, //, spaces, no parentheses)."""
    if isinstance(node, LeafUri):
        text = str(node)
        if node.scheme == "tcp" and draw(st.booleans()):
            text = "stomp" + text[3:]
        elif node.scheme == "ssl" and draw(st.booleans()):
            text = "stomp+ssl" + text[3:]
        if draw(st.booleans()):
            scheme, rest = text.split("://", 1)
            text = scheme.upper() + "://" + rest
        return text
    assert isinstance(node, CompositeUri)
    parts = [variant(c, draw, nested=True) for c in node.components]
    query = node._render(nested=nested).rpartition(")")[2]
    sep = draw(st.sampled_from([",", ", ", " ,"]))
    slashes = draw(st.sampled_from(["", "//"]))
    last = node.components[-1]
    if (
        not nested
        and node.scheme == "failover"
        and isinstance(last, LeafUri)
        and not last.options.model_fields_set
        and not last.amq
        and "," not in query  # priorityURIs: commas would need %2C in this form
        and draw(st.booleans())
    ):
        return f"failover:{slashes}{sep.join(parts)}{query}"
    if len(parts) == 1 and isinstance(node.components[0], CompositeUri) and not query and draw(st.booleans()):
        return f"{node.scheme}:{parts[0]}"  # prefix chain
    return f"{node.scheme}:{slashes}({sep.join(parts)}){query}"


@SETTINGS
@given(st.data())
def test_surface_variants_parse_to_the_same_tree(data: st.DataObject) -> None:
    tree = data.draw(trees())
    text = variant(tree, data.draw)
    try:
        parsed = parse_uri(text)
    except UriError as exc:
        raise AssertionError(text) from exc
    assert parsed == tree, text


def check_parse(text: str) -> None:
    try:
        node = parse_uri(text)
    except UriError as exc:
        assert "\n" not in str(exc)
        assert exc.column is None or 1 <= exc.column <= len(text) + 1
        return
    # whatever parses must round-trip canonically too
    again = parse_uri(str(node))
    assert again == node
    assert str(again) == str(node)


TOKENS = st.sampled_from(
    ["failover:", "static:", "masterslave:", "tcp://", "ssl://", "stomp://", "vm://", "(", ")",
     ",", "?", "&", "=", "%", "%2C", "%zz", "[", "]", ":", "::1", "a", "b.c", "1", "61613", "-",
     " ", "randomize", "nested.", "connectTimeout", "heartBeat", "true", "false", "/", "@", "#",
     "+", "\n", "\t", "\x00", "é", "\u2028", "priorityURIs", "maxReconnectAttempts", "0", "-1",
     # ActiveMQ's names and schemes (issue 29)
     "nio://", "nio+ssl://", "stomp+nio://", "wireFormat.", "maxInactivityDuration", "socket.", "verifyHostName",
     "jms.", "prefetchPolicy.", "queuePrefetch", "Randomize", "trace", "soWriteTimeout", "useInactivityMonitor",
     "readCheckTime", "diffServ", "EF", "updateURIsSupported", "2147483648", "TLSv1.2"]
)


@settings(max_examples=700, deadline=None)
@given(st.text(max_size=80))
@example("failover:(tcp://a:1,)?")
@example(")" * 3)
def test_fuzz_random_text(text: str) -> None:
    check_parse(text)


@settings(max_examples=700, deadline=None)
@given(st.lists(TOKENS, max_size=30).map("".join))
def test_fuzz_uri_tokens(text: str) -> None:
    check_parse(text)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = str(draw(trees()))
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 8)))
        op = draw(st.sampled_from(["delete", "insert", "duplicate", "replace"]))
        if op == "delete":
            text = text[:i] + text[j:]
        elif op == "insert":
            text = text[:i] + draw(st.one_of(TOKENS, st.text(max_size=3))) + text[i:]
        elif op == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i] + draw(TOKENS) + text[j:]
    return text


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_mutated_valid_uris(text: str) -> None:
    check_parse(text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated(), st.text(max_size=40), st.lists(TOKENS, max_size=20).map("".join)))
def test_fuzz_cli(text: str) -> None:
    result = CliRunner().invoke(cli, ["uri", "explain", "--json", "--", text])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2), (result.exit_code, result.output)
    if result.exit_code == 2:
        assert result.stdout == ""
        assert result.stderr.startswith("error: ")
        assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n")
    else:
        assert result.stderr == ""
        human = CliRunner().invoke(cli, ["uri", "explain", "--", text])
        assert human.exit_code == 0 and human.stdout.startswith("canonical: ")
