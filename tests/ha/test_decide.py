"""decide.py against its own table, over every combination of its inputs.

The table in decide.py's docstring (the same rows are in docs/ha.md) is read as a
specification: each "when" cell is a list of conditions from the vocabulary below, the
first row of a phase whose conditions all hold says what must happen. For every input
the enumeration builds, :func:`decide` (or :func:`standby`) must answer that row's
outcome; every row must be the first match for some input (no dead rows); and a
decision never asks for an observation the node has already made.
"""

from __future__ import annotations

import itertools
import re
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from amqtransport.broker.ha import decide as dm
from amqtransport.broker.ha.decide import (
    DecideOptions,
    Decision,
    NodeState,
    PeerAnswer,
    Peers,
    decide,
    standby,
)

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (start|link-lost|master|slave-lost|stand-by) \| (\d+) \| (.+?) \| (.+?) \|$")

NAME, EPOCH = "b", 3
A1, A2 = ("10.0.0.1", 1), ("10.0.0.2", 2)
CONNECTOR = "tcp://10.0.0.1:1"  # = A1
CHECK_ADDR = ("10.9.9.9", 9)
WITNESS_ADDR = ("10.8.8.8", 8)


def table_rows(text: str) -> list[tuple[str, int, list[str], str]]:
    rows = []
    for line in text.splitlines():
        m = ROW.match(line.strip())
        if m:
            rows.append((m[1], int(m[2]), [c.strip() for c in m[3].split(";")], m[4].strip()))
    return rows


ROWS = table_rows(dm.__doc__ or "")


@dataclass(frozen=True)
class Case:
    state: NodeState
    options: DecideOptions
    peers: Peers
    requester: str = "a"  # stand-by
    requester_epoch: int = EPOCH


# ---------------------------------------------------------------------- the vocabulary
def _infos(c: Case) -> list[Mapping[str, str]]:
    return [a.info for a in c.peers.answers or () if a.info is not None]


def _first(c: Case) -> PeerAnswer | None:
    return next((a for a in c.peers.answers or () if a.info is not None), None)


def _info(c: Case) -> Mapping[str, str]:
    a = _first(c)
    return a.info if a is not None and a.info is not None else {}


def _epoch(info: Mapping[str, str]) -> int:
    raw = info.get("amq-ha-epoch", "")
    return int(raw) if raw.isdigit() else 0


def _claim_is_better(c: Case) -> bool:
    """The peer's claim beats ours: (synced epoch, undamaged journal, last role master,
    configured master), then the lower name."""
    info = _info(c)
    theirs = (_epoch(info) if info.get("amq-ha-synced") == "true" else -1, info.get("amq-ha-damaged") != "true",
              info.get("amq-ha-last-role") == "master", info.get("amq-ha-configured") == "master")
    ours = (c.state.epoch, not c.state.damaged, c.state.last_role == "master", c.options.master_connector is None)
    return theirs > ours or (theirs == ours and info.get("amq-ha-name", "") < c.options.name)


