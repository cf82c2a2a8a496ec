"""Chaos scenarios against real brokers behind our Toxiproxy-compatible proxy.

Each test runs one short round (100 msg/s, about 1 s of traffic either side of the
fault) of a scenario on a real cluster (the proxy faults alternate between the two HA
modes, kill-master runs on both): our HA pair (child processes), one broker
killed and restarted in place (``single``), or a real ActiveMQ pair. The round's
invariants are the assertion: no receipted message lost, no duplicate delivered with
the client's dedupe on, recovery within the scenario's bound (and, for half-open,
detection within about two heart-beat intervals). Everything started is stopped by
``run_scenario`` even on failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from amqtransport.processes.activemq import missing_reason
from chaos.scenarios import SCENARIOS, RoundResult, RunParams, run_scenario
from chaos.scenarios.catalog import Scenario
from chaos.scenarios.cli import run_cli

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(150)]

FAST = RunParams(rate=100, window=16, warmup_s=1.0, post_s=1.0, drain_timeout_s=15)


def _one_round(name: str, mode: str, tmp_path: Path) -> RoundResult:
    results = run_scenario(name, mode, rounds=1, params=FAST, workdir=tmp_path)
    assert len(results) == 1
    r = results[0]
    print(r.line(1))
    assert r.ok, r.line(1)
    assert r.receipted >= 100 and r.received >= r.receipted and r.lost == 0 and r.duplicates == 0
    if SCENARIOS[name].broker_dedupes:
        # our broker drops the replay of a send it had receipted (same idempotency key)
        assert r.stored_twice_after_receipt == 0
    assert r.recovery_s is not None and 0 < r.recovery_s <= r.recovery_bound_s
    return r


@pytest.mark.parametrize("mode", ["replicated", "shared-store"])
def test_kill_master_on_the_pair(mode: str, tmp_path: Path) -> None:
    r = _one_round("kill-master", mode, tmp_path)
    assert r.master_after and r.master_after != r.master_before  # the slave took over
    assert r.reconnects >= 1


def test_kill_master_single_node_restart(tmp_path: Path) -> None:
    r = _one_round("kill-master", "single", tmp_path)
    assert r.reconnects >= 1


def test_partition_master(tmp_path: Path) -> None:
    r = _one_round("partition-master", "replicated", tmp_path)
    assert r.master_after == r.master_before  # the master lived through it
    assert r.recovery_s is not None and r.recovery_s >= SCENARIOS["partition-master"].hold_s * 0.9


def test_latency_spike(tmp_path: Path) -> None:
    r = _one_round("latency-spike", "shared-store", tmp_path)
    assert r.reconnects == 0  # 400 ms is well inside the 2 x 1 s heart-beat tolerance


def test_half_open_is_found_by_heartbeats(tmp_path: Path) -> None:
    r = _one_round("half-open", "replicated", tmp_path)
    sc = SCENARIOS["half-open"]
    assert r.detection_s is not None and sc.detection_bound_s is not None
    assert r.detection_s <= sc.detection_bound_s
    assert r.reconnects >= 1


def test_reset_peer(tmp_path: Path) -> None:
    r = _one_round("reset-peer", "shared-store", tmp_path)
    assert r.reconnects >= 1


def test_slow_close_is_found_by_heartbeats_before_the_late_close(tmp_path: Path) -> None:
    r = _one_round("slow-close", "replicated", tmp_path)
    assert r.master_after != r.master_before
    # nothing told the clients for 4 s: their heart-beats (2 x 1 s) noticed
    assert r.detection_s is not None and 1.5 <= r.detection_s <= 2.5
    assert r.recovery_s is not None and r.recovery_s >= 1.5


def test_bandwidth_starve(tmp_path: Path) -> None:
    r = _one_round("bandwidth-starve", "shared-store", tmp_path)
    assert r.reconnects == 0  # starved, not broken: no reconnect storm
    during = [s["receipted"] for s in r.samples if r.fault_at + 0.5 <= s["t"] < r.fault_at + 2.5]
    assert during and max(during) < 60  # throughput really collapsed under 2 KB/s


def test_bridge_remote_master_kill(tmp_path: Path) -> None:
    """Producer on a spoke, consumer on the hub pair, the bridge between them rebuilt
    on the new hub master after the SIGKILL: every receipted message arrives once."""
    r = _one_round("bridge-remote-master-kill", "replicated", tmp_path)
    assert r.master_after != r.master_before


@pytest.mark.activemq
def test_kill_master_against_real_activemq(tmp_path: Path) -> None:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    r = _one_round("kill-master-activemq", "activemq", tmp_path)
    assert r.master_after != r.master_before


def test_cli_run_prints_rounds_and_table_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "amqtransport", "chaos", "run", "kill-master", "--mode", "single",
         "--rounds", "1", "--rate", "100", "--report", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("kill-master[single] round 1/1:") and line.endswith("OK") for line in lines)
    assert any(line.startswith("scenario") and "recovery p50" in line for line in lines)
    doc = json.loads((out / "report.json").read_text())
    assert doc["ok"] is True and doc["summary"][0]["lost"] == 0
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_a_broken_invariant_fails_the_run(tmp_path: Path) -> None:
    """A kill cannot recover within 1 ms: the round fails and the exit status is 1."""
    name, broken = "test-impossible-recovery", "test-broken-fault"
    base = SCENARIOS["kill-master"]

    def explode(stage: object) -> str:
        raise RuntimeError("the fault itself broke")

    SCENARIOS[name] = Scenario(name=name, summary="kill-master with a 1 ms bound", inject=base.inject,
                               kills=True, recovery_bound_s=0.001)
    SCENARIOS[broken] = Scenario(name=broken, summary="a fault that raises", inject=explode)
    lines: list[str] = []
    try:
        code = run_cli([name, broken], rounds=1, report_dir=tmp_path / "rep", mode="single",
                       params=FAST, echo=lines.append, workdir=tmp_path)
    finally:
        del SCENARIOS[name], SCENARIOS[broken]
    assert code == 1
    assert any("FAIL: recovery" in line and "exceeds its bound" in line for line in lines), lines
    assert any(line.startswith(broken) and "fault injection/heal failed" in line
               and "the fault itself broke" in line for line in lines), lines
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["ok"] is False
