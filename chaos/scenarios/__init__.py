"""Chaos scenarios: faults injected through the Toxiproxy-compatible proxy (or by
SIGKILL) while a receipted producer and a consumer run through a failover URI.

Public entry points::

    from chaos.scenarios import SCENARIOS, RunParams, run_scenario, run_scenarios
    results = run_scenario("kill-master", "replicated", rounds=3)
    assert all(r.ok for r in results)

``amq chaos run NAME... [--rounds N] [--report DIR] [--mode ...]`` does the same from
the command line and writes the report (``chaos.scenarios.report``).
"""

from chaos.harness.cluster import ALL_KINDS, EMBEDDED_MODES, ClusterError, Stage, make_cluster
from chaos.scenarios.catalog import SCENARIOS, Scenario, get_scenario, register
from chaos.scenarios.runner import (
    RoundResult,
    RunParams,
    modes_for,
    run_round,
    run_scenario,
    run_scenarios,
)

__all__ = [
    "SCENARIOS",
    "Scenario",
    "get_scenario",
    "register",
    "ALL_KINDS",
    "EMBEDDED_MODES",
    "ClusterError",
    "Stage",
    "make_cluster",
    "RoundResult",
    "RunParams",
    "modes_for",
    "run_round",
    "run_scenario",
    "run_scenarios",
]
