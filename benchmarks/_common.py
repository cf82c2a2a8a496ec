"""Shared helpers for ``benchmarks/bench_*.py`` (import as ``from _common import ...``).

Every benchmark is a script with a ``main()`` that prints a table and writes one JSON
result; ``benchmarks/run_all.py`` runs them all and prints a summary. The method
(BENCHMARKS.md): measure ours and a peer in the same run, alternating rounds, and report
the ratio of medians; absolute numbers on a shared 2-core machine mean little.

The whole API:

``quick() -> bool``
    True when ``AMQ_BENCH_QUICK=1`` (run_all --quick): a smoke run, make it short.
``scale(n, quick_n=None) -> int``
    ``n``, or ``quick_n`` (default ``max(1, n // 10)``) in quick mode.
``timed(fn, *args, **kwargs) -> (result, seconds)``
    One call, wall-clock (``time.perf_counter``).
``measure(fn, n, *, warmup=0) -> float``
    Calls ``fn()`` ``n`` times (after ``warmup`` untimed calls); returns calls per second.
``compare(ours, peer, *, rounds=3) -> Comparison``
    ``ours``/``peer`` are zero-argument callables returning one figure each (a rate, or
    seconds); they run alternately ``rounds`` times (ours, peer, ours, peer, ...) so load
    drift hits both; ``Comparison(ours, peer, ratio, ours_all, peer_all)`` holds the
    medians and ``ratio = ours / peer``. Say in the row which way is better.
``ratio(ours, peer) -> float``
    ``ours / peer`` (``inf`` when peer is 0, ``nan`` when both are).
``machine() -> dict``
    CPU model, cores, load average, OS, Python, Java (when present), ActiveMQ version.
``print_table(rows, columns=None, *, title=None) -> None``
    Rows are dicts; columns default to the keys of the first row; floats are formatted.
``work_dir(prefix) -> Path``
    A new temporary directory (``tempfile.mkdtemp(prefix=prefix)``) for the run's data
    and logs, removed when the script exits (``atexit``: also after an exception, not
    after a SIGKILL); ``AMQ_KEEP_LOGS=1`` keeps it and prints where.
``write_result(name, rows, *, headline=None, notes="") -> Path``
    Writes ``benchmarks/results/NAME.json`` (``$AMQ_BENCH_RESULTS/NAME.json`` if set):
    ``{"name", "finished_at", "quick", "machine", "rows", "headline", "notes"}``.
    ``headline`` is a small dict of the figures run_all's summary shows, e.g.
    ``{"send msg/s ratio vs stomp.py": 1.8}``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "RESULTS_DIR",
    "Comparison",
    "compare",
    "machine",
    "measure",
    "pin",
    "print_table",
    "quick",
    "ratio",
    "scale",
    "timed",
    "work_dir",
    "write_result",
]

T = TypeVar("T")

RESULTS_DIR = Path(os.environ.get("AMQ_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")


def pin(pid: int, cpus: set[int]) -> None:
    """Run every thread of process ``pid`` on ``cpus`` only (threads it starts later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def quick() -> bool:
    return os.environ.get("AMQ_BENCH_QUICK") == "1"


def scale(n: int, quick_n: int | None = None) -> int:
    if not quick():
        return n
    return quick_n if quick_n is not None else max(1, n // 10)


def timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - t0


def measure(fn: Callable[[], object], n: int, *, warmup: int = 0) -> float:
    if n <= 0:
        raise ValueError(f"measure: n must be > 0, got {n}")
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - t0
    return n / elapsed if elapsed > 0 else math.inf


def ratio(ours: float, peer: float) -> float:
    if peer == 0:
        return math.nan if ours == 0 else math.inf
    return ours / peer


@dataclass(frozen=True)
class Comparison:
    ours: float  # median
    peer: float  # median
    ratio: float  # ours / peer
    ours_all: list[float] = field(default_factory=list)
    peer_all: list[float] = field(default_factory=list)


def compare(ours: Callable[[], float], peer: Callable[[], float], *, rounds: int = 3) -> Comparison:
    if rounds <= 0:
        raise ValueError(f"compare: rounds must be > 0, got {rounds}")
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        a.append(float(ours()))
        b.append(float(peer()))
    ma, mb = statistics.median(a), statistics.median(b)
    return Comparison(ma, mb, ratio(ma, mb), a, b)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _java_version() -> str | None:
    java = shutil.which("java")
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (out.stderr or out.stdout).splitlines()
    return first[0].strip() if first else None


def _activemq_version() -> str | None:
    jar = Path(os.environ.get("AMQ_ACTIVEMQ_HOME", "/usr/share/activemq")) / "bin" / "activemq.jar"
    try:
        with zipfile.ZipFile(jar) as z:
            manifest = z.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    m = re.search(r"^Implementation-Version:\s*(\S+)", manifest, re.M)
    return m.group(1) if m else "installed"


def machine() -> dict[str, Any]:
    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "loadavg": [round(x, 2) for x in load],
        "os": platform.platform(),
        "python": platform.python_version(),
        "java": _java_version(),
        "activemq": _activemq_version(),
    }


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.2f}"
    return "" if value is None else str(value)


def print_table(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str] | None = None,
    *,
    title: str | None = None,
) -> None:
    if title:
        print(f"\n{title}")
    if not rows:
        print("(no rows)")
        return
    cols = list(columns) if columns is not None else list(rows[0].keys())
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    # numbers right-aligned, text left-aligned
    numeric = [
        all(isinstance(r.get(c), int | float) or r.get(c) is None for r in rows) for c in cols
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    print(line(cols))
    print(line(["-" * w for w in widths]))
    for row in cells:
        print(line(row))


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_result(
    name: str,
    rows: Sequence[Mapping[str, object]],
    *,
    headline: Mapping[str, object] | None = None,
    notes: str = "",
) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"write_result: name {name!r} must be letters, digits, '_', '.', '-'")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": name,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": quick(),
        "machine": machine(),
        "rows": list(rows),
        "headline": dict(headline or {}),
        "notes": notes,
    }
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(doc), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    print(f"\nresult written to {path}")
    return path


def work_dir(prefix: str) -> Path:
    """A new temporary directory, removed at exit unless ``AMQ_KEEP_LOGS=1`` (then kept
    and named on stderr)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(_drop_work_dir, path)
    return path


def _drop_work_dir(path: Path) -> None:
    if os.environ.get("AMQ_KEEP_LOGS") == "1":
        print(f"kept {path} (AMQ_KEEP_LOGS=1)", file=sys.stderr)
    else:
        shutil.rmtree(path, ignore_errors=True)
