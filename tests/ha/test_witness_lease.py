"""The witness's lease rules (ha/lease.py, pure, a fake clock) and docs/ha.md's witness state table.

The state table (who may serve when each of the three links is down) is read as a
specification and checked against a simulation made of the real pure pieces: the
witness's :func:`renew` / :func:`takeover` and the decision table (:func:`decide`,
phases ``master`` and ``link-lost``), over a run of renewals and takeover requests.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.broker.ha.decide import DecideOptions, NodeState, PeerAnswer, Peers, decide
from amqtransport.broker.ha.lease import (
    PairLease,
    dump_state,
    load_state,
    pair_id,
    pair_key,
    parse_request,
    release,
    renew,
    restored,
    takeover,
    takeover_epoch,
)
from amqtransport.broker.ha.node import HaNode
from amqtransport.broker.ha.slave import link_lost_probe_timeout
from amqtransport.broker.ha.witness import WitnessAnswer, _seconds, lease_seconds

ROOT = Path(__file__).resolve().parents[2]
KEY = pair_key(b"the-cluster-secret-of-a-pair")
LEASE = 2.0


def fresh() -> PairLease:
    return PairLease(KEY)


# ---------------------------------------------------------------------- the rules
def test_the_first_master_gets_the_lease_and_renews_it() -> None:
    v = renew(fresh(), "a", 1, False, LEASE, now=0.0)
    assert v.granted and v.changed and v.lease.holder == "a" and v.lease.expires == LEASE
    again = renew(v.lease, "a", 1, False, LEASE, now=1.0)
    assert again.granted and not again.changed, "a renewal that changes nothing durable is not written"
    assert again.lease.expires == 1.0 + LEASE


def test_a_slave_is_granted_mastership_only_once_the_masters_lease_ran_out() -> None:
    held = renew(fresh(), "a", 1, False, LEASE, now=0.0).lease
    early = takeover(held, "b", 2, LEASE, now=LEASE - 0.01)
    assert not early.granted and "holds the lease" in early.reason
    late = takeover(held, "b", 2, LEASE, now=LEASE)
    assert late.granted and late.changed and late.lease.holder == "b" and late.lease.epoch == 2
    # the old master, back, is fenced whatever the time
    for now in (LEASE, LEASE + 1, 1000.0):
        v = renew(late.lease, "a", 1, False, LEASE, now)
        assert not v.granted and v.fence
    # and a second takeover of the same epoch is not granted to the other node
    assert not takeover(late.lease, "a", 2, LEASE, now=1000.0).granted


def test_a_master_that_receipted_alone_is_never_replaced_by_its_stale_slave() -> None:
    alone = renew(fresh(), "a", 1, True, LEASE, now=0.0)
    assert alone.granted and alone.lease.alone
    for now in (1.0, LEASE, 100.0):
        v = takeover(alone.lease, "b", 2, LEASE, now)
        assert not v.granted
    assert "lack receipted messages" in takeover(alone.lease, "b", 2, LEASE, 100.0).reason
    # once it says it has an in-sync slave again, that slave may take over after the lease
    synced = renew(alone.lease, "a", 1, False, LEASE, now=5.0)
    assert synced.changed and not synced.lease.alone
    assert takeover(synced.lease, "b", 2, LEASE, now=5.0 + LEASE).granted


def test_epochs_fence() -> None:
    held = renew(fresh(), "b", 5, False, LEASE, now=0.0).lease
    stale = renew(held, "b", 4, False, LEASE, now=1.0)
    assert not stale.granted and stale.fence, "the holder at an older epoch (a wiped store) is refused"
    assert not takeover(held, "a", 5, LEASE, now=100.0).granted, "a takeover must be for a newer epoch"
    newer = renew(held, "a", 6, False, LEASE, now=1.0)
    assert not newer.granted and not newer.fence, "a newer master waits for the holder's lease"
    assert renew(held, "a", 6, False, LEASE, now=LEASE).granted


def test_a_grant_the_other_node_never_used_does_not_lock_the_pair_out() -> None:
    """Issue 24 (nemesis seeds 77071/77073): master a at epoch 7 is frozen; the witness
    grants slave b epoch 8, but b agreed to stand by for the thawed a meanwhile (its copy
    is no longer complete: it never serves). a's renewal is fenced and a steps down. a,
    whose store is the complete one, must be able to take over again: asking at its own
    epoch + 1 (8) it is refused for ever; it asks at the witness's epoch + 1."""
    held = renew(fresh(), "a", 7, False, LEASE, now=0.0).lease
    granted = takeover(held, "b", 8, LEASE, now=LEASE)
    assert granted.granted and granted.lease.holder == "b" and granted.lease.epoch == 8
    fenced = renew(granted.lease, "a", 7, False, LEASE, now=LEASE + 1)
    assert not fenced.granted and fenced.fence
    for now in (LEASE + 1, 2 * LEASE, 1000.0):  # b never renews: its lease runs out
        assert not takeover(granted.lease, "a", 7 + 1, LEASE, now).granted, "the deadlock of issue 24"
    epoch = takeover_epoch(7, granted.lease.epoch)
    assert epoch == 9
    early = takeover(granted.lease, "a", epoch, LEASE, now=2 * LEASE - 0.01)
    assert not early.granted and "holds the lease" in early.reason, "never while b's lease may run"
    late = takeover(granted.lease, "a", epoch, LEASE, now=2 * LEASE)
    assert late.granted and late.lease.holder == "a" and late.lease.epoch == 9
    # b, were it serving on that grant after all, is fenced by a's newer epoch
    assert renew(late.lease, "b", 8, False, LEASE, now=2 * LEASE + 0.1).fence


