"""What a nemesis run of one HA mode found: each round's outcome and the mode's result.

:class:`RoundOutcome` is one round (its plan, whether the pair came back healthy, the
receipted messages still undelivered at its end, the quick check's violations);
:class:`ModeResult` is the mode's run (its rounds, the final check, what was skipped or
aborted), with the lines and JSON the CLI's summary and report are made of.
:class:`~chaos.nemesis.runner.ModeRun` fills them in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from chaos.nemesis.checker import CheckResult, Violation
from chaos.nemesis.history import History
from chaos.nemesis.schedule import RoundPlan

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["ModeResult", "RoundOutcome"]


@dataclass
class RoundOutcome:
    mode: str
    round: int
    seed: int
    plan: RoundPlan
    healthy: bool = False
    health_s: float = 0.0
    detail: str = ""
    pending: int = 0  # receipted messages not yet delivered when the round ended
    #: those messages: (key, the clients one of which must get it); :func:`late_lines`
    #: says which were delivered later
    late: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    stacks: str = ""  # where the thread stacks were written when the round ended with some pending
    violations: list[Violation] = field(default_factory=list)
    line: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "round": self.round, "seed": self.seed, "plan": self.plan.to_json(),
                "healthy": self.healthy, "health_s": round(self.health_s, 3), "detail": self.detail,
                "pending": self.pending, "late": [[k, list(cs)] for k, cs in self.late],
                "violations": [v.to_json() for v in self.violations], "line": self.line}


@dataclass
class ModeResult:
    mode: str
    params: DataclassInstance  # runner.NemesisParams (named so: runner.py imports this module)
    kinds: list[str]
    history: History
    rounds: list[RoundOutcome] = field(default_factory=list)
    result: CheckResult | None = None
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    aborted: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok and not self.aborted

    def failed_rounds(self) -> list[RoundOutcome]:
        bad = set(self.result.rounds_failed()) if self.result is not None else set()
        return [r for r in self.rounds if r.round in bad or not r.healthy]

    def late_lines(self) -> list[str]:
        """One line per round that ended with receipted messages not yet delivered: how
        many, and whether each reached one of its consumers later (in a later round or
        the final drain: the history's deliveries to the application) or never."""
        got = {(d.sub, d.key) for d in self.history.deliveries if d.stage == "app"}
        lines = []
        for rnd in self.rounds:
            if not rnd.late:
                continue
            never = [k for k, clients in rnd.late if not any((c, k) in got for c in clients)]
            n = len(rnd.late)
            if not never:
                what = f"all {n} delivered later" if n > 1 else "delivered later"
            else:
                what = (f"{n - len(never)} delivered later, {len(never)} never: "
                        f"{', '.join(never[:4])}{' ...' if len(never) > 4 else ''}")
            stacks = f" (thread stacks then: {rnd.stacks})" if rnd.stacks else ""
            lines.append(f"{self.mode} round {rnd.round}: {n} receipted message{'s' if n > 1 else ''} "
                         f"still undelivered at the round's end{stacks}: {what}")
        return lines

    def withdrawn_lines(self) -> list[str]:
        """One line per round whose quick look (the last minute of history) flagged a rule
        that the final check of the complete history does not hold against that round (a
        bound moved by a fault or an outage outside the minute, a message that came later):
        so that a ``SUSPECT`` progress line is not read as the verdict."""
        if self.result is None:
            return []
        confirmed = {(v.round, v.rule) for v in self.result.violations}
        lines = []
        for rnd in self.rounds:
            gone = sorted({v.rule for v in rnd.violations} - {r for n, r in confirmed if n == rnd.round})
            if gone:
                lines.append(f"{self.mode} round {rnd.round}: suspected {', '.join(gone)} in the round's quick look; "
                             f"the final check of the whole history does not confirm it")
        return lines

    def to_json(self) -> dict[str, Any]:
        p = asdict(self.params)
        return {"mode": self.mode, "ok": self.ok, "kinds": self.kinds, "params": p,
                "check": self.result.to_json() if self.result is not None else None,
                "rounds": [r.to_json() for r in self.rounds], "skipped_faults": self.skipped,
                "notes": self.notes, "aborted": self.aborted, "duration_s": round(self.duration_s, 1)}
