"""Availability per fault kind: the share of 1-second windows in which a receipted send completed.

Theory of operation
-------------------
A pure function of the history (like the checker, which calls it and carries its
figures). For every fault that was done (not ``skipped``/``failed``) its *observed
span* is ``[t + L, t_end + A)``: from ``L`` seconds after the fault began (``L`` = the
pair's ``--link-timeout``, ``history.meta["link_timeout_s"]``, default 1 s: the window
right after a fault in which the pair cannot have noticed it yet is **excluded**)
to ``A`` seconds (:data:`AFTER_S`, 5 s) after it ended (an instant fault, a SIGKILL,
has ``t_end == t``: its span is the 4 s from ``t + L`` to ``t + 5``; a held fault is
observed while it holds and for 5 s after its heal, the time a takeover or a resync
takes to give service back). A span shorter than ``L`` yields nothing.

The span is cut into consecutive 1-second windows starting at ``t + L`` (the last,
partial one dropped). A window is **available** when at least one *receipted send to
the pair* (``sends`` ``rcpt``, outcome ``ok``, not the spoke's ``p-bridged``
producer) got its receipt inside it (``t_done`` in ``[w, w + 1)``). A kind's figure
is available windows / windows over all its faults (a window inside the spans of two
concurrent faults counts for both kinds). Its *alone* figure counts only the windows
that lie in no other fault's ``[t, t_end + A)``: what that kind does by itself (a
``delete-lock`` with a half-open client link alongside says little about the lock). ``no-fault`` is the same over the 1-second
windows of the rounds' time that lie in no fault's ``[t, t_end + A)`` (the baseline,
not excluded from anything), ``all-faults`` over every fault's windows.

``single-failures`` is ``all-faults`` without the faults of a component the pair's
two nodes *share* (:data:`SHARED_COMPONENT`): the promise is availability through any
single failure of the pair's nodes and links, and a component both nodes depend on has
no second copy to fail over to. Today that is ``disk-full`` of a shared store: its one
disk is the journal of both nodes, so a full disk stops the pair by design (nothing
lost, every write refused with an error naming the full disk; docs/ha.md, "A shared
store with a witness"). Its own row still shows what it costs, and its span still makes
the windows near it not ``alone`` for the other faults. In a replicated pair
``disk-full`` fills one node's own disk, a single failure like any other.

Only time in which the workload was sending counts. At the end of a mode's run the
harness itself stops the producers (``ModeRun._finish``, recorded as
``history.meta["workload_stopped_s"]``; a history from before that record falls back to
the end of its last round, which comes just before) and waits for them to flush and the
consumers to drain: a window that ends after that moment had nobody sending, so it can
show nothing about the pair and is **dropped** (from every figure, ``no-fault``
included), never counted as unavailable. Nothing else is dropped: between rounds the
producers go on sending while the harness heals, restarts dead nodes and waits for the
pair to be healthy, and those windows count like any other.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from chaos.nemesis.history import History

__all__ = ["Availability", "availability", "workload_end", "shared_component", "AFTER_S", "WINDOW_S",
           "NOT_PAIR_CLIENTS", "SHARED_COMPONENT"]

WINDOW_S = 1.0
AFTER_S = 5.0
#: producers whose sends do not go to the pair (the spoke's, forwarded by the bridge)
NOT_PAIR_CLIENTS = ("p-bridged",)
#: per HA mode, the fault kinds that strike a component both nodes share (module docstring)
SHARED_COMPONENT: dict[str, tuple[str, ...]] = {"shared-store": ("disk-full",)}


@dataclass(frozen=True)
class Availability:
    kind: str
    windows: int
    available: int
    alone_windows: int = 0  # windows in no other fault's span
    alone_available: int = 0

    @property
    def share(self) -> float | None:
        return self.available / self.windows if self.windows else None

    @property
    def alone_share(self) -> float | None:
        return self.alone_available / self.alone_windows if self.alone_windows else None

    def to_json(self) -> dict[str, float | int | None]:
        share, alone = self.share, self.alone_share
        return {"windows": self.windows, "available": self.available,
                "share": None if share is None else round(share, 4),
                "alone_windows": self.alone_windows, "alone_available": self.alone_available,
                "alone_share": None if alone is None else round(alone, 4)}


def workload_end(h: History) -> float:
    """When the harness stopped the producers (module docstring); +inf if not known."""
    stopped = h.meta.get("workload_stopped_s")
    if stopped is not None:
        return float(stopped)
    return max((r.t_end for r in h.rounds), default=float("inf"))


def shared_component(h: History) -> frozenset[str]:
    """The fault kinds of :data:`SHARED_COMPONENT` for the HA mode of ``h``'s rounds."""
    return frozenset(k for r in h.rounds[:1] for k in SHARED_COMPONENT.get(r.mode, ()))


def _windows(lo: float, hi: float, end: float = float("inf")) -> list[float]:
    out = []
    w = lo
    hi = min(hi, end)
    while w + WINDOW_S <= hi + 1e-9:
        out.append(w)
        w += WINDOW_S
    return out


def _hit(done: list[float], w: float) -> bool:
    i = bisect.bisect_left(done, w)
    return i < len(done) and done[i] < w + WINDOW_S


def availability(h: History, link_timeout_s: float | None = None,
                 exclude_clients: Iterable[str] = NOT_PAIR_CLIENTS) -> dict[str, Availability]:
    """Figures per fault kind, plus ``all-faults``, ``single-failures`` and ``no-fault`` (module docstring)."""
    lt = float(h.meta.get("link_timeout_s", 1.0) if link_timeout_s is None else link_timeout_s)
    skip = set(exclude_clients)
    done = sorted(s.t_done for s in h.sends if s.kind == "rcpt" and s.outcome == "ok" and s.client not in skip)
    faults = [f for f in h.faults if not f.detail.startswith(("skipped", "failed"))]
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    busy = sorted((f.t, f.t_end + AFTER_S, i) for i, f in enumerate(faults))
    starts = [b[0] for b in busy]
    end = workload_end(h)
    shared = shared_component(h)
    for i, f in enumerate(faults):
        kinds = (f.kind, "all-faults") if f.kind in shared else (f.kind, "all-faults", "single-failures")
        for w in _windows(f.t + lt, f.t_end + AFTER_S, end):
            hit = _hit(done, w)
            j = bisect.bisect_right(starts, w + WINDOW_S)
            alone = not any(lo < w + WINDOW_S and hi > w and k != i for lo, hi, k in busy[:j])
            for kind in kinds:
                c = counts[kind]
                c[0] += 1
                c[1] += hit
                if alone:
                    c[2] += 1
                    c[3] += hit
    for r in h.rounds:
        for w in _windows(r.t, r.t_end, end):
            i = bisect.bisect_right(starts, w + WINDOW_S)
            if any(lo < w + WINDOW_S and hi > w for lo, hi, _ in busy[:i]):
                continue
            hit = _hit(done, w)
            counts["no-fault"][:] = [x + d for x, d in zip(counts["no-fault"], (1, hit, 1, hit), strict=True)]
    return {k: Availability(k, *c) for k, c in sorted(counts.items())}