def test_the_witness_epoch_does_not_override_a_holder_that_receipted_alone() -> None:
    alone = renew(takeover(renew(fresh(), "a", 7, False, LEASE, 0.0).lease, "b", 8, LEASE, LEASE).lease,
                  "b", 8, True, LEASE, now=LEASE + 0.5).lease
    for now in (2 * LEASE, 100.0):
        assert not takeover(alone, "a", takeover_epoch(7, alone.epoch), LEASE, now).granted
    assert "lack receipted messages" in takeover(alone, "a", takeover_epoch(7, alone.epoch), LEASE, 100.0).reason


def test_a_master_handing_over_releases_its_lease_and_its_slave_is_granted_at_once() -> None:
    """Issue 24: a master that hands over to its in-sync slave (it stops, or its disk is
    full) gives its lease back; before, the slave waited out a lease nobody used (about
    2 x --link-timeout with nothing served)."""
    alone = renew(fresh(), "a", 7, True, LEASE, now=0.0).lease  # even after a renewal that said alone
    out = release(alone, "a", 7, now=0.5)
    assert out.granted and out.changed and not out.lease.alone and out.lease.remaining(0.5) == 0
    granted = takeover(out.lease, "b", 8, LEASE, now=0.5)
    assert granted.granted and granted.lease.holder == "b"
    # the old holder renews nothing after it: its renewal at the old epoch is fenced
    assert renew(granted.lease, "a", 7, False, LEASE, now=0.6).fence
    # a release from anyone else, or at an older epoch, changes nothing
    held = renew(fresh(), "a", 7, False, LEASE, now=0.0).lease
    for node, epoch in (("b", 7), ("b", 9), ("a", 6)):
        v = release(held, node, epoch, now=0.5)
        assert not v.granted and v.lease == held and "nothing to release" in v.reason
        assert not takeover(v.lease, "b", 8, LEASE, now=0.5).granted
    # a released lease is not extended: a takeover after it is granted whatever the time
    assert release(held, "a", 7, now=5.0).lease.expires == LEASE


@given(st.floats(0.05, 400.0))  # a lease is at most 600 s (MAX_LEASE)
def test_a_slave_notices_and_probes_a_silent_master_within_its_lease(link_timeout: float) -> None:
    """Issue 24: the slave of a frozen or cut-off master notices after the link timeout,
    probes the master's addresses, then asks the witness, which grants once the lease ran
    out. Were the probe to end after the lease, it alone would keep the pair without a
    master (before: a 1 s probe after 1 s of silence against a 2 s lease -- and the lease
    itself was what a killed master's slave waited for)."""
    lease = lease_seconds(link_timeout)
    assert link_timeout + link_lost_probe_timeout(link_timeout, witness=True) <= lease + 1e-9
    assert lease > link_timeout, "a master frozen shorter than the link timeout is not seen as stalled: its lease guards"


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_takeover_epoch_is_newer_than_both(own: int, recorded: int) -> None:
    e = takeover_epoch(own, recorded)
    assert e > own and e > recorded and e in (own + 1, recorded + 1)


