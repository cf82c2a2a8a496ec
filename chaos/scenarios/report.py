"""The chaos run's report: a text table, ``report.json`` and a PNG timeline.

* :func:`summarize` folds the rounds of each ``scenario[mode]`` into one row: rounds,
  sent, receipted, received, lost, duplicates (reached the application), deduped
  (dropped by the client's duplicate filter), stored twice (copies the broker kept
  under a new message-id: a replayed send it stored again — ActiveMQ does this for any
  replay; ours only for a send that was in flight, never receipted, when its master
  died, see ``RoundResult.stored_twice_after_receipt``), recovery p50/p95/max, failed
  rounds.
* :func:`format_table` prints those rows as a fixed-width table.
* :func:`write_report` writes ``report.json`` (parameters, summary rows, every round
  with its timeline samples) and ``timeline.png``: for every ``scenario[mode]`` its
  worst round (slowest recovery, or the first failed one) as messages/s over time,
  receipted sends and received messages, with the fault, its heal and the recovery
  marked. matplotlib runs on its Agg backend (no display needed).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from chaos.scenarios.runner import RoundResult

__all__ = ["Summary", "summarize", "format_table", "write_report", "plot_timeline", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Summary:
    scenario: str
    mode: str
    rounds: int
    sent: int
    receipted: int
    received: int
    lost: int
    duplicates: int
    deduped: int
    stored_twice: int
    recovery_p50: float | None
    recovery_p95: float | None
    recovery_max: float | None
    recovery_bound_s: float
    failed_rounds: int

    @property
    def label(self) -> str:
        return f"{self.scenario}[{self.mode}]"

    @property
    def ok(self) -> bool:
        return self.failed_rounds == 0


def summarize(results: Sequence[RoundResult]) -> list[Summary]:
    groups: dict[tuple[str, str], list[RoundResult]] = {}
    for r in results:
        groups.setdefault((r.scenario, r.mode), []).append(r)
    out = []
    for (scenario, mode), rs in groups.items():
        recoveries = [r.recovery_s for r in rs if r.recovery_s is not None]
        out.append(
            Summary(
                scenario=scenario,
                mode=mode,
                rounds=len(rs),
                sent=sum(r.sent for r in rs),
                receipted=sum(r.receipted for r in rs),
                received=sum(r.received for r in rs),
                lost=sum(r.lost for r in rs),
                duplicates=sum(r.duplicates for r in rs),
                deduped=sum(r.deduped for r in rs),
                stored_twice=sum(r.stored_twice for r in rs),
                recovery_p50=percentile(recoveries, 50),
                recovery_p95=percentile(recoveries, 95),
                recovery_max=max(recoveries) if recoveries else None,
                recovery_bound_s=max(r.recovery_bound_s for r in rs),
                failed_rounds=sum(1 for r in rs if not r.ok),
            )
        )
    return out


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def format_table(summaries: Sequence[Summary]) -> str:
    headers = [
        "scenario",
        "rounds",
        "sent",
        "receipted",
        "received",
        "lost",
        "duplicates",
        "deduped",
        "stored twice",
        "recovery p50",
        "p95",
        "max",
        "result",
    ]
    rows = [
        [
            s.label,
            str(s.rounds),
            str(s.sent),
            str(s.receipted),
            str(s.received),
            str(s.lost),
            str(s.duplicates),
            str(s.deduped),
            str(s.stored_twice),
            _secs(s.recovery_p50),
            _secs(s.recovery_p95),
            _secs(s.recovery_max),
            "ok" if s.ok else f"FAIL ({s.failed_rounds} rounds)",
        ]
        for s in summaries
    ]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 or i == len(cells) - 1 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    lines = [fmt(headers), fmt(["-" * w for w in widths])]
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)


def _worst(rounds: Sequence[RoundResult]) -> RoundResult:
    failed = [r for r in rounds if not r.ok]
    if failed:
        return failed[0]
    return max(rounds, key=lambda r: -1.0 if r.recovery_s is None else r.recovery_s)


def _short(text: str, limit: int = 70) -> str:
    text = text.split(" (", 1)[0] if len(text) > limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plot_timeline(results: Sequence[RoundResult], path: str | Path) -> Path:
    """One panel per ``scenario[mode]``: its worst round's throughput over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[RoundResult]] = {}
    for r in results:
        groups.setdefault(r.label, []).append(r)
    n = max(1, len(groups))
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.6 * n + 0.6), squeeze=False)
    for ax, (label, rounds) in zip(axes[:, 0], groups.items(), strict=False):
        r = _worst(rounds)
        ts = [s["t"] for s in r.samples]
        width = (ts[1] - ts[0]) if len(ts) > 1 else 1.0
        ax.step(
            ts,
            [s["receipted"] for s in r.samples],
            where="post",
            color="tab:blue",
            linewidth=1.6,
            label="receipted sends/s",
        )
        ax.step(
            ts,
            [s["received"] for s in r.samples],
            where="post",
            color="tab:orange",
            linewidth=1.2,
            linestyle="--",
            label="received/s",
        )
        top = max([1.0] + [max(s["receipted"], s["received"]) for s in r.samples])
        ax.axvline(r.fault_at, color="red", linewidth=1.5, label="fault")
        if r.heal_at is not None:
            ax.axvline(r.heal_at, color="green", linewidth=1.2, linestyle=":", label="healed")
        if r.recovery_s is not None:
            ax.axvspan(
                r.fault_at,
                r.fault_at + r.recovery_s,
                color="red",
                alpha=0.12,
                label=f"recovery {r.recovery_s:.2f}s",
            )
        verdict = "ok" if r.ok else "FAILED: " + _short(r.failures[0])
        which = f"round {r.round} of {len(rounds)}" + (
            " (slowest recovery)" if len(rounds) > 1 and r.ok else ""
        )
        stored = f", stored twice {r.stored_twice}" if r.stored_twice else ""
        ax.set_title(
            f"{label} — {which}: lost {r.lost}, duplicates {r.duplicates}, "
            f"deduped {r.deduped}{stored} — {verdict}",
            fontsize=10,
            loc="left",
        )
        ax.set_ylabel("messages/s")
        ax.set_ylim(0, top * 1.45)  # headroom for the legend
        ax.set_xlim(0, (ts[-1] + width) if ts else 1.0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=8, ncol=5, framealpha=0.9)
    axes[-1, 0].set_xlabel("seconds since the round started")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _jsonable(x: Any) -> Any:
    if is_dataclass(x) and not isinstance(x, type):
        return asdict(x)
    return x


def write_report(
    directory: str | Path,
    results: Sequence[RoundResult],
    params: Any = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write ``report.json`` and ``timeline.png`` into ``directory``; return their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize(results)
    doc: dict[str, Any] = {
        "generated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "ok": all(s.ok for s in summaries) and bool(results),
        "params": _jsonable(params),
        "summary": [dict(asdict(s), label=s.label, ok=s.ok) for s in summaries],
        "rounds": [r.to_json() for r in results],
    }
    if extra:
        doc.update(extra)
    paths = {"json": out / "report.json", "png": out / "timeline.png"}
    paths["json"].write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    plot_timeline(results, paths["png"])
    return paths
