"""Cross-check against an independent STOMP implementation: stomp.py's frame helpers.

Our serializer's bytes must mean the same frame to stomp.py's parser (1.2 escapes
included), and stomp.py's frames must parse the same with ours.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.stomp import Frame, FrameParser, serialize

stomp_utils = pytest.importorskip("stomp.utils", reason="stomp.py is a dev dependency")

# stomp.py decodes bodies nowhere here, but its header regex needs a non-empty name
# without ':'; its unescaper is the 1.2 table. Keep names free of characters that
# stomp.py's helpers mishandle by design (it unescapes only in 1.2 style).
names = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters=":\\"), min_size=1, max_size=12)
values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=16)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["SEND", "MESSAGE", "SUBSCRIBE", "ACK", "RECEIPT", "ERROR"]),
    st.lists(st.tuples(names, values), max_size=5, unique_by=lambda t: t[0]).filter(
        lambda hs: all(n != "content-length" for n, _ in hs)
    ),
    st.binary(max_size=64),
)
def test_stomppy_reads_our_frames(command: str, headers: list[tuple[str, str]], body: bytes) -> None:
    wire = serialize(Frame(command, tuple(headers), body), "1.2")
    assert wire.endswith(b"\x00")
    theirs = stomp_utils.parse_frame(wire[:-1])
    assert theirs.cmd == command
    expected = dict(headers)
    if body:
        expected["content-length"] = str(len(body))
    assert theirs.headers == expected
    assert theirs.body == body


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["SEND", "MESSAGE", "SUBSCRIBE", "ACK"]),
    st.dictionaries(
        st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters=":\\"), min_size=1, max_size=10),
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters=":\\"), max_size=10),
        max_size=5,
    ).filter(lambda hs: "content-length" not in hs),
    st.binary(max_size=64).filter(lambda b: b"\x00" not in b),
)
def test_we_read_stomppy_frames(command: str, headers: dict[str, str], body: bytes) -> None:
    frame = stomp_utils.Frame(command, dict(headers), body)
    wire = b"".join(stomp_utils.convert_frame(frame))
    parser = FrameParser("1.2")
    parser.feed(wire)
    ours = parser.next_event()
    assert isinstance(ours, Frame)
    assert ours.command == command
    assert ours.header_map == headers
    assert ours.body == body
