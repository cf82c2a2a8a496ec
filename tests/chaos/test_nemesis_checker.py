"""The nemesis's checker on hand-built histories: a clean one passes, and for every
rule a history that breaks it (and only it) fails with that rule, in the right round.

No broker here: the checker is a pure function of the history.
"""

from __future__ import annotations

import json
import os

import pytest

from chaos.nemesis.checker import RULES, check
from chaos.nemesis.feature_rules import FEATURE_RULES
from chaos.nemesis.history import (
    Ack,
    Delivery,
    Fault,
    History,
    ProbeRun,
    RoundRecord,
    Send,
    Subscriber,
    Sync,
    Tx,
)
from chaos.nemesis.roundcheck import RoundCheck

pytestmark = pytest.mark.chaos


def clean() -> History:
    """Two rounds (0-10 s, 10-20 s); one message of each kind, each delivered once,
    acked and the ack confirmed; node a serves until 12 s, b from 12.5 s."""
    h = History({"mode": "replicated"})
    h.extend([
        Subscriber("ci", "/queue/a", "client-individual"),
        Subscriber("auto", "/queue/b", "auto"),
        Subscriber("d1", "/topic/t", "client", durable=True),
        RoundRecord(1, 111, "replicated", 0.0, 10.0, "+1.0s kill-master", True, 1.0),
        RoundRecord(2, 222, "replicated", 10.0, 20.0, "+1.0s latency", True, 0.5),
        Send(1.0, "p1", "/queue/a", "k1", "rcpt", "ok", 1.1),
        Send(1.0, "p2", "/queue/b", "k2", "rcpt", "ok", 1.1),
        Send(1.5, "ff", "/queue/a", "f1", "ff", "none", 1.5),
        Tx(2.0, "tx", "/topic/t", "tx-1", ("t1", "t2"), "committed", 2.2),
        Tx(3.0, "tx", "/topic/t", "tx-2", ("t3", "t4"), "aborted", 3.1, "TransactionRolledBack"),
        Tx(4.0, "tx", "/topic/t", "tx-3", ("t5", "t6"), "in-doubt", 4.5, "in doubt"),
        Fault(11.0, 13.0, 2, "latency", "a", "300 ms"),
    ])
    for sub, key, mid, gen, t in [("ci", "k1", "m1", 1, 1.2), ("auto", "k2", "m2", 1, 1.2), ("ci", "f1", "m3", 1, 1.6),
                                  ("d1", "t1", "m4", 1, 2.3), ("d1", "t2", "m5", 1, 2.3), ("d1", "t5", "m6", 1, 4.6),
                                  ("d1", "t6", "m7", 1, 4.6)]:
        h.add(Delivery(t, sub, key, mid, gen, "wire"))
        h.add(Delivery(t + 0.001, sub, key, mid, gen, "app"))
        if sub != "auto":
            h.add(Ack(t + 0.002, sub, key, gen))
    h.extend([Sync(5.0, "ci", 1, 1, 5.1, True), Sync(5.0, "auto", 1, 1, 5.1, True), Sync(5.0, "d1", 1, 1, 5.1, True)])
    h.extend([ProbeRun("a", True, 0.0, 0.01, 11.95, 11.96, 240), ProbeRun("a", False, 12.0, 12.2, 19.9, 20.0, 150),
              ProbeRun("b", False, 0.0, 0.01, 12.4, 12.45, 248), ProbeRun("b", True, 12.5, 12.51, 19.9, 19.91, 150)])
    h.t_end = 20.0
    return h


def rules_of(h: History, complete: bool = True) -> dict[str, int]:
    result = check(h, complete=complete)
    return {rule: n for rule, n in result.counts.items() if n}


def test_a_clean_history_passes() -> None:
    result = check(clean())
    assert result.ok, [v.summary for v in result.violations]
    assert result.stats["acks_confirmed"] == 7  # the auto delivery counts as its ack
    assert result.stats["txs_committed"] == 1 and result.stats["txs_aborted"] == 1
    assert result.stats["ff_delivered"] == 1 and result.stats["auto_missed"] == 0


def test_lost_receipted_send() -> None:
    h = clean()
    h.deliveries = [d for d in h.deliveries if not (d.key == "k1" and d.stage == "app")]
    result = check(h)
    assert rules_of(h) == {"lost": 1}
    v = result.violations[0]
    assert v.round == 1 and "k1" in v.summary and "ci" in v.summary
    assert v.excerpt[0]["record"] == "send" and v.excerpt[0]["key"] == "k1"
    assert any(e["record"] == "delivery" for e in v.excerpt)  # it was on the wire, never in the app
    assert rules_of(h, complete=False) == {}  # not judged before the final drain