CONDITIONS: dict[str, Callable[[Case], bool]] = {
    "otherwise": lambda c: True,
    "not asked": lambda c: c.peers.answers is None,
    "an address answers as master": lambda c: any(i.get("amq-ha-role") == "master" for i in _infos(c)),
    "store not synced": lambda c: not c.state.synced,
    "store synced": lambda c: c.state.synced,
    "the peer answers": lambda c: _first(c) is not None,
    "its claim is better": _claim_is_better,
    "last role slave": lambda c: c.state.last_role == "slave",
    "last role master": lambda c: c.state.last_role == "master",
    "master strict": lambda c: c.state.master_strict,
    "a slave synced from us": lambda c: c.state.peer_may_be_master,
    "configured as master": lambda c: c.options.master_connector is None,
    "shutdown on master failure": lambda c: c.options.shutdown_on_master_failure,
    "shutdown on slave failure": lambda c: c.options.shutdown_on_slave_failure,
    "takeover check not tried": lambda c: c.options.takeover_check is not None and c.peers.check is None,
    "takeover check unreachable": lambda c: c.options.takeover_check is not None and c.peers.check is False,
    "the peer is master": lambda c: _info(c).get("amq-ha-role") == "master",
    "its epoch is newer": lambda c: _epoch(_info(c)) > c.state.epoch,
    "same epoch": lambda c: _epoch(_info(c)) == c.state.epoch,
    "its name is lower": lambda c: _info(c).get("amq-ha-name", "?") < c.options.name,
    "the peer stands by": lambda c: (a := _first(c)) is not None and a.standby == "ok",
    "the peer says in-sync": lambda c: (a := _first(c)) is not None and a.standby == "in-sync",
    "it is our in-sync slave": lambda c: c.state.linked_to == _info(c).get("amq-ha-name", "?"),
    "the peer's synced store is newer": lambda c: _info(c).get("amq-ha-synced") == "true"
    and _epoch(_info(c)) > c.state.epoch,
    "no peer known": lambda c: c.peers.answers == (),
    "every address refuses": lambda c: bool(c.peers.answers) and all(a.refused for a in c.peers.answers or ()),
    "held within the refusal window": lambda c: c.state.held_for <= c.options.refusal_window,
    "not asked again": lambda c: c.peers.again is None,
    "an address answers as master again": lambda c: any(
        a.info is not None and a.info.get("amq-ha-role") == "master" for a in c.peers.again or ()),
    "the master handed over": lambda c: c.state.handed_over,
    "the master did not hand over": lambda c: not c.state.handed_over,
    "the slave said goodbye": lambda c: c.state.goodbye,
    "the slave was not in sync": lambda c: not c.state.slave_was_synced,
    "this node is master": lambda c: c.state.role == "master",
    "its epoch is newer than the requester's": lambda c: c.state.epoch > c.requester_epoch,
    "our link to the requester is up and in sync": lambda c: c.state.linked_to == c.requester,
    "no witness": lambda c: c.options.witness is None,
    "the witness not asked": lambda c: c.options.witness is not None and c.peers.witness is None,
    "the witness grants": lambda c: c.options.witness is not None and c.peers.witness is True,
}


def expected(phase: str, c: Case) -> tuple[str, tuple[str, int]]:
    """(outcome, row) of the first row of ``phase`` that matches ``c``."""
    for ph, n, conds, then in ROWS:
        if ph == phase and all(CONDITIONS[cond](c) for cond in conds):
            if then == "master (checked)":
                if c.options.takeover_check is not None and c.peers.check is None:
                    then = "check"
                elif c.options.takeover_check is not None and not c.peers.check:
                    then = "wait"
                elif c.options.witness is not None and c.peers.witness is None:
                    then = "ask-witness"
                elif c.options.witness is not None and not c.peers.witness:
                    then = "wait"
                else:
                    then = "master"
            return then, (ph, n)
    raise AssertionError(f"no row of phase {phase} matches {c}")


def run(phase: str, c: Case) -> Decision:
    if phase == "stand-by":
        return standby(c.state, c.options, c.requester, c.requester_epoch)
    return decide(c.state, c.options, c.peers)


# ---------------------------------------------------------------------- the inputs
def infos(fields: Mapping[str, tuple[str | None, ...]]) -> Iterator[dict[str, str]]:
    keys = list(fields)
    for values in itertools.product(*(fields[k] for k in keys)):
        yield {k: v for k, v in zip(keys, values, strict=True) if v is not None}


PEER = {
    "amq-ha-role": ("master", "slave", "waiting"),
    "amq-ha-epoch": ("2", "3", "4"),
    "amq-ha-synced": ("true", "false"),
    "amq-ha-last-role": ("master", "slave"),
    "amq-ha-configured": ("master", "slave"),
    "amq-ha-name": ("a", "c"),
    "amq-ha-port": (None, "10.0.0.9:9"),
    "amq-ha-damaged": (None, "true"),
}
FEW = [  # a few different peers, for answers of two addresses
    {"amq-ha-role": "master", "amq-ha-epoch": "4", "amq-ha-name": "a", "amq-ha-synced": "true"},
    {"amq-ha-role": "master", "amq-ha-epoch": "2", "amq-ha-name": "c", "amq-ha-port": "10.0.0.9:9"},
    {"amq-ha-role": "slave", "amq-ha-epoch": "4", "amq-ha-name": "a", "amq-ha-synced": "true"},
    {"amq-ha-role": "waiting", "amq-ha-epoch": "2", "amq-ha-name": "c", "amq-ha-synced": "false",
     "amq-ha-last-role": "master", "amq-ha-configured": "master"},
]
STANDBY = (None, "ok", "in-sync", "refused")


