"""The byte prefilter of a selective scan (broker/dispatch/scan.py): a paged record that
holds none of ``header_needles(selector.required)`` is a miss without decoding it. It
may only ever say "definitely not" where the full evaluation -- the message read back
(``materialize``), its selector view (``view_of``) -- says not-match too: checked on
generated headers (repeated names, the first one counting; JMS header names and the
headers they map from; values STOMP escapes on the wire, NULs that switch the record to
its JSON header encoding, needles hidden in bodies), plain ``Enq`` records, moved ones
and a topic message's ``Fan`` copy."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.dispatch.selection import view_of
from amqtransport.broker.store.pages import MOVED, pack
from amqtransport.broker.store.paging import materialize, record_fields
from amqtransport.broker.store.records import Enq, Fan, encode, header_needles
from amqtransport.selector import compile_selector, message_view

NAMES = ["k", "kk", "color", "type", "JMSType", "correlation-id", "JMSCorrelationID", "JMSXGroupID", "priority",
         "destination", "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_REPEAT", "persistent", "n", "é"]
VALUES = ["hit", "miss", "x", "", "a:b", "line\nbreak", "cr\rx", "back\\slash", "é", "nul\x00in", '"q"', "it's",
          '["k","hit"]', "\x00k\x00hit", "5", "05", "0", "\ud800"]
body = st.sampled_from([b"", b"x" * 20, b"\x00k\x00hit", b'["k","hit"]']) | st.binary(max_size=12)
SELECTED = {"type": "JMSType", "correlation-id": "JMSCorrelationID"}  # what a selector names them
IDS = ["k", "color", "JMSType", "JMSCorrelationID", "JMSXGroupID", "type", "AMQ_SCHEDULED_DELAY",
       "AMQ_SCHEDULED_REPEAT", "JMSPriority", "n", "destination", "JMSMessageID"]


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[tuple[str, str]], str]:
    """Headers and a selector drawn from the same few names and values (so that many
    selectors match), values that need escaping or the JSON encoding among them."""
    values = draw(st.lists(st.sampled_from(VALUES) | st.text(max_size=4), min_size=1, max_size=3, unique=True))
    value = st.sampled_from(values)
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
    hs = draw(st.lists(st.tuples(st.sampled_from(names), value), max_size=8))
    ids = [SELECTED.get(n, n) for n in names if SELECTED.get(n, n) in IDS]
    ident = st.sampled_from(ids) | st.sampled_from(IDS) if ids else st.sampled_from(IDS)
    if draw(st.booleans()):
        hs.append((draw(st.sampled_from(NAMES)), "nul\x00in"))  # the record's JSON header encoding

    def atom() -> str:
        name = draw(ident)
        if draw(st.booleans()):
            return f"{name} = {literal(draw(value))}"
        items = draw(st.lists(value, min_size=1, max_size=3))
        neg = "NOT " if draw(st.integers(0, 4)) == 0 else ""
        return f"{name} {neg}IN ({', '.join(literal(i) for i in items)})"

    text = atom()
    for _ in range(draw(st.integers(0, 2))):
        text = f"({text}) {draw(st.sampled_from(['AND', 'OR']))} {atom()}"
    if draw(st.integers(0, 3)) == 0:
        text = f"{text} AND n > 3" if draw(st.booleans()) else f"{text} OR n > 3"
    return hs, text


def _selector(text: str):  # type: ignore[no-untyped-def]
    try:
        return compile_selector(text)
    except Exception:  # noqa: BLE001 - a generated text ActiveMQ refuses (e.g. IN on a JMS name): nothing to check
        return None


MATCHED = [0]


@settings(max_examples=800, deadline=None, derandomize=True)  # (the same cases each run: see below)
@given(cases(), body, st.sampled_from(["enq", "moved", "fan"]))
@example(([("AMQ_SCHEDULED_DELAY", "05")], "AMQ_SCHEDULED_DELAY = '5'"), b"", "enq")  # a Long, converted
@example(([("AMQ_SCHEDULED_REPEAT", "x")], "AMQ_SCHEDULED_REPEAT = '0'"), b"", "enq")
@example(([("k", "miss"), ("k", "hit")], "k = 'hit'"), b"", "enq")  # the first one counts
@example(([("type", "x"), ("JMSType", "y")], "JMSType IN ('x', 'y')"), b"", "fan")
@example(([("k", "it's"), ("j", "nul\x00in")], "k = 'it''s' AND n IS NULL"), b"", "moved")
def test_the_prefilter_never_rules_out_a_match(case: tuple[list[tuple[str, str]], str], raw_body: bytes,
                                               kind: str) -> None:
    hs, text = case
    sel = _selector(text)
    if sel is None:
        return
    msg = Message(id="ID:p-1", destination="/queue/q" if kind != "fan" else "/topic/t", headers=tuple(hs),
                  body=raw_body, timestamp=1000.5, persistent=True)
    if kind == "fan":
        payload = encode(Fan(msg, ((1, "/queue/q"),)))
        pos = pack(1, 64)
    else:
        payload = encode(Enq(msg))
        pos = pack(1, 64, MOVED if kind == "moved" else 0)
    full = sel.matches(view_of(materialize(payload, pos, "/queue/q")))
    # the scan's own view of the record (no Message) says the same as the full one
    mid, dest, hdrs, ts, count = record_fields(payload, pos, "/queue/q")
    assert sel.matches(message_view(hdrs, message_id=mid, destination=dest, timestamp_ms=int(ts * 1000),
                                    delivery_count=count)) == full
    if sel.required is None:
        return
    candidate = any(n in payload for n in header_needles(sel.required))
    assert candidate or not full, f"{text!r} matches {hs!r} but the prefilter ruled it out"
    MATCHED[0] += full


def test_the_generated_cases_match_often_enough_to_mean_something() -> None:
    """(Runs after the property test in this module: its cases must include matches.)"""
    if MATCHED[0] == 0:
        test_the_prefilter_never_rules_out_a_match()
    assert MATCHED[0] >= 20, f"only {MATCHED[0]} generated cases matched"


@pytest.mark.parametrize(
    ("selector", "required"),
    [
        ("k = 'hit'", (("k", "hit"),)),
        ("k = 'hit' AND n > 3", (("k", "hit"),)),
        ("n > 3 AND k IN ('a', 'b')", (("k", "a"), ("k", "b"))),
        ("k = 'a' OR JMSType = 'x'", (("k", "a"), ("type", "x"), ("JMSType", "x"))),
        ("JMSCorrelationID = 'c'", (("correlation-id", "c"), ("JMSCorrelationID", "c"))),
        ("k = 'a' OR n > 3", None),  # one part implies no header value
        ("k <> 'a'", None),
        ("k NOT IN ('a')", None),
        ("NOT k = 'a'", None),  # (NOT k) = 'a'
        ("AMQ_SCHEDULED_DELAY = '5'", None),  # a Long, not the header's string
        ("JMSPriority = 4", None),
        ("type = 'x'", None),  # never a property: nothing to find, nothing to rule out
    ],
)
def test_what_a_selector_requires(selector: str, required: tuple[tuple[str, str], ...] | None) -> None:
    assert compile_selector(selector).required == required


def test_a_record_without_the_value_is_ruled_out_and_one_with_it_is_not() -> None:
    needles = header_needles((("k", "hit"),))

    def payload(*hs: tuple[str, str]) -> bytes:
        return encode(Enq(Message(id="ID:1", destination="/queue/q", headers=hs, body=b"hi", persistent=True)))

    assert not any(n in payload(("k", "miss"), ("kk", "hit")) for n in needles)
    assert any(n in payload(("a", "b"), ("k", "hit")) for n in needles)
    assert any(n in payload(("k", "hit"), ("nul", "a\x00b")) for n in needles)  # the JSON encoding


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.sampled_from([b"", b"\x00k\x00hit", b'["k","hit"]', b"\x00k\x00hi"]),
                          st.booleans()), min_size=1, max_size=40),
       st.integers(0, 3))
def test_the_segment_search_finds_every_record_holding_a_needle(
        records_: list[tuple[bytes, bytes, bool]], split: int) -> None:
    """SegmentReads.candidates, the scan's search of the segment bytes around the paged
    records: every record of the positions asked about that holds a needle is among the
    candidates (records not asked about, another queue's, sit between them)."""
    import tempfile
    from pathlib import Path

    from amqtransport.broker.store import Journal

    needles = header_needles((("k", "hit"),))
    with tempfile.TemporaryDirectory() as d:
        j = Journal(Path(d) / "j")
        list(j.recover())
        j.start()
        try:
            payloads = [(filler[:split] + inner + filler[split:]) or b"-" for filler, inner, _asked in records_]
            seg, off = j.append_at(payloads)
            assert j.flush(30)
            positions, wanted = [], []
            for payload, (_f, _inner, asked) in zip(payloads, records_, strict=True):
                if asked:
                    if any(n in payload for n in needles):
                        wanted.append(len(positions))
                    positions.append(pack(seg, off))
                off += len(payload) + 8  # the frame: length and CRC
            got = j.candidates(positions, needles)
            assert got == sorted(set(got)) and set(wanted) <= set(got)
            assert [j.read([positions[k]])[0] for k in wanted] == [payloads[k] for k in range(len(payloads))
                                                                   if records_[k][2] and any(n in payloads[k] for n in needles)]
        finally:
            j.close()