def test_a_restarted_witness_does_not_grant_twice() -> None:
    """The durable record read back at start counts the lease as renewed then."""
    held = renew(fresh(), "a", 1, False, LEASE, now=0.0).lease
    pairs = load_state(dump_state({pair_id(KEY): held}), now=500.0)  # the clock restarted elsewhere
    back = pairs[pair_id(KEY)]
    assert (back.holder, back.epoch, back.alone, back.lease) == ("a", 1, False, LEASE)
    assert not takeover(back, "b", 2, LEASE, now=500.0 + LEASE - 0.01).granted
    assert takeover(back, "b", 2, LEASE, now=500.0 + LEASE).granted
    granted = takeover(back, "b", 2, LEASE, now=500.0 + LEASE).lease
    again = load_state(dump_state({pair_id(KEY): granted}), now=0.0)[pair_id(KEY)]
    assert not renew(again, "a", 1, False, LEASE, now=1e6).granted
    assert restored(fresh(), 10.0).expires == 0.0


# ---------------------------------------------------------------------- parsers
def test_parse_request_names_the_bad_header() -> None:
    ok = {"amq-ha-epoch": "3", "amq-witness-lease": "2", "amq-witness-alone": "true"}
    assert parse_request(ok) == (3, 2.0, True)
    for key, bad in (("amq-ha-epoch", "-1"), ("amq-witness-lease", "nan"), ("amq-witness-lease", "1e9"),
                     ("amq-witness-alone", "yes")):
        with pytest.raises(ValueError, match=key):
            parse_request({**ok, key: bad})


def test_load_state_names_what_is_wrong() -> None:
    good = dump_state({pair_id(KEY): PairLease(KEY, "a", 1, False, 2.0)})
    assert load_state(good, 0.0)
    for raw, what in ((b"{", "not JSON"), (b"[]", "version"),
                      (good.replace(b'"epoch": 1', b'"epoch": -1'), "bad epoch"),
                      (good.replace(KEY.encode(), b"0" * 64), "does not match")):
        with pytest.raises(ValueError, match=what):
            load_state(raw, 0.0)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["amq-ha-epoch", "amq-witness-lease", "amq-witness-alone", "x"]),
                       st.text(max_size=30)))
def test_parse_request_fuzz(headers: dict[str, str]) -> None:
    try:
        epoch, lease, _alone = parse_request(headers)
    except ValueError as exc:
        assert str(exc)
    else:
        assert epoch >= 0 and 0.05 <= lease <= 600


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10).map(lambda v: repr(v).encode())))
def test_load_state_fuzz(raw: bytes) -> None:
    try:
        load_state(raw, 0.0)
    except ValueError as exc:
        assert str(exc)


# ---------------------------------------------------------------------- the state table
TABLE_ROW = re.compile(r"^\| (up|down) \| (up|down) \| (up|down) \| (master|slave|nobody) \|$")
WITNESS = ("10.8.8.8", 8)
SLAVE_ADDR = ("10.0.0.2", 2)
MASTER_ADDR = ("10.0.0.1", 1)


def table() -> list[tuple[bool, bool, bool, str]]:
    text = (ROOT / "docs" / "ha.md").read_text(encoding="utf-8")
    return [(m[1] == "up", m[2] == "up", m[3] == "up", m[4])
            for line in text.splitlines() if (m := TABLE_ROW.match(line.strip()))]


def who_serves(ms: bool, mw: bool, sw: bool) -> str:
    """Master a (epoch 1) with its in-sync slave b renews its lease; then the links
    ``ms`` (master-slave), ``mw`` (master-witness), ``sw`` (slave-witness) are as given,
    for ten leases: the master renews every third of a link timeout, the slave asks for
    mastership when its link is lost. Who serves at the end ("both" would be a split brain)."""
    link_timeout = LEASE / 2
    rec = renew(fresh(), "a", 1, False, LEASE, now=0.0).lease
    if ms:  # the nodes see each other: receipts wait for the slave's ack, the lease plays no part
        return "master"
    opts = DecideOptions("a", witness=WITNESS)
    slave_opts = DecideOptions("b", master_connector="tcp://10.0.0.1:1", witness=WITNESS)
    master_lease_until = LEASE * 0.9  # by the master's own count
    master_serving, slave_master = False, False
    master_state = NodeState("master", epoch=1, role="master")
    slave_state = NodeState("link-lost", epoch=1, synced=True, last_role="slave", role="slave")
    silent_slave = (PeerAnswer(SLAVE_ADDR, error="timed out"),)
    silent_master = (PeerAnswer(MASTER_ADDR, error="timed out"),)
    now = link_timeout  # the link is lost: both sides notice after the link timeout
    while now < 10 * LEASE:
        if not slave_master:  # the master (alone: no in-sync slave any more)
            d = decide(master_state, opts, Peers(silent_slave))
            assert d.action == "ask-witness"
            granted = False
            if mw:
                v = renew(rec, "a", 1, True, LEASE, now)
                rec, granted = v.lease, v.granted
                if granted:
                    master_lease_until = now + LEASE * 0.9
            d = decide(master_state, opts, Peers(silent_slave, witness=granted))
            master_serving = d.action == "lease" and now < master_lease_until
        if not slave_master:  # the slave
            d = decide(slave_state, slave_opts, Peers(silent_master))
            assert d.action == "ask-witness"
            granted = False
            if sw:
                v = takeover(rec, "b", 2, LEASE, now)
                rec, granted = v.lease, v.granted
            slave_master = decide(slave_state, slave_opts, Peers(silent_master, witness=granted)).action == "master"
        if slave_master and master_serving and now >= master_lease_until:
            master_serving = False  # its own count ran out before the witness's
        now += link_timeout / 3
    if master_serving and now >= master_lease_until:
        master_serving = False
    return {(True, False): "master", (False, True): "slave", (False, False): "nobody"}.get(
        (master_serving, slave_master), "both")


