"""The body of ``amq chaos run nemesis`` (the click command in amqtransport/cli/chaos_cmd.py
only parses options and calls :func:`run_nemesis`)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from chaos.harness.cluster import scratch_dir
from chaos.nemesis.checker import RULES
from chaos.nemesis.results import ModeResult
from chaos.nemesis.runner import ModeRun, NemesisParams, replay_command
from chaos.nemesis.schedule import FAULT_KINDS, PAIR_MODES

__all__ = ["run_nemesis", "nemesis_modes", "format_summary", "format_availability", "write_nemesis_report",
           "describe_kinds"]

Echo = Callable[[str], None]


def nemesis_modes(mode: str) -> list[str]:
    if mode == "both":
        return list(PAIR_MODES)
    if mode not in PAIR_MODES:
        raise ValueError(f"the nemesis runs on our HA pair: --mode replicated, shared-store or both, not {mode!r}")
    return [mode]


def describe_kinds() -> str:
    width = max(len(k) for k in FAULT_KINDS)
    lines = []
    for k in FAULT_KINDS.values():
        modes = "" if len(k.modes) == 2 else f" [{', '.join(k.modes)} only]"
        pending = f" (not in the default set: {k.pending})" if k.pending else ""
        lines.append(f"{k.name.ljust(width)}  {k.summary}{modes}{pending}")
    return "\n".join(lines)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT end the run like Ctrl-C (everything stopped by pid, tmpfs
    unmounted). SIGINT too, explicitly: a process started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then installs no Ctrl-C
    handler, so ``kill -INT`` did nothing and the run went on."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        old_term = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (a test calling us from a worker)
        yield
        return
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)


def format_summary(results: Sequence[ModeResult]) -> str:
    head = ["mode", "rounds", "receipted", "committed", "in doubt", "aborted", "ff sent", "ff delivered",
            "delivered", "auto missed", "faults", "violations", "result"]
    rows = []
    for r in results:
        st = r.result.stats if r.result is not None else {}
        counts = r.result.counts if r.result is not None else {}
        bad = ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "0"
        ff = sum(st.get(f"sends_ff_{o}", 0) for o in ("none", "unknown"))
        rows.append([
            r.mode, str(len(r.rounds)), str(st.get("sends_rcpt_ok", 0)), str(st.get("txs_committed", 0)),
            str(st.get("txs_in-doubt", 0)), str(st.get("txs_aborted", 0)), str(ff), str(st.get("ff_delivered", 0)),
            str(st.get("delivered_app", 0)), str(st.get("auto_missed", 0)), str(st.get("faults", 0)), bad,
            "ok" if r.ok else ("ABORTED" if r.aborted else "FAIL"),
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *(fmt(row) for row in rows)])


def format_availability(results: Sequence[ModeResult]) -> str:
    """One line per mode and fault kind: the share of 1-second windows in which a
    receipted send to the pair completed (chaos/nemesis/availability.py says which
    windows: the link timeout after each fault's start is excluded)."""
    lines = ["availability (1-s windows with a receipted send; the first link-timeout after each fault excluded):"]
    for r in results:
        figures = r.result.availability if r.result is not None else {}
        for kind, a in figures.items():
            share = "-" if a.share is None else f"{100 * a.share:.1f}%"
            alone = "-" if a.alone_share is None else f"{100 * a.alone_share:.1f}%"
            lines.append(f"  {r.mode:<13} {kind:<22} {share:>6}  ({a.available}/{a.windows} windows; alone, with no "
                         f"other fault near: {alone} of {a.alone_windows})")
    return "\n".join(lines)


def write_nemesis_report(directory: Path, results: Sequence[ModeResult], meta: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "report.json"
    data = {
        **meta,
        "rules": list(RULES),
        "ok": all(r.ok for r in results),
        "results": {r.mode: r.to_json() for r in results},
        "histories": {r.mode: r.history.to_json() for r in results},
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    tmp.replace(path)
    return path


class ModeRunner(Protocol):
    result: ModeResult

    def run(self) -> ModeResult: ...


def run_nemesis(mode: str, params: NemesisParams, *, report_dir: Path | None, echo: Echo = print,
                workdir: Path | None = None, seed_given: bool = True, keep: bool = False,
                mode_runner: Callable[[str, NemesisParams, Path, Echo, Callable[[], float]], ModeRunner] = ModeRun,
                ) -> int:
    """Run the nemesis on each mode; print progress, the summary and the failing rounds'
    seeds; write ``report.json``. Exit status: 0 no violation, 1 violations (or a mode
    that could not finish), 2 bad arguments or no cluster, 130 interrupted.
    ``mode_runner`` builds the run of one mode (:class:`~chaos.nemesis.runner.ModeRun`;
    tests give a scripted one)."""
    try:
        modes = nemesis_modes(mode)
    except ValueError as exc:
        echo(f"error: {exc}")
        return 2
    command = replay_command(mode, params.seed, params.rounds, params.kinds, params.double_faults, params.witness)
    echo(f"nemesis: seed {params.seed}{'' if seed_given else ' (random)'}, {params.rounds} round(s) per mode, "
         f"modes {', '.join(modes)}; replay with: {command}")
    base = scratch_dir(workdir)
    t0 = time.monotonic()
    # the clients' and the bridge's logs go to a file next to the brokers' (kept when a
    # round fails); the terminal gets the progress lines only
    handler = logging.FileHandler(base / "nemesis.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    saved_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)

    def clock() -> float:
        return time.monotonic() - t0

    meta: dict[str, Any] = {"command": command, "argv": sys.argv, "seed": params.seed, "modes": modes,
                            "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    results: list[ModeResult] = []
    interrupted = False
    try:
        with _sigterm_as_interrupt():
            for m in modes:
                run = mode_runner(m, params, base, echo, clock)
                try:
                    results.append(run.run())
                except KeyboardInterrupt:
                    results.append(run.result)
                    interrupted = True
                    break
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_level)
        handler.close()
    meta["duration_s"] = round(time.monotonic() - t0, 1)
    ok = bool(results) and all(r.ok for r in results) and not interrupted
    started = [r for r in results if r.rounds]
    if started:
        echo("")
        echo(format_summary(results))
        echo(format_availability(results))
    for r in results:
        for line in [*r.late_lines(), *r.withdrawn_lines()]:
            echo(line)
        for note in r.notes:
            echo(f"{r.mode}: {note}")
        for rnd in r.failed_rounds():
            echo(f"FAILED {r.mode} round {rnd.round}: seed {rnd.seed}; replay: "
                 f"{replay_command(r.mode, rnd.seed, 1, params.kinds, params.double_faults, params.witness)}")
        if r.result is not None:
            for v in r.result.violations[:20]:
                echo(f"  {r.mode} round {v.round} t={v.t:.3f} {v.rule}: {v.summary}")
            for w in r.result.warnings[:10]:
                echo(f"  warning: {r.mode} round {w.round} t={w.t:.3f} {w.rule}: {w.summary}")
    target = report_dir if report_dir is not None else (None if ok else base)
    if target is not None and results:
        path = write_nemesis_report(target, results, meta)
        echo(f"\nreport: {path}")
    if ok and not keep:
        shutil.rmtree(base, ignore_errors=True)
    else:
        echo(f"broker logs and data kept in {base}")
    if interrupted:
        return 130
    if not started and any(r.aborted for r in results):
        return 2
    return 0 if ok else 1


def random_seed() -> int:
    return random.SystemRandom().randrange(1, 2**48)
