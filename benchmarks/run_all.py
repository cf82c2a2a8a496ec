"""Run every ``benchmarks/bench_*.py`` and summarise (``make bench`` calls this).

Usage: ``.venv/bin/python benchmarks/run_all.py [--quick] [-k SUBSTRING ...] [--timeout S] [--list]``

Each benchmark runs as its own process (``python benchmarks/bench_X.py``, repo root as
the working directory), one after the other so they do not compete for the CPU; its
output is streamed with a ``[X]`` prefix. A benchmark reports by writing
``benchmarks/results/<name>.json`` through ``_common.write_result``; results written
during this run are collected (a bench that writes none is listed with its last output
line). The summary table shows status, duration and each result's ``headline``
figures, and is also written to ``benchmarks/results/summary.json``. Exit status 1
when any benchmark failed or timed out.

``--quick`` sets ``AMQ_BENCH_QUICK=1`` (benchmarks shorten themselves via
``_common.quick()``/``scale()``). ``AMQ_BENCH_TIMEOUT`` (seconds, default 900) bounds
each benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _common import RESULTS_DIR, machine, print_table, quick  # noqa: E402


def discover(patterns: list[str]) -> list[Path]:
    scripts = sorted(HERE.glob("bench_*.py"))
    if patterns:
        scripts = [s for s in scripts if any(p in s.stem for p in patterns)]
    return scripts


def _snapshot() -> dict[Path, int]:
    if not RESULTS_DIR.is_dir():
        return {}
    return {p: p.stat().st_mtime_ns for p in RESULTS_DIR.glob("*.json") if p.name != "summary.json"}


def _results_changed(before: dict[Path, int]) -> dict[str, dict[str, Any]]:
    """The result files written (new or rewritten) since ``before`` was taken."""
    out: dict[str, dict[str, Any]] = {}
    for path, mtime in sorted(_snapshot().items()):
        if before.get(path) == mtime:
            continue
        try:
            out[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            out[path.stem] = {"name": path.stem, "error": f"unreadable: {exc}"}
    return out


def run_one(script: Path, timeout: float) -> dict[str, Any]:
    """Run one benchmark script; return {bench, status, seconds, results, last_line}."""
    tag = script.stem.removeprefix("bench_")
    print(f"\n=== {script.name} ===", flush=True)
    before = _snapshot()
    t0 = time.monotonic()
    tail: deque[str] = deque(maxlen=5)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,  # so a timeout can kill the bench and whatever it started
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.strip():
                tail.append(line)
            print(f"[{tag}] {line}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    status = "ok"
    try:
        rc = proc.wait(timeout=timeout)
        if rc != 0:
            status = f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
        status = f"timeout ({timeout:.0f}s)"
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    reader.join(timeout=5)
    seconds = time.monotonic() - t0
    results = _results_changed(before)
    return {
        "bench": script.name,
        "status": status,
        "seconds": round(seconds, 1),
        "results": results,
        "last_line": tail[-1] if tail else "",
    }


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for run in runs:
        headline: list[str] = []
        for name, doc in run["results"].items():
            for key, value in (doc.get("headline") or {}).items():
                shown = f"{value:.3g}" if isinstance(value, float) else str(value)
                headline.append(f"{key}={shown}")
            if not doc.get("headline"):
                headline.append(f"{name}.json ({len(doc.get('rows') or [])} rows)")
        if not run["results"]:
            headline.append(f"(no JSON) {run['last_line'][:80]}")
        rows.append(
            {
                "benchmark": run["bench"],
                "status": run["status"],
                "seconds": run["seconds"],
                "headline": "; ".join(headline),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="short smoke runs (AMQ_BENCH_QUICK=1)")
    ap.add_argument("-k", dest="patterns", action="append", default=[], help="only benches whose name contains this")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("AMQ_BENCH_TIMEOUT", "900")))
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = ap.parse_args(argv)

    if args.quick:
        os.environ["AMQ_BENCH_QUICK"] = "1"
    scripts = discover(args.patterns)
    if args.list:
        for s in scripts:
            print(s.name)
        return 0
    if not scripts:
        print("no benchmarks/bench_*.py" + (f" matching {args.patterns}" if args.patterns else ""))
        return 0

    facts = machine()
    print(
        f"machine: {facts['cpu']}, {facts['cores']} cores, load {facts['loadavg']}, "
        f"Python {facts['python']}, {facts['java'] or 'no java'}, ActiveMQ {facts['activemq'] or 'absent'}"
        + (" [quick]" if quick() else "")
    )
    runs = [run_one(s, args.timeout) for s in scripts]
    rows = summarise(runs)
    print_table(rows, title="Summary")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "summary.json").write_text(
        json.dumps({"machine": facts, "quick": quick(), "runs": rows}, indent=2) + "\n", encoding="utf-8"
    )
    failed = [r for r in runs if r["status"] != "ok"]
    if failed:
        print(f"\n{len(failed)} benchmark(s) did not finish: " + ", ".join(r["bench"] for r in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