def test_the_docs_witness_table_covers_every_combination_once() -> None:
    rows = table()
    assert sorted((ms, mw, sw) for ms, mw, sw, _ in rows) == sorted(itertools.product((True, False), repeat=3))


@pytest.mark.parametrize("row", table(), ids=lambda r: "-".join("up" if x else "down" for x in r[:3]))
def test_the_docs_witness_table_follows_the_rules(row: tuple[bool, bool, bool, str]) -> None:
    ms, mw, sw, serves = row
    got = who_serves(ms, mw, sw)
    assert got != "both", f"split brain for links {row[:3]}"
    assert got == serves, f"links master-slave {ms}, master-witness {mw}, slave-witness {sw}: {got} serves"


# ---------------------------------------------------------------------- options
def test_the_witness_option_and_config_keys_are_checked(tmp_path: Path) -> None:
    import subprocess
    import sys

    from amqtransport.broker.config import load_config
    from amqtransport.broker.ha.config import HaOptions, load_ha_table
    from amqtransport.errors import ConfigError

    cfg = tmp_path / "b.toml"
    cfg.write_text('[broker]\nport = 61999\nwitness = "10.0.0.9:7000"\n\n[ha]\nmode = "replicated"\n'
                   'witness = "10.0.0.9:7001"\n')
    assert load_config(cfg).witness == "10.0.0.9:7000"
    assert load_ha_table(cfg)["witness"] == "10.0.0.9:7001"
    assert DecideOptions.of("a", HaOptions(witness="tcp://w:9", cluster_password="x" * 16)).witness == ("w", 9)
    cfg.write_text('[broker]\nwitness = "nowhere"\n')
    with pytest.raises(ConfigError, match="witness"):
        load_config(cfg)
    cfg.write_text('[ha]\nwitnes = "h:1"\n')
    with pytest.raises(ConfigError, match=r"unknown key 'ha.witnes' \(valid keys: .*witness"):
        load_ha_table(cfg)
    with pytest.raises(ConfigError, match="--witness"):
        HaOptions(witness="h", cluster_password="x" * 16).validate()
    # a shared store with a witness (sealed.py) needs the secret the witness knows the pair by
    with pytest.raises(ConfigError, match="and a pair with --witness\\) needs the pair's cluster secret"):
        HaOptions(mode="shared-store", witness="h:1").validate()
    HaOptions(mode="shared-store", witness="h:1", cluster_password="x" * 16).validate()
    with pytest.raises(ConfigError, match="--allow-failback does not go with --witness on a shared store"):
        HaOptions(mode="shared-store", witness="h:1", cluster_password="x" * 16, allow_failback=True).validate()
    base = [sys.executable, "-m", "amqtransport", "broker"]
    out = subprocess.run([*base, "run", "--port", "5", "--ha", "replicated", "--cluster-password", "x" * 16,
                          "--witness", "nope", "--data-dir", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--witness" in out.stderr, out.stderr
    out = subprocess.run([*base, "witness", "--port", "0", "--data-dir", str(tmp_path / "w")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--port" in out.stderr, out.stderr
    from amqtransport.processes.pair import BrokerPair

    bp = BrokerPair("replicated", tmp_path / "pair", witness="127.0.0.1:7000")  # not started
    for node in bp.nodes:
        cmd = node.command()
        assert cmd[cmd.index("--witness") + 1] == "127.0.0.1:7000", cmd
    out = subprocess.run([*base, "pair", "--help"], capture_output=True, text=True, timeout=30)
    assert "--witness" in out.stdout
    bad = tmp_path / "w2"
    bad.mkdir()
    (bad / "witness-state.json").write_text("{not json")
    out = subprocess.run([*base, "witness", "--port", "1", "--data-dir", str(bad)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "witness-state.json: not JSON" in out.stderr, out.stderr


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=20), st.floats(allow_nan=True).map(str)))
def test_the_lease_left_a_witness_says_parses_to_a_duration_or_nothing(text: str | None) -> None:
    """``amq-witness-remaining``: a slave waits that long before it asks again, so
    garbage, a negative or an infinite value must read as "not said"."""
    got = _seconds(text)
    assert got is None or 0 <= got < float("inf")
    if text is not None and re.fullmatch(r"\d{1,6}(\.\d{1,3})?", text):
        assert got == float(text)


class _RacingNode:
    """What ``HaNode._probe_beside_the_witness`` uses of its node: the witness's answer."""

    def __init__(self, answer: WitnessAnswer, after: float) -> None:
        self.answer, self.after = answer, after
        self.granted_epoch = 0
        self.name = "b"

    async def _takeover_answer(self) -> WitnessAnswer:
        await asyncio.sleep(self.after)
        return self.answer


def _race(node: _RacingNode, answers: tuple[PeerAnswer, ...], probe_s: float) -> tuple[Peers, float, bool]:
    """Run the race; the peers it returns, how long it took, whether the probe was cut."""
    cut = []

    async def ask() -> list[PeerAnswer]:
        try:
            await asyncio.sleep(probe_s)
        except asyncio.CancelledError:
            cut.append(True)
            raise
        return list(answers)

    async def run() -> tuple[Peers, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        peers = await HaNode._probe_beside_the_witness(node, ask, Peers())  # type: ignore[arg-type]
        return peers, loop.time() - started

    peers, took = asyncio.run(run())
    return peers, took, bool(cut)


SLAVE_STATE = NodeState("link-lost", epoch=1, synced=True, last_role="slave", role="slave")
SLAVE_OPTS = DecideOptions("b", master_connector="tcp://10.0.0.1:1", witness=WITNESS)


def test_a_grant_while_the_probe_of_a_silent_master_is_unanswered_ends_the_probe() -> None:
    """link-lost with a witness: the probe and the witness run side by side. A frozen
    master's probe (its kernel accepts, nothing answers) would run its whole timeout; the
    grant, which comes once that master's lease ran out, ends it: the takeover does not
    wait for it (before: the probe, then the witness; 0.5 s more per takeover)."""
    node = _RacingNode(WitnessAnswer(True, "the lease of master a ran out", epoch=2), after=0.05)
    peers, took, cut = _race(node, (PeerAnswer(MASTER_ADDR, error="timed out"),), probe_s=30.0)
    assert cut and took < 10
    assert peers.witness is True and peers.answers == () and node.granted_epoch == 2
    assert decide(SLAVE_STATE, SLAVE_OPTS, peers).action == "master"


def test_a_master_that_answers_the_probe_wins_over_the_witness() -> None:
    """A live master found by the probe: re-link, whatever the witness says meanwhile."""
    master = (PeerAnswer(MASTER_ADDR, info={"amq-ha-role": "master", "amq-ha-name": "a", "amq-ha-epoch": "1"}),)
    node = _RacingNode(WitnessAnswer(False, "the master a holds the lease for 1.0 s more"), after=30.0)
    peers, took, _cut = _race(node, master, probe_s=0.01)
    assert took < 10 and peers.answers == master and peers.witness is None
    assert decide(SLAVE_STATE, SLAVE_OPTS, peers).action == "relink"


@pytest.mark.parametrize("granted", [True, False])
def test_a_probe_nobody_answered_then_waits_for_the_witness(granted: bool) -> None:
    """A dead master's ports refuse at once: the witness's answer decides, as before."""
    node = _RacingNode(WitnessAnswer(granted, "said", epoch=2 if granted else 0), after=0.05)
    peers, _took, cut = _race(node, (PeerAnswer(MASTER_ADDR, refused=True),), probe_s=0.0)
    assert not cut and peers.witness is granted and node.granted_epoch == (2 if granted else 0)
    assert decide(SLAVE_STATE, SLAVE_OPTS, peers).action == ("master" if granted else "isolated")