def test_lost_committed_transaction_message_on_a_durable_subscriber() -> None:
    h = clean()
    h.deliveries = [d for d in h.deliveries if d.key != "t2"]
    h.acks = [a for a in h.acks if a.key != "t2"]
    assert rules_of(h) == {"lost": 1}


def test_an_auto_subscriber_missing_a_message_is_counted_not_failed() -> None:
    h = clean()
    h.deliveries = [d for d in h.deliveries if d.key != "k2"]
    result = check(h)
    assert result.ok and result.stats["auto_missed"] == 1


def test_unreceipted_sends_need_not_arrive() -> None:
    h = clean()
    h.sends.append(Send(6.0, "p1", "/queue/a", "k9", "rcpt", "unknown", 36.0, "SendTimeout"))
    h.sends.append(Send(6.0, "p1", "/queue/a", "k10", "rcpt", "fail", 6.1, "BrokerError: disk full"))
    assert check(h).ok


def test_duplicate_reaching_the_application() -> None:
    h = clean()
    h.add(Delivery(15.0, "ci", "k1", "m1-copy", 2, "wire"))
    h.add(Delivery(15.001, "ci", "k1", "m1-copy", 2, "app"))
    result = check(h)
    assert rules_of(h) == {"duplicate": 1, "redelivered-after-ack": 1}
    dup = next(v for v in result.violations if v.rule == "duplicate")
    assert dup.round == 2 and "2 times" in dup.summary and "m1-copy" in dup.summary
    assert any(e["record"] == "fault" for e in dup.excerpt)  # the latency fault of round 2


def test_duplicate_of_a_fire_and_forget_message() -> None:
    h = clean()
    h.add(Delivery(8.0, "ci", "f1", "m3b", 1, "app"))
    assert rules_of(h) == {"duplicate": 1}


def test_redelivery_after_a_durable_ack() -> None:
    h = clean()
    # the filter dropped it (no app delivery) but the broker sent it again: ack lost
    h.add(Delivery(14.0, "ci", "k1", "m1", 2, "wire"))
    result = check(h)
    assert rules_of(h) == {"redelivered-after-ack": 1}
    v = result.violations[0]
    assert v.round == 2 and "5.100" in v.summary
    assert v.excerpt[0]["record"] == "ack"


def test_redelivery_of_an_auto_acked_message() -> None:
    h = clean()
    h.add(Delivery(14.0, "auto", "k2", "m2", 2, "wire"))
    assert rules_of(h) == {"redelivered-after-ack": 1}


def test_redelivery_before_the_ack_was_known_durable_is_allowed() -> None:
    h = clean()
    h.add(Delivery(5.05, "ci", "k1", "m1", 2, "wire"))  # before the sync's receipt at 5.1
    assert check(h).ok


def test_a_sync_across_a_failover_confirms_nothing() -> None:
    h = clean()
    h.syncs = [Sync(5.0, s, 1, 2, 5.1, True) for s in ("ci", "auto", "d1")]  # receipted on a new link
    h.add(Delivery(14.0, "ci", "k1", "m1", 2, "wire"))
    result = check(h)
    assert result.ok and result.stats["acks_confirmed"] == 0


def test_a_sync_before_the_ack_confirms_nothing() -> None:
    h = clean()
    h.syncs = [Sync(1.0, s, 1, 1, 1.05, True) for s in ("ci", "auto", "d1")]
    h.add(Delivery(14.0, "ci", "k1", "m1", 2, "wire"))
    assert check(h).ok


def test_aborted_transaction_delivered() -> None:
    h = clean()
    h.add(Delivery(3.5, "d1", "t3", "m8", 1, "wire"))
    result = check(h)
    assert rules_of(h) == {"aborted-delivered": 1}
    assert "tx-2" in result.violations[0].summary


def test_partial_commit_in_doubt() -> None:
    h = clean()
    h.deliveries = [d for d in h.deliveries if d.key != "t6"]
    assert rules_of(h) == {"partial-commit": 1}
    assert rules_of(h, complete=False) == {}


def test_an_in_doubt_commit_that_delivered_nothing_is_fine() -> None:
    h = clean()
    h.deliveries = [d for d in h.deliveries if d.key not in ("t5", "t6")]
    h.acks = [a for a in h.acks if a.key not in ("t5", "t6")]
    assert check(h).ok


def test_two_masters_overlapping_runs() -> None:
    h = clean()
    h.probes.append(ProbeRun("b", True, 5.0, 5.01, 6.0, 6.01, 20))
    result = check(h)
    assert rules_of(h) == {"two-masters": 1}
    assert result.violations[0].round == 1 and "a and b" in result.violations[0].summary