def answer_lists(peers: list[dict[str, str]], standbys: tuple[str | None, ...] = (None,)) -> Iterator[
        tuple[PeerAnswer, ...] | None]:
    yield None
    yield ()
    silent = [PeerAnswer(A1, error="timed out"), PeerAnswer(A1, refused=True)]
    yield from ((a,) for a in silent)
    for info, sb in itertools.product(peers, standbys):
        yield (PeerAnswer(A1, info=info, standby=sb, standby_reason="why" if sb else ""),)
    firsts = [PeerAnswer(A1, error="timed out"), PeerAnswer(A1, refused=True),
              *(PeerAnswer(A1, info=i) for i in FEW)]
    seconds = [PeerAnswer(A2, error="timed out"), PeerAnswer(A2, refused=True),
               *(PeerAnswer(A2, info=i, standby=sb) for i in FEW for sb in standbys)]
    yield from itertools.product(firsts, seconds)


def check_options() -> Iterator[tuple[tuple[str, int] | None, bool | None]]:
    """(--takeover-check, what it answered): not set, or set and not tried/up/down."""
    yield None, None
    for answered in (None, True, False):
        yield CHECK_ADDR, answered


def witness_options() -> Iterator[tuple[tuple[str, int] | None, bool | None]]:
    """(--witness, what it answered): not set, or set and not asked/granted/refused."""
    yield None, None
    for answered in (None, True, False):
        yield WITNESS_ADDR, answered


def states(phase: str, **fixed: object) -> Iterator[NodeState]:
    dims = {
        "synced": (True, False), "last_role": ("none", "master", "slave"), "peer_may_be_master": (False, True),
        "master_strict": (False, True), "damaged": (False, True),
    }
    for values in itertools.product(*dims.values()):
        kw = dict(zip(dims, values, strict=True))
        kw.update(fixed)
        yield NodeState(phase, epoch=EPOCH, **kw)  # type: ignore[arg-type]


