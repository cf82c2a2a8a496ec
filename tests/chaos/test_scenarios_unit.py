"""The scenario framework's pure parts: invariant judgement, recovery time, samples,
percentiles, the table, report.json and the PNG, the registry and the CLI's bad input.

No broker here (fast); the real runs are in test_scenarios.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from amqtransport.cli.main import cli
from amqtransport.errors import SendTimeout
from chaos.scenarios import SCENARIOS, RoundResult, RunParams, get_scenario, modes_for
from chaos.scenarios.catalog import Scenario
from chaos.scenarios.cli import expand_mode
from chaos.scenarios.report import format_table, percentile, summarize, write_report
from chaos.scenarios.runner import Observations, judge, recovery_time, samples_of
from chaos.scenarios.workload import body_of, seq_of

pytestmark = pytest.mark.chaos

PARAMS = RunParams(bin_s=1.0)


def _scenario(**kw: object) -> Scenario:
    base: dict[str, object] = {"name": "t", "summary": "t", "inject": lambda stage: "x",
                               "recovery_bound_s": 2.0}
    base.update(kw)
    return Scenario(**base)  # type: ignore[arg-type]


def _obs(n: int = 10, *, fault: float = 5.0, gap: float = 1.0, drop: tuple[int, ...] = (),
         **kw: object) -> Observations:
    """n messages sent once a second from t=0; those sent at/after the fault are
    receipted ``gap`` seconds after the fault."""
    sends = [float(i) for i in range(n)]
    receipts = [t + 0.01 if t < fault else max(t, fault + gap) for t in sends]
    received = {i: receipts[i] + 0.01 for i in range(n) if i not in drop}
    return Observations(send_times=sends, receipt_times=receipts, received=received, t0=0.0,
                        t_fault=fault, t_end=float(n), **kw)  # type: ignore[arg-type]


def _judge(obs: Observations, scenario: Scenario | None = None) -> RoundResult:
    sc = scenario or _scenario()
    return judge(RoundResult(scenario=sc.name, mode="single", round=1,
                             recovery_bound_s=sc.recovery_bound_s,
                             detection_bound_s=sc.detection_bound_s), obs, sc, PARAMS)


def test_a_clean_round_passes_and_counts() -> None:
    r = _judge(_obs(10, fault=5.0, gap=1.5))
    assert r.ok, r.failures
    assert (r.sent, r.receipted, r.received, r.lost, r.duplicates) == (10, 10, 10, 0, 0)
    assert r.recovery_s == pytest.approx(1.5)
    assert r.delivery_s == pytest.approx(1.51)  # the consumer's view of the same outage
    assert r.fault_at == 5.0


def test_a_receipted_message_never_received_is_lost() -> None:
    r = _judge(_obs(10, drop=(3, 7)))
    assert not r.ok
    assert r.lost == 2 and r.lost_sample == [3, 7]
    assert any("never received" in f for f in r.failures)


def test_an_unreceipted_message_that_never_arrived_is_not_lost() -> None:
    obs = _obs(10)
    obs.receipt_times = obs.receipt_times[:8]  # 8 and 9 were sent, never receipted
    del obs.received[9]
    r = _judge(obs)
    assert r.lost == 0 and r.receipted == 8 and r.received == 9


def test_a_duplicate_reaching_the_application_fails_but_deduped_copies_do_not() -> None:
    assert not _judge(_obs(duplicates=1)).ok
    r = _judge(_obs(deduped=5))
    assert r.ok and r.deduped == 5


def test_recovery_beyond_its_bound_fails() -> None:
    r = _judge(_obs(10, gap=3.0), _scenario(recovery_bound_s=2.0))
    assert not r.ok and any("exceeds its bound" in f for f in r.failures)


def test_no_receipt_after_the_fault_fails() -> None:
    obs = _obs(10, fault=5.0)
    obs.receipt_times = obs.receipt_times[:5]  # nothing sent at/after t=5 was receipted
    r = _judge(obs)
    assert r.recovery_s is None and not r.ok


def test_recovery_counts_only_messages_sent_after_the_fault() -> None:
    # seq 1 was in flight at the fault (sent 0.9, receipted 1.05): it does not count
    sends, receipts = [0.0, 0.9, 1.2, 1.3], [0.1, 1.05, 2.5, 2.6]
    assert recovery_time(sends, receipts, 1.0) == pytest.approx(1.5)
    assert recovery_time(sends, receipts[:2], 1.0) is None
    assert recovery_time(sends, receipts, 9.0) is None


def test_half_open_detection_bound() -> None:
    sc = _scenario(detection_bound_s=1.5)
    ok = _judge(_obs(producer_interruptions=[2.0, 6.0], consumer_interruptions=[6.2]), sc)
    assert ok.ok and ok.detection_s == pytest.approx(1.2)
    slow = _judge(_obs(producer_interruptions=[6.0], consumer_interruptions=[7.0]), sc)
    assert not slow.ok and slow.detection_s == pytest.approx(2.0)
    unnoticed = _judge(_obs(producer_interruptions=[6.0]), sc)
    assert not unnoticed.ok and any("never noticed" in f for f in unnoticed.failures)


def test_a_client_error_fails_the_round() -> None:
    r = _judge(_obs(producer_error=SendTimeout("gave up")))
    assert not r.ok and any("SendTimeout" in f for f in r.failures)


def test_samples_are_rates_per_bin() -> None:
    s = samples_of([0.1, 0.2, 0.6, 1.1], [0.15, 0.3, 1.2], [0.2], 0.0, 1.5, 0.5)
    assert [x["t"] for x in s] == [0.0, 0.5, 1.0]
    assert [x["sent"] for x in s] == [4.0, 2.0, 2.0]
    assert [x["receipted"] for x in s] == [4.0, 0.0, 2.0]
    assert [x["received"] for x in s] == [2.0, 0.0, 0.0]


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(1, 21))), 95) == pytest.approx(19.05)
    assert percentile([5.0, 1.0], 100) == 5.0


def test_bodies_round_trip_and_foreign_bodies_are_recognised() -> None:
    assert seq_of("r-1", body_of("r-1", 42)) == 42
    assert seq_of("r-1", body_of("r-2", 42)) is None
    assert seq_of("r-1", "r-1:x") is None


def _results() -> list[RoundResult]:
    out = []
    for i, rec in enumerate([0.5, 1.5, 1.0], start=1):
        r = _judge(_obs(12, fault=4.0, gap=rec))
        r.round = i
        out.append(r)
    bad = _judge(_obs(12, drop=(2,)))
    bad.scenario, bad.mode = "other", "replicated"
    out.append(bad)
    return out


def test_summary_and_table() -> None:
    rows = summarize(_results())
    assert [(s.label, s.rounds, s.lost, s.failed_rounds) for s in rows] == [
        ("t[single]", 3, 0, 0), ("other[replicated]", 1, 1, 1)]
    assert rows[0].recovery_p50 == pytest.approx(1.0) and rows[0].recovery_max == pytest.approx(1.5)
    table = format_table(rows)
    lines = table.splitlines()
    for col in ("scenario", "rounds", "sent", "receipted", "received", "lost", "duplicates",
                "recovery p50", "p95", "max"):
        assert col in lines[0]
    assert "t[single]" in lines[2] and lines[2].rstrip().endswith("ok")
    assert "FAIL (1 rounds)" in lines[3]


def test_write_report_makes_json_and_a_png(tmp_path: Path) -> None:
    paths = write_report(tmp_path / "rep", _results(), PARAMS)
    doc = json.loads(paths["json"].read_text())
    assert doc["ok"] is False
    assert {s["label"] for s in doc["summary"]} == {"t[single]", "other[replicated]"}
    assert len(doc["rounds"]) == 4 and doc["rounds"][0]["samples"]
    assert doc["params"]["bin_s"] == 1.0
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_registry_has_the_issue_scenarios() -> None:
    for name in ("kill-master", "partition-master", "latency-spike", "half-open", "reset-peer",
                 "slow-close", "bandwidth-starve", "kill-master-activemq"):
        assert name in SCENARIOS
    with pytest.raises(KeyError, match="known: .*kill-master"):
        get_scenario("kill-everything")


def test_modes() -> None:
    assert expand_mode("both") == ["replicated", "shared-store"]
    assert expand_mode("single") == ["single"]
    with pytest.raises(ValueError, match="--mode"):
        expand_mode("triple")
    assert modes_for(SCENARIOS["kill-master"], ["replicated", "shared-store"]) == ["replicated", "shared-store"]
    assert modes_for(SCENARIOS["kill-master-activemq"], ["replicated"]) == ["activemq"]


def test_cli_rejects_an_unknown_scenario_and_lists_the_known_ones() -> None:
    res = CliRunner().invoke(cli, ["chaos", "run", "kill-everything"])
    assert res.exit_code == 2
    assert "unknown scenario(s) kill-everything" in res.output and "half-open" in res.output
    res = CliRunner().invoke(cli, ["chaos", "run", "kill-master", "--mode", "triple"])
    assert res.exit_code == 2 and "--mode" in res.output
    res = CliRunner().invoke(cli, ["chaos", "run", "--list"])
    assert res.exit_code == 0 and "bandwidth-starve" in res.output


def test_a_receipted_send_stored_twice_fails_where_the_broker_dedupes_only() -> None:
    # seq 2 was receipted at 2.01 (before the fault at 5): a second copy is a dedupe failure
    ours = _judge(_obs(stored_twice_ids={2: ["ID:a-3", "ID:b-1"]}))
    assert not ours.ok and ours.stored_twice == 1 and ours.stored_twice_after_receipt == 1
    assert any("stored 1 send(s) twice" in f and "ID:b-1" in f for f in ours.failures)
    activemq = _judge(_obs(stored_twice_ids={2: ["x", "y"]}), _scenario(broker_dedupes=False))
    assert activemq.ok and activemq.stored_twice == 1


def test_an_in_flight_send_stored_again_is_at_least_once_not_a_failure() -> None:
    # seq 5 was sent at the fault and receipted only after it (by the new master)
    r = _judge(_obs(stored_twice_ids={5: ["ID:a-9", "ID:b-1", "ID:b-2"]}))
    assert r.ok and r.stored_twice == 2 and r.stored_twice_after_receipt == 0
    assert r.stored_twice_sample == ["5: ID:a-9, ID:b-1, ID:b-2"]


def test_recovery_by_delivery() -> None:
    sc = _scenario(recovery_by="delivery", recovery_bound_s=5.0)
    obs = _obs(10, fault=5.0, gap=0.2)
    obs.received[5] = 8.0  # the first message sent after the fault arrived 3 s after it
    r = _judge(obs, sc)
    assert r.ok and r.recovery_s == pytest.approx(3.0)
    del obs.received[5]
    obs.receipt_times = obs.receipt_times[:5]
    assert _judge(obs, sc).recovery_s is None
