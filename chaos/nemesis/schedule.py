"""The nemesis's fault schedule: a pure, seeded generator of rounds.

Theory of operation
-------------------
A run is a chain of **rounds**. Round 1 uses the run's seed ``S``; round ``k + 1``
uses :func:`next_seed` of round ``k``'s seed. A round's plan depends only on its seed,
the HA mode and the enabled fault kinds, so ``--seed R`` with a failing round's seed
``R`` replays that round's schedule (and the ones after it) exactly, and ``--seed S``
replays the whole run. Nothing here reads a clock, the network or a global RNG
(``random.Random(str)`` is deterministic across processes).

A plan is a list of :class:`Step`: *when* (seconds from the round's start), *which*
fault kind, *how long* it holds (0 for an instant fault such as a SIGKILL) and a few
parameters (latency, variant). Targets are roles ("the master", "the dead node"),
resolved when the step runs, because roles move with the faults.

The generator keeps a small model of the pair while it draws steps:

* ``dead``: how many nodes are down. ``kill-master``/``kill-slave`` need both nodes
  up (never both down: the promise is about *single* failures), ``restart-dead``
  needs one down. ``power-loss`` leaves its node down like a kill. ``disk-full`` counts as a node down too: a master whose journal
  fails fences itself and hands over, and stays out until it has space and resyncs
  (or is restarted).
* pair faults (``scope == "pair"``: process, disk, power, journal, lock, replication-link
  and kernel partitions between the nodes)
  never overlap each other and start only with both nodes up, so a round never
  stacks two failures of the pair (``double_faults=True`` lifts that, for runs that
  look beyond the promise);
* client-link faults (``scope == "link"``: cut, half-open, latency on the clients'
  proxy, the kernel partition of the clients from the master) may start at any time,
  and with probability ``p_concurrent`` one of them is added alongside a step
  ("sometimes two at once").

The round's fault window ends one second after the last step has healed; the runner
then heals whatever is left, restarts dead nodes and checks that the pair is whole.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FaultKind",
    "FAULT_KINDS",
    "Step",
    "RoundPlan",
    "PAIR_MODES",
    "LEAVES",
    "ONE_WAY",
    "default_kinds",
    "parse_kinds",
    "next_seed",
    "round_seeds",
    "plan_round",
    "plan_rounds",
]

PAIR_MODES = ("replicated", "shared-store")
#: faults after which the generator counts a node as down (until ``restart-dead``)
LEAVES = ("kill-master", "kill-slave", "disk-full", "power-loss")

Param = str | int | float
#: the directions a ``partition-one-way`` cut takes (packets from the first to the second vanish)
ONE_WAY = ("master->slave", "slave->master", "master->clients", "clients->master")


@dataclass(frozen=True)
class FaultKind:
    name: str
    summary: str
    scope: str  # "pair" (one at a time, both nodes up) or "link" (clients' network, any time)
    modes: tuple[str, ...] = PAIR_MODES
    hold: tuple[float, float] | None = None  # seconds drawn uniformly; None: instant
    #: non-empty: this fault is known to break an invariant until another piece of work
    #: lands (who, what); it is left out of the default set and runs with ``--faults all``
    pending: str = ""
    #: the pair has the witness this fault needs: pending only without ``--witness``
    #: (replicated; a shared store's partitions stay pending: its nodes share one disk)
    needs_witness: bool = False


#: why the kernel partitions that separate the two nodes are not in the default set yet
SPLIT_BRAIN = ("needs the witness (--witness, replicated): a pair of two cannot tell a partition from a dead "
               "peer; the cut-off slave takes over after the link timeout, and when the partition heals the side "
               "that loses drops its receipted writes (seen without a witness: redelivered-after-ack)")

FAULT_KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("kill-master", "SIGKILL the master's process", "pair"),
    FaultKind("freeze-master", "SIGSTOP the master, SIGCONT after the hold (a GC pause, a VM freeze)", "pair",
              hold=(0.5, 5.0)),
    FaultKind("freeze-in-flight", "freeze-master with a new durable SUBSCRIBE and a trackMessages idle barrier "
              "written into the frozen master's sockets", "pair", hold=(2.0, 5.0)),
    FaultKind("kill-slave", "SIGKILL the slave's process", "pair"),
    FaultKind("restart-dead", "start the node that is down again (it must come back as the slave)", "pair"),
    FaultKind("cut-replication", "break the replication link for the hold: nft on the nodes' HA ports (a reset, "
              "or a silent drop) in network namespaces, else its proxy disabled or half-open",
              "pair", modes=("replicated",), hold=(1.0, 4.0)),
    FaultKind("disk-full", "fill the master's data filesystem (a size-limited tmpfs) for the hold; the master "
              "fences and hands over (shared store: the whole pair waits for space)", "pair", hold=(1.0, 4.0)),
    FaultKind("partition-replication", "kernel partition between the master and the slave (nft drop both ways "
              "between their network namespaces: replication, takeover checks, everything) for the hold", "pair",
              hold=(1.0, 4.0), pending=SPLIT_BRAIN, needs_witness=True),
    FaultKind("partition-one-way", "asymmetric kernel cut: one direction of master<->slave or master<->clients "
              "drops, the other still flows, for the hold", "pair", hold=(1.0, 4.0),
              pending=SPLIT_BRAIN, needs_witness=True),
    FaultKind("isolate-node", "the master or the slave cut from everyone (the other node and every client) "
              "by the kernel, both ways, for the hold", "pair", hold=(1.0, 4.0),
              pending=SPLIT_BRAIN, needs_witness=True),
    FaultKind("partition-witness", "kernel partition between the witness and the master or the slave (nft drop "
              "both ways) for the hold; the nodes still see each other", "pair", modes=("replicated",),
              hold=(1.0, 4.0), pending="runs only with the witness (--witness)", needs_witness=True),
    FaultKind("power-loss", "SIGKILL a node whose data is on LazyFS and lose every write it had not fsynced "
              "(sometimes tearing the last one): replicated node a, whatever its role; the shared store's master",
              "pair"),
    FaultKind("bit-flip", "stop the slave, flip one bit in a journal record (of a finished segment when there "
              "is one; never the newest record), start it again: it must skip the record, report it and resync from the master", "pair",
              modes=("replicated",)),
    FaultKind("delete-lock", "delete the shared store's lock file under the running pair", "pair",
              modes=("shared-store",)),
    FaultKind("cut-client", "disable the master's client proxy (every client link closed, new ones "
              "refused) for the hold", "link", hold=(0.5, 3.0)),
    FaultKind("half-open-client", "timeout toxic on the master's client proxy: bytes vanish, nothing "
              "closes, heart-beats must notice", "link", hold=(1.0, 4.0)),
    FaultKind("partition-clients", "kernel partition between the clients and the master's client port "
              "(nft drop both ways) for the hold; the nodes still see each other", "link", hold=(0.5, 3.0)),
    FaultKind("latency", "latency (100-800 ms, jitter 10%) on the master's client proxy or, replicated, "
              "on the replication link", "link", hold=(1.0, 4.0)),
)}


def default_kinds(mode: str, witness: bool = False) -> list[str]:
    """The kinds a run uses unless told otherwise: every kind of ``mode`` not pending;
    with the witness (replicated), also those pending only for the want of it."""
    with_witness = witness and mode == "replicated"
    return [k.name for k in FAULT_KINDS.values()
            if mode in k.modes and (not k.pending or (with_witness and k.needs_witness))]


def parse_kinds(text: str) -> list[str] | None:
    """``--faults``: ``default`` (None: per mode), ``all``, or a comma list of kind names."""
    text = text.strip()
    if text in ("", "default"):
        return None
    if text == "all":
        return list(FAULT_KINDS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAULT_KINDS]
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(FAULT_KINDS)}, "
                         "or 'all' / 'default'")
    if not names:
        raise ValueError("--faults names no fault kind")
    return names


@dataclass(frozen=True)
class Step:
    at: float  # seconds from the round's start
    kind: str
    hold: float = 0.0  # 0: instant
    params: Mapping[str, Param] = field(default_factory=dict)

    @property
    def until(self) -> float:
        return self.at + self.hold

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in sorted(self.params.items()))
        hold = f" for {self.hold:.1f}s" if self.hold else ""
        return f"+{self.at:.1f}s {self.kind}{hold}{extra}"

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "kind": self.kind, "hold": self.hold, "params": dict(self.params)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Step:
        return cls(at=float(data["at"]), kind=str(data["kind"]), hold=float(data.get("hold", 0.0)),
                   params=dict(data.get("params") or {}))


@dataclass(frozen=True)
class RoundPlan:
    round: int
    seed: int
    mode: str
    steps: tuple[Step, ...]
    window_s: float  # the runner heals everything left at this offset

    def describe(self) -> str:
        return ", ".join(s.describe() for s in self.steps) or "(no fault)"

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "seed": self.seed, "mode": self.mode, "window_s": self.window_s,
                "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundPlan:
        return cls(round=int(data["round"]), seed=int(data["seed"]), mode=str(data["mode"]),
                   steps=tuple(Step.from_json(s) for s in data["steps"]), window_s=float(data["window_s"]))


def next_seed(seed: int) -> int:
    """The seed of the round after a round seeded ``seed`` (48 bits of SHA-256)."""
    return int.from_bytes(hashlib.sha256(f"nemesis:{seed}".encode()).digest()[:6], "big")


def round_seeds(seed: int, rounds: int) -> list[int]:
    out: list[int] = []
    s = seed
    for _ in range(rounds):
        out.append(s)
        s = next_seed(s)
    return out


def _r(rng: random.Random, lo: float, hi: float) -> float:
    return round(rng.uniform(lo, hi), 2)


def _params(kind: str, mode: str, rng: random.Random) -> dict[str, Param]:
    if kind == "cut-replication":
        return {"variant": rng.choice(("disable", "half-open"))}
    if kind == "partition-one-way":
        return {"dir": rng.choice(ONE_WAY)}
    if kind in ("isolate-node", "partition-witness"):
        return {"node": rng.choice(("master", "slave"))}
    if kind == "power-loss":
        return {"tear": rng.choice((0, 1))}
    if kind == "latency":
        where = rng.choice(("client", "replication")) if mode == "replicated" else "client"
        return {"where": where, "ms": rng.randrange(100, 801, 50)}
    return {}


def plan_round(seed: int, mode: str, kinds: Iterable[str] | None = None, *, round_no: int = 1,
               double_faults: bool = False, p_concurrent: float = 0.35) -> RoundPlan:
    """The plan of one round (see the module docstring). ``kinds``: the enabled fault
    kinds (None: :func:`default_kinds`); kinds that do not apply to ``mode`` are ignored."""
    if mode not in PAIR_MODES:
        raise ValueError(f"mode must be one of {', '.join(PAIR_MODES)}, got {mode!r}")
    enabled = [k for k in (default_kinds(mode) if kinds is None else kinds)
               if k in FAULT_KINDS and mode in FAULT_KINDS[k].modes]
    rng = random.Random(f"nemesis:{seed}:{mode}")
    pair_kinds = [k for k in enabled if FAULT_KINDS[k].scope == "pair" and k != "restart-dead"]
    link_kinds = [k for k in enabled if FAULT_KINDS[k].scope == "link"]
    can_restart = "restart-dead" in enabled
    steps: list[Step] = []
    dead = 0
    pair_busy_until = 0.0
    t = _r(rng, 0.5, 1.5)
    for _ in range(rng.choice((1, 2, 2, 3))):
        choices: list[tuple[str, float]] = [(k, 1.0) for k in link_kinds]
        if dead and can_restart:
            choices.append(("restart-dead", 3.0))
        pair_free = double_faults or t >= pair_busy_until
        if pair_free and dead == 0:
            choices += [(k, 1.5) for k in pair_kinds]
        if not choices:
            break
        kind = rng.choices([c[0] for c in choices], weights=[c[1] for c in choices])[0]
        step = _make_step(kind, t, mode, rng)
        steps.append(step)
        if kind in LEAVES:
            dead = 1
        elif kind == "restart-dead":
            dead = 0
        if FAULT_KINDS[kind].scope == "pair":
            pair_busy_until = max(pair_busy_until, step.until)
        # sometimes two at once: a client-link fault alongside (with double_faults, a
        # second pair fault too, but never a second node down)
        others = [k for k in link_kinds if k != kind]
        if double_faults:
            others += [k for k in pair_kinds if k != kind and not (dead and k in LEAVES)]
        if others and rng.random() < p_concurrent:
            extra = _make_step(rng.choice(others), round(t + rng.uniform(0.0, 0.5), 2), mode, rng)
            steps.append(extra)
            if extra.kind in LEAVES:
                dead = 1
            if FAULT_KINDS[extra.kind].scope == "pair":
                pair_busy_until = max(pair_busy_until, extra.until)
        gap = _r(rng, 1.0, 3.0) if step.hold == 0 else _r(rng, 0.5, 2.0)
        t = round(step.until + gap, 2)
    steps.sort(key=lambda s: s.at)
    last = max((s.until for s in steps), default=0.0)
    return RoundPlan(round=round_no, seed=seed, mode=mode, steps=tuple(steps),
                     window_s=round(max(4.0, last + 1.0), 2))


def _make_step(kind: str, at: float, mode: str, rng: random.Random) -> Step:
    fk = FAULT_KINDS[kind]
    hold = _r(rng, *fk.hold) if fk.hold else 0.0
    return Step(at=at, kind=kind, hold=hold, params=_params(kind, mode, rng))


def plan_rounds(seed: int, rounds: int, mode: str, kinds: Sequence[str] | None = None, *,
                double_faults: bool = False) -> list[RoundPlan]:
    return [plan_round(s, mode, kinds, round_no=i, double_faults=double_faults)
            for i, s in enumerate(round_seeds(seed, rounds), start=1)]
