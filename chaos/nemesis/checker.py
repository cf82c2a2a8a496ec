"""The nemesis's checker: a pure function from a recorded :class:`History` to violations.

Theory of operation
-------------------
:func:`check` reads nothing but the history (no clock, no I/O), so it can be unit-tested
with hand-built histories that break each rule, and re-run on a saved ``report.json``.
The rules:

``lost``
    every receipted send (``sends`` with outcome ``ok``) and every key of a receipted
    commit (``txs`` ``committed``) reached the application of every subscriber of its
    destination that acknowledges (``client``, ``client-individual``). ``auto``
    subscribers are at-most-once by definition (the broker forgets a message when it
    writes it to the socket); what they miss is counted (``auto_missed``), not failed.
    Judged only on a complete history (after the final drain).
``duplicate``
    no subscriber's application got the same key twice (the client's duplicate filter
    is on: exactly once per subscriber for every key, receipted or not).
``ff-lost``
    every fire-and-forget send of a ``trackMessages`` producer (``sends`` ``ff`` with
    outcome ``none``) reached every acknowledging subscriber of its destination, unless
    a later record of the same key says ``unknown`` (its connection died for good with
    the key possibly still in its replay cache). Every RECEIPT proves the frames before
    it durable and replicated, so the replay cache never lets go of a send the serving
    master lacks. Judged only on a complete history.
``redelivered-after-ack``
    once an acknowledgement is *known durable*, the broker never delivers that key to
    that subscriber again (not even under a new message id, e.g. after a restart, a
    failover or a compaction). An ACK (for ``auto``: the delivery itself) on link
    generation ``g`` is known durable when a later sync of the same subscriber was
    receipted on the same link (``gen_before == gen_after == g``): the broker handles
    a connection's frames in order and receipts a persistent SEND only once everything
    before it is in the journal (and on the slave).
``aborted-delivered``
    no key of a transaction that was rolled back before its COMMIT was written is ever
    delivered; ``partial-commit``: a COMMIT in doubt delivered all of its keys to a
    subscriber or none (complete history only).
``two-masters``
    never two nodes answering clients at once: the client-port probes of the two nodes
    never show overlapping serving periods. A run of consecutive answered probes of a
    node is *certainly* serving from the end of its first probe to the start of its
    last; a violation is two such periods that intersect, or one probe of a node that
    lies entirely inside the other's certain period. Two answered runs that merely
    come within one probe of each other (a handover faster than the probes can tell)
    are kept as *warnings* (``two-masters-suspect``), not violations.
``unhealthy``
    after every round the pair came back to a master and an in-sync slave within the
    bound (the runner records it in ``rounds``).
``scheduled-early``, ``scheduled-late``, ``priority-order``, ``group-lost``, ``group-duplicate``, ``group-split``, ``selector-lost``, ``selector-miss-delivered``, ``selector-duplicate``
    the ActiveMQ features (scheduled, prioritized, grouped and selected messages): see
    :mod:`chaos.nemesis.feature_rules`.

Each violation carries the round it happened in (by time), the instant, a one-line
summary and a short excerpt of the history (the records involved and the faults
around them). Besides the rules the result carries the availability figures of
:mod:`chaos.nemesis.availability` (per fault kind; a figure, never a violation).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.nemesis.availability import Availability, availability
from chaos.nemesis.feature_rules import FEATURE_RULES, check_features
from chaos.nemesis.history import Delivery, History, ProbeRun, Subscriber

__all__ = ["Violation", "CheckResult", "check", "RULES"]

RULES: tuple[str, ...] = ("lost", "ff-lost", "duplicate", "redelivered-after-ack", "aborted-delivered", "partial-commit", "two-masters",
         "unhealthy")
RULES += FEATURE_RULES

#: a message must reach these subscribers (``auto`` is at-most-once)
ACKING = ("client", "client-individual")
EXCERPT_FAULTS_S = 5.0  # faults this close to a violation go into its excerpt
MAX_PER_RULE = 50  # violations kept per rule (the counts are complete)


@dataclass
class Violation:
    rule: str
    t: float
    round: int
    summary: str
    excerpt: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "t": round(self.t, 4), "round": self.round, "summary": self.summary,
                "excerpt": self.excerpt}


@dataclass
class CheckResult:
    violations: list[Violation]
    counts: dict[str, int]  # rule -> number of violations (all of them, not only those kept)
    stats: dict[str, int]
    warnings: list[Violation] = field(default_factory=list)  # suspicious, not a broken rule
    #: fault kind -> share of 1-s windows with a receipted send (chaos/nemesis/availability.py)
    availability: dict[str, Availability] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def rounds_failed(self) -> list[int]:
        return sorted({v.round for v in self.violations})

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "counts": self.counts, "stats": self.stats,
                "violations": [v.to_json() for v in self.violations],
                "warnings": [w.to_json() for w in self.warnings],
                "availability": {k: a.to_json() for k, a in self.availability.items()}}


def _rec(kind: str, record: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"record": kind}
    for name, value in zip(record._fields, record, strict=True):
        out[name] = round(value, 4) if isinstance(value, float) else (list(value) if isinstance(value, tuple) else value)
    return out


class _Checker:
    def __init__(self, h: History, complete: bool) -> None:
        self.h = h
        self.complete = complete
        self.violations: list[Violation] = []
        self.warnings: list[Violation] = []
        self.counts: dict[str, int] = dict.fromkeys(RULES, 0)
        self.stats: dict[str, int] = {}
        self.round_starts = sorted((r.t, r.round) for r in h.rounds)
        self.faults = sorted(h.faults, key=lambda f: f.t)
        self.subs: dict[str, Subscriber] = {s.name: s for s in h.subscribers}
        self.by_dest: dict[str, list[Subscriber]] = defaultdict(list)
        for s in h.subscribers:
            self.by_dest[s.dest].append(s)
        self.app: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
        self.wire: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
        self.key_wire: dict[str, list[Delivery]] = defaultdict(list)
        for d in h.deliveries:
            if d.stage == "app":
                self.app[(d.sub, d.key)].append(d)
            else:
                self.wire[(d.sub, d.key)].append(d)
                self.key_wire[d.key].append(d)

    # -- helpers ------------------------------------------------------------------
    def round_at(self, t: float) -> int:
        i = bisect.bisect_right(self.round_starts, (t, float("inf"))) - 1
        return self.round_starts[i][1] if i >= 0 else 0

    def faults_near(self, t0: float, t1: float | None = None) -> list[dict[str, Any]]:
        t1 = t0 if t1 is None else t1
        return [_rec("fault", f) for f in self.faults
                if f.t <= t1 + EXCERPT_FAULTS_S and f.t_end >= t0 - EXCERPT_FAULTS_S][:8]

    def violate(self, rule: str, t: float, summary: str, records: Iterable[tuple[str, Any]] = (),
                around: tuple[float, float] | None = None) -> None:
        self.counts[rule] += 1
        if self.counts[rule] > MAX_PER_RULE:
            return
        excerpt = [_rec(kind, r) for kind, r in list(records)[:12]]
        lo, hi = around or (t, t)
        excerpt += self.faults_near(lo, hi)
        self.violations.append(Violation(rule, t, self.round_at(t), summary, excerpt))

    # -- rules --------------------------------------------------------------------
    def must_reach(self) -> list[tuple[str, str, float, float, Any]]:
        """(dest, key, t, t_done, record) of everything that must be delivered."""
        out: list[tuple[str, str, float, float, Any]] = []
        selected = {p.key for p in self.h.props if p.k}  # selector-lost judges them
        for s in self.h.sends:
            if s.kind == "rcpt" and s.outcome == "ok" and s.key not in selected:
                out.append((s.dest, s.key, s.t, s.t_done, ("send", s)))
        for tx in self.h.txs:
            if tx.outcome == "committed":
                out.extend((tx.dest, k, tx.t, tx.t_done, ("tx", tx)) for k in tx.keys)
        return out

    def check_lost(self) -> None:
        missed_auto = 0
        for dest, key, t, t_done, rec in self.must_reach():
            for sub in self.by_dest.get(dest, ()):
                if (sub.name, key) in self.app:
                    continue
                if sub.ack not in ACKING:
                    missed_auto += 1
                    continue
                wire = self.wire.get((sub.name, key), [])
                self.violate("lost", t, f"{key} to {dest}: receipted at {t_done:.3f} but never reached "
                             f"subscriber {sub.name} ({sub.ack}; {len(wire)} copies on the wire)",
                             [rec, *(("delivery", d) for d in wire)], around=(t, t_done))
        self.stats["auto_missed"] = missed_auto

    def check_ff_lost(self) -> None:
        given_up = {s.key for s in self.h.sends if s.kind == "ff" and s.outcome == "unknown"}
        for s in self.h.sends:
            if s.kind != "ff" or s.outcome != "none" or s.key in given_up:
                continue
            for sub in self.by_dest.get(s.dest, ()):
                if sub.ack not in ACKING or (sub.name, s.key) in self.app:
                    continue
                wire = self.wire.get((sub.name, s.key), [])
                self.violate("ff-lost", s.t, f"{s.key} to {s.dest}: a tracked fire-and-forget send written at "
                             f"{s.t:.3f} never reached subscriber {sub.name} ({len(wire)} copies on the wire)",
                             [("send", s), *(("delivery", d) for d in wire)], around=(s.t, s.t))

    def check_duplicates(self) -> None:
        for (sub, key), ds in self.app.items():
            if len(ds) > 1:
                self.violate("duplicate", ds[1].t, f"{key} reached the application of {sub} {len(ds)} times "
                             f"(message ids {', '.join(dict.fromkeys(d.msg_id for d in ds))})",
                             [("delivery", d) for d in ds], around=(ds[0].t, ds[-1].t))

    def confirmed_acks(self) -> dict[tuple[str, str], tuple[float, Any]]:
        """(sub, key) -> (time the earliest of its acks was known durable, that ack)."""
        syncs: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        for s in self.h.syncs:
            if s.ok and s.gen_before == s.gen_after:
                syncs[(s.sub, s.gen_before)].append((s.t, s.t_done))
        index: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
        for k, items in syncs.items():
            items.sort()
            starts = [a for a, _ in items]
            suffix_min = [0.0] * len(items)
            best = float("inf")
            for i in range(len(items) - 1, -1, -1):
                best = min(best, items[i][1])
                suffix_min[i] = best
            index[k] = (starts, suffix_min)

        def confirm(sub: str, gen: int, t: float) -> float | None:
            entry = index.get((sub, gen))
            if entry is None:
                return None
            i = bisect.bisect_left(entry[0], t)
            return entry[1][i] if i < len(entry[0]) else None

        acks: list[tuple[str, str, int, float, Any]] = [(a.sub, a.key, a.gen, a.t, ("ack", a)) for a in self.h.acks]
        for d in self.h.deliveries:
            sub = self.subs.get(d.sub)
            if d.stage == "wire" and sub is not None and sub.ack == "auto":
                acks.append((d.sub, d.key, d.gen, d.t, ("auto-ack", d)))
        out: dict[tuple[str, str], tuple[float, Any]] = {}
        for sub_name, key, gen, t, rec in acks:
            at = confirm(sub_name, gen, t)
            if at is not None and ((sub_name, key) not in out or at < out[(sub_name, key)][0]):
                out[(sub_name, key)] = (at, rec)
        self.stats["acks_confirmed"] = len(out)
        return out

    def check_redelivery(self) -> None:
        for (sub, key), (at, rec) in self.confirmed_acks().items():
            later = [d for d in self.wire.get((sub, key), []) if d.t > at]
            if later:
                self.violate("redelivered-after-ack", later[0].t,
                             f"{key} delivered again to {sub} at {later[0].t:.3f} (message id {later[0].msg_id}) "
                             f"after its acknowledgement was known durable at {at:.3f}",
                             [rec, *(("delivery", d) for d in self.wire[(sub, key)])], around=(at, later[0].t))

    def check_transactions(self) -> None:
        for tx in self.h.txs:
            if tx.outcome == "aborted":
                seen = [d for k in tx.keys for d in self.key_wire.get(k, [])]
                if seen:
                    self.violate("aborted-delivered", seen[0].t,
                                 f"transaction {tx.tx} was rolled back before its COMMIT, yet "
                                 f"{len({d.key for d in seen})} of its {len(tx.keys)} messages were delivered",
                                 [("tx", tx), *(("delivery", d) for d in seen)], around=(tx.t, seen[0].t))
            elif tx.outcome == "in-doubt" and self.complete:
                for sub in self.by_dest.get(tx.dest, ()):
                    if sub.ack not in ACKING:
                        continue
                    got = [k for k in tx.keys if (sub.name, k) in self.app]
                    if got and len(got) != len(tx.keys):
                        self.violate("partial-commit", tx.t_done,
                                     f"COMMIT of {tx.tx} in doubt: {sub.name} got {len(got)} of its "
                                     f"{len(tx.keys)} messages (all or none)",
                                     [("tx", tx)], around=(tx.t, tx.t_done))

    def check_two_masters(self) -> None:
        runs: dict[str, list[ProbeRun]] = defaultdict(list)
        for r in self.h.probes:
            if r.answered:
                runs[r.node].append(r)
        nodes = sorted(runs)
        for i, a in enumerate(nodes):
            for b in nodes[i + 1:]:
                self._overlaps(runs[a], runs[b])

    def _overlaps(self, xs: Sequence[ProbeRun], ys: Sequence[ProbeRun]) -> None:
        ys = sorted(ys, key=lambda r: r.first_t0)
        starts = [r.first_t0 for r in ys]
        for x in xs:
            # only ys that start before x's last probe ends can overlap it
            for y in ys[: bisect.bisect_right(starts, x.last_t1)]:
                if y.last_t1 < x.first_t0:
                    continue
                t = max(x.first_t0, y.first_t0)
                what = (f"nodes {x.node} and {y.node} both answered clients: {x.node} from {x.first_t0:.3f} to "
                        f"{x.last_t1:.3f} ({x.n} probes), {y.node} from {y.first_t0:.3f} to {y.last_t1:.3f} "
                        f"({y.n} probes)")
                if _conflict(x, y) or _conflict(y, x):
                    self.violate("two-masters", t, what, [("probe", x), ("probe", y)], around=(t, t))
                else:
                    self.warnings.append(Violation("two-masters-suspect", t, self.round_at(t),
                                                   what + " (within one probe: not certain)",
                                                   [_rec("probe", x), _rec("probe", y)]))

    def check_health(self) -> None:
        for r in self.h.rounds:
            if not r.healthy:
                self.violate("unhealthy", r.t_end, f"round {r.round}: the pair did not come back to a master "
                             f"and an in-sync slave: {r.detail}", [("round", r)], around=(r.t, r.t_end))

    def gather_stats(self) -> None:
        st = self.stats
        for s in self.h.sends:
            st[f"sends_{s.kind}_{s.outcome}"] = st.get(f"sends_{s.kind}_{s.outcome}", 0) + 1
        for tx in self.h.txs:
            st[f"txs_{tx.outcome}"] = st.get(f"txs_{tx.outcome}", 0) + 1
        st["delivered_app"] = sum(len(v) for v in self.app.values())
        st["delivered_wire"] = sum(len(v) for v in self.wire.values())
        st["redelivered_same_id"] = sum(len(v) - len({d.msg_id for d in v}) for v in self.wire.values())
        st["stored_twice"] = sum(1 for v in self.wire.values() if len({d.msg_id for d in v}) > 1)
        ff = [s for s in self.h.sends if s.kind == "ff"]
        ff_subs = {s.dest: [x.name for x in self.by_dest.get(s.dest, []) if x.ack in ACKING] for s in ff}
        st["ff_delivered"] = sum(1 for s in ff if any((n, s.key) in self.app for n in ff_subs[s.dest]))
        st["faults"] = len(self.h.faults)
        st["probes"] = sum(r.n for r in self.h.probes)
        st["rounds"] = len(self.h.rounds)

    def run(self) -> CheckResult:
        if self.complete:
            self.check_lost()
            self.check_ff_lost()
        self.check_duplicates()
        self.check_redelivery()
        self.check_transactions()
        self.check_two_masters()
        self.check_health()
        check_features(self)
        self.gather_stats()
        self.violations.sort(key=lambda v: (v.t, v.rule))
        self.stats["two_masters_suspect"] = len(self.warnings)
        return CheckResult(self.violations, self.counts, self.stats, self.warnings, availability(self.h))


def _conflict(x: ProbeRun, y: ProbeRun) -> bool:
    """True when ``x``'s certain serving period meets ``y``'s (see the module docstring)."""
    lo, hi = x.first_t1, x.last_t0  # x certainly served in [lo, hi]
    if lo > hi:
        return False
    ylo, yhi = y.first_t1, y.last_t0
    if ylo <= yhi and ylo <= hi and yhi >= lo:
        return True
    return (lo <= y.first_t0 and y.first_t1 <= hi) or (lo <= y.last_t0 and y.last_t1 <= hi)


def check(history: History, *, complete: bool = True) -> CheckResult:
    """Judge ``history`` (see the module docstring). ``complete=False`` while the run
    goes on: the rules that need the final drain (``lost``, ``partial-commit``) wait."""
    return _Checker(history, complete).run()

