"""A master that leaves its role on purpose hands over; only a crash pays the wait (issue 24).

Without a witness a slave takes a refusal on every address of its master for a dead
master only when a second probe, the confirmation delay later, finds no master either
(decide.py, "Refusals": a live master's ports may refuse for a moment). A master that
stops (SIGTERM) or fences itself with an in-sync slave attached does not make its slave
wait for that: it ends the replication link with a ``HANDOVER`` frame, signed with the
cluster secret against the challenge the slave gave for that link, and the slave takes
over at once (decide.py, "Handovers"). Here: the handover's checks (pure), its wire
form (and a fuzz of its parser), and real processes -- SIGTERM hands over, SIGKILL
confirms first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import amqtransport
from amqtransport.broker.ha.auth import (
    AUTH_HEADER,
    HaRequest,
    RequestSigner,
    RequestVerifier,
    new_challenge,
)
from amqtransport.broker.ha.slave import handover_refusal
from amqtransport.broker.ha.wire import (
    HANDOVER,
    HANDOVER_HEADER,
    MAX_HANDOVER_BYTES,
    ReplicationError,
    WireDecoder,
    pack_handover,
    unpack_handover,
)
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(240)

SECRET = b"s3cret-s3cret-s3cret"
NOW = 1_000.0
CONFIRMING = "probing its addresses again"  # a slave's log: link-lost row 8 (confirm)
HANDED_OVER = "the master handed over"  # a slave's log: link-lost row 7


def handover(name: str = "a", epoch: int = 7, challenge: str = "", secret: bytes = SECRET) -> dict[str, str]:
    """The headers of a master's handover, signed as MasterRole does it."""
    headers = {HANDOVER_HEADER: name, "amq-ha-epoch": str(epoch), "amq-ha-client": "10.0.0.1:61613",
               "amq-ha-port": "10.0.0.1:61617"}
    return HaRequest(HANDOVER_HEADER, headers, RequestSigner(secret)).signed(challenge)


# ---------------------------------------------------------------------- the checks (pure)
def test_a_handover_counts_on_its_link_only_from_its_master_at_its_epoch() -> None:
    verifier = RequestVerifier(SECRET)
    link = new_challenge()
    good = handover(challenge=link)

    def refusal(headers: dict[str, str], challenge: str = link, master: str = "a", epoch: int = 7) -> str:
        return handover_refusal(verifier, headers, challenge, master, epoch, NOW) or ""

    assert handover_refusal(verifier, good, link, "a", 7, NOW) is None
    assert handover_refusal(verifier, good, link, "a", 7, NOW + 86_400) is None, "a link may live for days"
    assert "replayed" in refusal(good, challenge=new_challenge()), "another link's handover"
    assert "replayed" in refusal(handover(challenge=new_challenge()))
    assert "bad cluster secret" in refusal({**good, "amq-ha-epoch": "8"}), "a forged epoch breaks the MAC"
    assert "bad cluster secret" in refusal({**good, HANDOVER_HEADER: "c"})
    assert "bad cluster secret" in refusal(handover(challenge=link, secret=b"another-secret-xx"))
    assert "missing" in refusal({k: v for k, v in good.items() if k != AUTH_HEADER})
    assert "not from this link's master 'b'" in refusal(good, master="b")
    assert "not the link's (6)" in refusal(handover(epoch=7, challenge=link), epoch=6), "signed, but a stale epoch"
    # the link's challenge is not one of the verifier's status challenges: it cannot be spent there
    assert verifier.check(HANDOVER_HEADER, good, NOW) is not None


# ---------------------------------------------------------------------- the wire form
def test_a_handover_frame_round_trips_and_bad_ones_are_named() -> None:
    headers = handover(challenge=new_challenge())
    ((kind, payload),) = WireDecoder().feed(pack_handover(headers))
    assert kind == HANDOVER and unpack_handover(payload) == headers
    assert unpack_handover(b"") == {}
    for bad, what in ((b"\xff\xfe", "not UTF-8"), (b"no-colon", "not name:value"), (b":v", "not name:value"),
                      (b"a:1\na:2", "repeated"), (b"x" * (MAX_HANDOVER_BYTES + 1), "over the"),
                      ("\n".join(f"h{i}:v" for i in range(17)).encode(), "over the limit")):
        with pytest.raises(ReplicationError, match=what):
            unpack_handover(bad)
    with pytest.raises(ReplicationError, match="cannot be packed"):
        pack_handover({"a:b": "1"})
    with pytest.raises(ReplicationError, match="cannot be packed"):
        pack_handover({"a": "1\n2"})


@given(st.binary(max_size=600))
@settings(deadline=None, max_examples=400)
def test_the_handover_parser_fuzz_returns_headers_or_names_the_problem(data: bytes) -> None:
    try:
        out = unpack_handover(data)
    except ReplicationError as exc:
        assert str(exc)
    else:
        assert all(isinstance(k, str) and k and ":" not in k for k in out)


@given(st.dictionaries(st.text(alphabet=st.characters(blacklist_characters=":\n", blacklist_categories=("Cs",)),
                               min_size=1, max_size=20),
                       st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)),
                               max_size=40), max_size=16))
@settings(deadline=None, max_examples=200)
def test_packed_headers_come_back_unchanged(headers: dict[str, str]) -> None:
    ((_kind, payload),) = WireDecoder().feed(pack_handover(headers))
    assert unpack_handover(payload) == headers


# ---------------------------------------------------------------------- real processes
def _send(port: int, n: int, first: int = 0) -> None:
    conn = amqtransport.connect(f"tcp://127.0.0.1:{port}")
    try:
        for i in range(first, first + n):
            conn.send("/queue/handover", f"m{i}", headers={"seq": str(i)})  # receipted: on both disks
    finally:
        conn.close()


def _drain(port: int) -> list[int]:
    conn = amqtransport.connect(f"tcp://127.0.0.1:{port}")
    try:
        sub = conn.subscribe("/queue/handover", ack="client-individual")
        got = []
        while (m := sub.receive(3.0)) is not None:
            got.append(int(m.headers["seq"]))
            m.ack()
        return got
    finally:
        conn.close()


def test_sigterm_hands_over_at_once_and_sigkill_confirms_first(tmp_path: Path) -> None:
    """Before the handover, a stopped master's slave probed a second time, the
    confirmation delay later, as after a crash (the log said it was probing again)."""
    with BrokerPair("replicated", tmp_path / "pair", link_timeout=1.0) as pair:
        master = pair.wait_master()
        slave = pair.wait_in_sync()
        _send(master.port, 50)

        mark = len(slave.log_text())
        master.terminate()  # SIGTERM: the node stops on purpose
        assert pair.wait_master(30) is slave
        log = slave.log_text()[mark:]
        assert HANDED_OVER in log and "hands over at epoch" in log, log[-3000:]
        assert CONFIRMING not in log, "a handed-over slave waited as after a crash:\n" + log[-3000:]
        assert "handing over to the in-sync slave" in master.log_text()

        master.start()  # the old master comes back as the slave of the new one
        assert pair.wait_in_sync(60) is master
        _send(slave.port, 50, first=50)

        mark = len(master.log_text())
        slave.kill()  # SIGKILL: no handover; the refusals must persist
        assert pair.wait_master(30) is master
        log = master.log_text()[mark:]
        assert CONFIRMING in log and HANDED_OVER not in log, log[-3000:]
        assert sorted(_drain(master.port)) == list(range(100))
