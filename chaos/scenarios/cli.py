"""The body of ``amq chaos run`` (the click command in amqtransport/cli/chaos_cmd.py
only parses options and calls :func:`run_cli`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from chaos.harness.cluster import ClusterError
from chaos.scenarios.catalog import SCENARIOS
from chaos.scenarios.runner import RoundResult, RunParams, modes_for, run_scenario

__all__ = ["run_cli", "MODE_CHOICES", "expand_mode", "list_scenarios"]

MODE_CHOICES = ("replicated", "shared-store", "both", "single")


def expand_mode(mode: str) -> list[str]:
    if mode == "both":
        return ["replicated", "shared-store"]
    if mode not in MODE_CHOICES:
        raise ValueError(f"--mode must be one of {', '.join(MODE_CHOICES)}, got {mode!r}")
    return [mode]


def list_scenarios() -> str:
    width = max(len(n) for n in SCENARIOS)
    return "\n".join(
        f"{name.ljust(width)}  [{', '.join(sc.kinds)}]  {sc.summary}" for name, sc in SCENARIOS.items()
    )


def run_cli(names: Sequence[str], *, rounds: int, report_dir: Path | None, mode: str,
            params: RunParams, echo: Callable[[str], None] = print,
            workdir: Path | None = None) -> int:
    """Run the scenarios, print one line per round and the table, write the report.

    Returns the exit status: 0 all invariants held, 1 one failed, 2 bad arguments or
    a cluster that could not be started. Scratch directories (broker data and logs)
    go under ``workdir`` (default: the system's temp dir); a failed scenario's is kept
    and its path logged."""
    from chaos.scenarios.report import format_table, summarize, write_report

    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        echo(f"error: unknown scenario(s) {', '.join(unknown) or '(none given)'}; known:\n" + list_scenarios())
        return 2
    modes = expand_mode(mode)
    # the per-round lines say what happened; component logs (e.g. a bridge's failover giving
    # up by design, maxReconnectAttempts=0) would only add noise here
    logging.basicConfig(level=logging.CRITICAL, format="%(levelname)s %(name)s: %(message)s")

    results: list[RoundResult] = []
    errors: list[str] = []
    for name in names:
        sc = SCENARIOS[name]
        chosen = modes_for(sc, modes)
        if not chosen:
            echo(f"{name}: skipped, it runs on {', '.join(sc.kinds)} only")
            continue
        for m in chosen:
            try:
                results.extend(run_scenario(sc, m, rounds, params, workdir=workdir,
                                            on_round=lambda r: echo(r.line(rounds))))
            except ClusterError as exc:
                errors.append(f"{name}[{m}]: {exc}")
                echo(f"{name}[{m}]: cannot run: {exc}")
    if results:
        echo("")
        echo(format_table(summarize(results)))
    if report_dir is not None and results:
        paths = write_report(report_dir, results, params, extra={"errors": errors})
        echo(f"\nreport: {paths['json']}\ntimeline: {paths['png']}")
    if errors and not results:
        return 2
    return 0 if results and all(r.ok for r in results) and not errors else 1