def cases(phase: str) -> Iterator[Case]:
    if phase == "start":
        for st, connector, (check, answered), shut, answers in itertools.product(
            states(phase), (None, CONNECTOR), check_options(), (False, True), answer_lists(list(infos(PEER)))
        ):
            opts = DecideOptions(NAME, connector, check, shut, shut)
            yield Case(st, opts, Peers(answers, answered))
        # with a witness (a takeover check passed or not set): every master (checked)
        # row asks it first and waits while it does not grant
        for st, connector, (check, answered), (witness, granted), answers in itertools.product(
            states(phase), (None, CONNECTOR), ((None, None), (CHECK_ADDR, True)),
            [w for w in witness_options() if w[0] is not None], answer_lists(FEW)
        ):
            opts = DecideOptions(NAME, connector, check, False, False, witness)
            yield Case(st, opts, Peers(answers, answered, granted, "said so" if granted is not None else ""))
    elif phase == "link-lost":
        small = list(infos({k: PEER[k] for k in ("amq-ha-role", "amq-ha-epoch", "amq-ha-synced")}))
        for st, connector, (check, answered), smf, answers, (witness, granted) in itertools.product(
            states(phase), (None, CONNECTOR), check_options(), (False, True), answer_lists(small), witness_options()
        ):
            yield Case(st, DecideOptions(NAME, connector, check, smf, False, witness),
                       Peers(answers, answered, granted, "said so" if granted is not None else ""))
        # without a witness, the second probe (confirm): no master again, or a master again
        agains: list[tuple[PeerAnswer, ...]] = [
            (), (PeerAnswer(A1, refused=True),), (PeerAnswer(A1, error="timed out"), PeerAnswer(A2, refused=True)),
            *((PeerAnswer(A1, refused=True), PeerAnswer(A2, info=i)) for i in FEW)]
        firsts = [(PeerAnswer(A1, refused=True), PeerAnswer(A2, refused=True)),
                  (PeerAnswer(A1, error="timed out"),), (PeerAnswer(A1, info=FEW[2]),)]
        for st, (check, answered), answers, again in itertools.product(
            states(phase), check_options(), firsts, agains
        ):
            yield Case(st, DecideOptions(NAME, CONNECTOR, check), Peers(answers, answered, again=again))
        # the master handed over on the link (signed): whatever the probes would say, and
        # whether or not they were made (a node that decides again after isolated)
        for st, connector, (check, answered), smf, answers, (witness, granted), again in itertools.product(
            states(phase, handed_over=True), (None, CONNECTOR), check_options(), (False, True),
            [None, (PeerAnswer(A1, refused=True),), (PeerAnswer(A1, info=FEW[0]),)], witness_options(),
            (None, (PeerAnswer(A1, info=FEW[0]),)),
        ):
            yield Case(st, DecideOptions(NAME, connector, check, smf, False, witness),
                       Peers(answers, answered, granted, "said so" if granted is not None else "", again=again))
    elif phase == "master":
        for linked, synced, answers, (witness, granted) in itertools.product(
            (None, "a", "c"), (True, False), answer_lists(list(infos(PEER)), STANDBY), witness_options()
        ):
            st = NodeState(phase, epoch=EPOCH, synced=synced, role="master", linked_to=linked)
            yield Case(st, DecideOptions(NAME, witness=witness), Peers(answers, witness=granted))
        # receipts held within the refusal window, at its edge, or past it (refusals then prove nothing)
        refusing = [(PeerAnswer(A1, refused=True),), (PeerAnswer(A1, refused=True), PeerAnswer(A2, refused=True)),
                    (PeerAnswer(A1, refused=True), PeerAnswer(A2, error="timed out"))]
        for held, window, answers, (witness, granted) in itertools.product(
            (0.0, 1.0, 1.5, 30.0), (1.0, 2.0), refusing, witness_options()
        ):
            st = NodeState(phase, epoch=EPOCH, role="master", held_for=held)
            yield Case(st, DecideOptions(NAME, witness=witness, refusal_window=window),
                       Peers(answers, witness=granted))
    elif phase == "slave-lost":
        for goodbye, was_synced, ssf, (check, answered) in itertools.product(
            (False, True), (False, True), (False, True), check_options()
        ):
            st = NodeState(phase, epoch=EPOCH, role="master", goodbye=goodbye, slave_was_synced=was_synced)
            yield Case(st, DecideOptions(NAME, None, check, False, ssf), Peers(None, answered))
    elif phase == "stand-by":
        for role, st, linked, req_epoch in itertools.product(
            ("master", "slave", "waiting"), states(phase), (None, "a", "c"), (2, 3, 4)
        ):
            st = NodeState(phase, epoch=EPOCH, synced=st.synced, last_role=st.last_role, master_strict=st.master_strict,
                           peer_may_be_master=st.peer_may_be_master, role=role, linked_to=linked)
            yield Case(st, DecideOptions(NAME), Peers(), requester="a", requester_epoch=req_epoch)


# ---------------------------------------------------------------------- the tests
def test_docs_state_the_same_table() -> None:
    """docs/ha.md shows decide.py's table, row for row."""
    docs = table_rows((ROOT / "docs" / "ha.md").read_text(encoding="utf-8"))
    assert ROWS, "no table found in decide.py's docstring"
    assert docs == ROWS


def test_every_condition_is_in_the_vocabulary() -> None:
    unknown = {c for _ph, _n, conds, _then in ROWS for c in conds} - set(CONDITIONS)
    assert not unknown, f"conditions the test cannot read: {unknown}"
    assert {ph for ph, *_ in ROWS} == set(dm.PHASES)
    for phase in dm.PHASES:
        numbers = [n for ph, n, *_ in ROWS if ph == phase]
        assert numbers == list(range(1, len(numbers) + 1)), f"{phase}: rows numbered {numbers}"


def test_the_phase_and_action_types_name_the_tables_phases_and_outcomes() -> None:
    """``Phase`` and ``Action`` (the Literal types of NodeState.phase and
    Decision.action) list exactly the table's phases and outcomes; ``master (checked)``
    is ``master``, ``check`` or ``wait``."""
    outcomes = ({then for *_, then in ROWS} - {"master (checked)"}) | {"master", "check", "wait"}
    assert set(dm.ACTIONS) == outcomes and len(dm.ACTIONS) == len(outcomes)
    assert dm.PHASES == typing.get_args(dm.Phase) == ("start", "link-lost", "master", "slave-lost", "stand-by")
    assert {ph for ph, *_ in ROWS} == set(dm.PHASES)