def test_two_masters_one_probe_inside_the_others_serving_period() -> None:
    h = clean()
    h.probes.append(ProbeRun("b", True, 7.0, 7.02, 7.0, 7.02, 1))
    assert rules_of(h) == {"two-masters": 1}


def test_a_handover_between_probes_is_not_two_masters_but_a_warning() -> None:
    h = clean()
    # b's first answer came 10 ms after a's last probe started: a was not certainly serving then
    h.probes = [ProbeRun("a", True, 0.0, 0.01, 12.0, 12.05, 240), ProbeRun("b", True, 12.02, 12.06, 19.0, 19.01, 140)]
    result = check(h)
    assert result.ok
    assert [w.rule for w in result.warnings] == ["two-masters-suspect"] and result.stats["two_masters_suspect"] == 1
    assert check(clean()).warnings == []  # a's last answer at 11.96, b's first at 12.51: a clean handover


def test_unhealthy_round() -> None:
    h = clean()
    h.rounds[1] = h.rounds[1]._replace(healthy=False, detail="no slave in sync within 60 s")
    result = check(h)
    assert rules_of(h) == {"unhealthy": 1}
    assert result.violations[0].round == 2 and "no slave in sync" in result.violations[0].summary


def test_a_tracked_fire_and_forget_send_that_never_arrives_is_ff_lost() -> None:
    h = clean()
    h.add(Send(6.0, "ff", "/queue/a", "f2", "ff", "none", 6.0))
    result = check(h)
    assert rules_of(h) == {"ff-lost": 1}
    assert result.violations[0].round == 1 and "f2" in result.violations[0].summary
    assert check(h, complete=False).ok  # judged on the complete history only
    h.add(Send(7.0, "ff", "/queue/a", "f2", "ff", "unknown", 7.0, "connection lost for good"))
    assert check(h).ok  # its connection died for good: not a promise


def test_every_rule_has_a_failing_history_above() -> None:
    covered = {"lost", "ff-lost", "duplicate", "redelivered-after-ack", "aborted-delivered", "partial-commit", "two-masters",
               "unhealthy"}
    assert covered | set(FEATURE_RULES) == set(RULES)  # those: tests/chaos/test_nemesis_feature_rules.py


def test_counts_are_complete_past_the_kept_violations() -> None:
    h = clean()
    for i in range(80):
        h.add(Send(6.0, "p1", "/queue/a", f"x{i}", "rcpt", "ok", 6.1))
    result = check(h)
    assert result.counts["lost"] == 80 and len(result.violations) == 50


def test_history_json_round_trip_keeps_the_verdict() -> None:
    h = clean()
    h.add(Delivery(14.0, "ci", "k1", "m1", 2, "wire"))
    again = History.from_json(json.loads(json.dumps(h.to_json())))
    assert again.counts() == h.counts()
    assert check(again).to_json() == check(h).to_json()


def test_history_json_with_wrong_fields_is_refused() -> None:
    data = clean().to_json()
    data["sends"]["fields"] = ["t", "who"]
    with pytest.raises(ValueError, match="sends: fields"):
        History.from_json(data)


def test_the_rounds_quick_look_runs_in_a_process_of_its_own_and_sees_what_the_checker_sees() -> None:
    # in the workload's process its pure Python held the GIL against the clients' and the
    # proxies' threads: no byte moved for up to 2 s after each round (chaos/nemesis/runner.py)
    h = clean()
    h.add(Delivery(18.5, "d1", "z1", "m9", 2, "app"))
    h.add(Delivery(19.0, "d1", "z1", "m9b", 2, "app"))
    rc = RoundCheck()
    try:
        found = rc.violations(h.since(15.0, slack=1.0))
        assert [(v.rule, v.round) for v in found] == [("duplicate", 2)]
        assert rc.pid is not None and rc.pid != os.getpid()
        assert rc.violations(clean()) == [] and rc.pid is not None  # the same child, reused
    finally:
        rc.close()


def test_the_quick_look_at_recent_history_sees_recent_violations_only() -> None:
    h = clean()
    h.add(Delivery(1.5, "ci", "k1", "m1-old-copy", 1, "app"))  # an early duplicate (round 1)
    h.add(Delivery(18.5, "d1", "z1", "m9", 2, "app"))  # a late one (round 2)
    h.add(Delivery(19.0, "d1", "z1", "m9b", 2, "app"))
    recent = check(h.since(15.0, slack=1.0), complete=False)
    assert [(v.rule, v.round) for v in recent.violations] == [("duplicate", 2)]
    assert {(v.rule, v.round) for v in check(h).violations} >= {("duplicate", 1), ("duplicate", 2)}
    assert len(h.since(0.0).deliveries) == len(h.deliveries)