def check_table(phase: str, decide_fn: Callable[[str, Case], Decision] = run) -> int:
    """Every input of ``phase`` against the table; returns how many were checked."""
    hit: set[tuple[str, int]] = set()
    count = 0
    for c in cases(phase):
        want, row = expected(phase, c)
        got = decide_fn(phase, c)
        assert got.action == want, f"{phase} row {row[1]}: expected {want}, got {got} for {c}"
        assert got.action in dm.ACTIONS
        assert got.reason, f"a decision says why: {got}"
        if c.peers.answers is not None:
            assert got.action != "ask", c
        if c.peers.check is not None:
            assert got.action != "check", c
        if c.peers.witness is not None:
            assert got.action != "ask-witness", c
        if c.peers.again is not None:
            assert got.action != "confirm", c
        if c.state.handed_over:  # a slave the master handed over to neither probes nor waits for a refusal
            assert got.action not in ("ask", "confirm", "relink"), c
        hit.add(row)
        count += 1
    dead = {(ph, n) for ph, n, *_ in ROWS if ph == phase} - hit
    assert not dead, f"rows no input reaches first: {sorted(dead)}"
    return count


@pytest.mark.parametrize("phase", dm.PHASES)
def test_decisions_follow_the_table(phase: str) -> None:
    assert check_table(phase) > 30


def test_join_goes_through_the_connector_or_the_ha_port() -> None:
    master = {"amq-ha-role": "master", "amq-ha-name": "a", "amq-ha-port": "10.0.0.9:9"}
    st = NodeState("start", epoch=EPOCH)

    def join(options: DecideOptions, *answers: PeerAnswer) -> tuple[str, int] | None:
        d = decide(st, options, Peers(answers))
        assert d.action == "join"
        return d.address

    assert join(DecideOptions(NAME, CONNECTOR), PeerAnswer(A1, info=master)) == A1, "the connector names it"
    assert join(DecideOptions(NAME), PeerAnswer(A1, info=master)) == ("10.0.0.9", 9), "else its HA port"
    bare = {"amq-ha-role": "master", "amq-ha-port": "garbage"}
    assert join(DecideOptions(NAME), PeerAnswer(A2, info=bare)) == A2, "an unusable HA port: where it answered"
    slave = {"amq-ha-role": "slave", "amq-ha-epoch": "9", "amq-ha-synced": "true"}
    assert join(DecideOptions(NAME), PeerAnswer(A1, info=slave), PeerAnswer(A2, info=master)) == ("10.0.0.9", 9), \
        "a master on any address wins over a better claim on the first"


def test_master_verdicts_name_the_stale_master() -> None:
    """The examples of the old peercheck.judge test, with the address a demote goes to."""
    st = NodeState("master", epoch=EPOCH, role="master")

    def said(standby: str | None = None, **info: str) -> Peers:
        return Peers((PeerAnswer(A1, info={k.replace("_", "-"): v for k, v in info.items()}, standby=standby),))

    m = {"amq_ha_role": "master", "amq_ha_name": "a"}
    assert decide(st, DecideOptions(NAME), said(**m, amq_ha_epoch="4")).action == "step-down"
    stale = decide(st, DecideOptions(NAME), said(**m, amq_ha_epoch="2", amq_ha_port="10.0.0.1:99"))
    assert stale.action == "demote-peer" and stale.address == ("10.0.0.1", 99)
    assert decide(st, DecideOptions(NAME), said(**m, amq_ha_epoch="2")).address == A1, "no HA port: where it answered"
    refused = Peers((PeerAnswer(A1, refused=True), PeerAnswer(A2, refused=True)))
    assert decide(st, DecideOptions(NAME), refused).reason == \
        "the peer is not running (every address refuses: 10.0.0.1:1, 10.0.0.2:2)"


def test_an_unknown_phase_is_an_error() -> None:
    with pytest.raises(ValueError, match="no decision table for phase 'stand-by'"):
        decide(NodeState("stand-by"), DecideOptions(NAME), Peers())


def test_the_checker_catches_a_wrong_rule() -> None:
    """The table check can fail: a decide() that lets a store that is not a complete
    copy take over (what link-lost row 1 forbids) is caught."""

    def sloppy(phase: str, c: Case) -> Decision:
        st = c.state
        return decide(NodeState(st.phase, epoch=st.epoch, synced=True), c.options, c.peers)

    with pytest.raises(AssertionError, match="link-lost row 1: expected retry"):
        check_table("link-lost", sloppy)
