"""Running the nemesis on one HA mode: cluster, workload, probes, rounds, final check.

Theory of operation
-------------------
:class:`ModeRun` starts a :class:`~chaos.nemesis.cluster.NemesisCluster` behind a
:class:`~chaos.harness.cluster.Stage`, the workload (:func:`build_workload`: one
thread per client, every kind) and the client-port probes, and lets traffic warm up.
Then, for each round seed (:func:`~chaos.nemesis.schedule.round_seeds`):

1. plan the round (pure: :func:`~chaos.nemesis.schedule.plan_round`);
2. play it: inject each step at its offset, heal it after its hold;
3. at the end of the fault window heal whatever is left (SIGCONT, proxies enabled,
   toxics and ballast removed), restart dead nodes, and wait for one master and one
   in-sync slave (``health_timeout_s``), restarting any node that dies meanwhile (one
   that fences itself late, e.g. at a full disk): a ``RoundRecord`` with ``healthy``. If the
   pair does not come back the run restarts the node that is not master and tries
   once more; if that fails too the mode's run stops there;
4. wait (bounded) until everything receipted so far has reached its subscribers, so
   the next round starts clean and a loss shows in the round that made it;
5. run the checker on the last minute of history (``complete=False``: a quick look;
   it can miss what needs older records, never invent a violation) in a process of its
   own (:class:`RoundCheck`: in this one, the half second of pure Python it takes held the
   GIL against the clients' and the proxies' threads, which then moved no byte for up to
   two seconds -- receipts stopped, clients and brokers each took the other for silent,
   and the next round's first windows counted as unavailable) and print the
   round's line, with its seed and the violations seen in it; ``nemesis.log`` gets each
   data filesystem's use and the LazyFS's unsynced bytes (and, on a filesystem over half
   full, its biggest files): what a long run's full disk is made of.

At the end: producers stop and flush, consumers drain (``drain_timeout_s``; the
selector feature's consumer then hands its queue over to a consumer without a selector,
:meth:`~chaos.nemesis.features.SelectiveConsumer.hand_over`), probes
stop, everything is healed and stopped by pid (tmpfs unmounted), and the checker
judges the complete history. A ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM turned into
one by the CLI) takes the same way out without the final drain.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.harness.clients import ClientSettings
from chaos.harness.cluster import ClusterError, Stage
from chaos.nemesis.checker import check
from chaos.nemesis.cluster import BRIDGED_QUEUE, NemesisCluster
from chaos.nemesis.faults import NET_KINDS, Active, Nemesis
from chaos.nemesis.features import (
    GroupConsumer,
    GroupProducer,
    PriorityBacklog,
    ScheduledProducer,
    SelectiveConsumer,
    SelectorProducer,
)
from chaos.nemesis.history import History, RoundRecord, Subscriber
from chaos.nemesis.probe import Prober
from chaos.nemesis.results import ModeResult, RoundOutcome
from chaos.nemesis.roundcheck import RoundCheck
from chaos.nemesis.schedule import FAULT_KINDS, RoundPlan, default_kinds, plan_round, round_seeds
from chaos.nemesis.workload import (
    Consumer,
    FireAndForgetProducer,
    InFlightCheck,
    ReceiptedProducer,
    TxProducer,
    Worker,
)

__all__ = ["NemesisParams", "ModeRun", "build_workload", "pair_uri", "replay_command"]

log = logging.getLogger(__name__)

Echo = Callable[[str], None]


@dataclass(frozen=True)
class NemesisParams:
    rounds: int = 3
    seed: int = 1
    kinds: tuple[str, ...] | None = None  # None: default_kinds(mode, witness)
    double_faults: bool = False
    rate: float = 20.0  # messages/s per producer
    disk: bool = True
    disk_mb: int = 64
    netns: bool = True  # the nodes in network namespaces (the kernel partition faults)
    lazyfs: bool = True  # node a's data (replicated) or the shared store on LazyFS (power-loss)
    #: replicated: a witness (``amq broker witness``, in a namespace of its own) arbitrates
    #: the pair (``--witness`` on both nodes); the partition kinds join the default set
    witness: bool = False
    link_timeout_s: float = 1.0  # the pair's --link-timeout: a freeze longer than about 4x this is a takeover
    #: the clients' heart-beats (both ways): a silent master is noticed after 2 intervals, 1.5 s,
    #: about when the witness lets the standby take over (the lease, 1.5 x link_timeout_s)
    heartbeat_ms: int = 750
    warmup_s: float = 2.0
    health_timeout_s: float = 60.0
    round_drain_s: float = 20.0
    drain_timeout_s: float = 30.0
    client_timeout_ms: int = 30000  # the failover URI's timeout: a send gives up after this long disconnected
    dedupe_window_keys: int = 100_000  # the pair's dedupe_window_size (the broker's default)

    def kinds_for(self, mode: str) -> list[str]:
        base = list(self.kinds) if self.kinds is not None else default_kinds(mode, self.witness)
        return [k for k in base if mode in FAULT_KINDS[k].modes]


def replay_command(mode: str, seed: int, rounds: int, kinds: Sequence[str] | None, double: bool,
                   witness: bool = False) -> str:
    cmd = f"amq chaos run nemesis --mode {mode} --seed {seed} --rounds {rounds}"
    if kinds is not None:
        cmd += f" --faults {','.join(kinds)}"
    if double:
        cmd += " --double-faults"
    if witness:
        cmd += " --witness"
    return cmd


def pair_uri(stage: Stage, params: NemesisParams) -> str:
    """The pair's clients' URI: the stage's failover over the proxies (first node first)
    with ``nested.connectTimeout`` of one link timeout on every leaf, so that a node that
    accepts and answers nothing (frozen, isolated) costs a reconnect that long, not 10 s
    (docs/chaos.md, *The clients' URI*)."""
    return f"{stage.uri(timeout_ms=params.client_timeout_ms)}&nested.connectTimeout={round(params.link_timeout_s * 1000)}"


def build_workload(stage: Stage, spoke_uri: str, history: History, clock: Callable[[], float],
                   params: NemesisParams) -> tuple[list[Consumer], list[Worker]]:
    """The consumers (subscribed first) and the producers of every kind (see the module
    docstring of :mod:`chaos.nemesis.workload`)."""
    pair = ClientSettings(uri=pair_uri(stage, params), heartbeat_ms=params.heartbeat_ms, connect_timeout_s=None)
    spoke = ClientSettings(uri=f"failover:({spoke_uri})?initialReconnectDelay=20&maxReconnectDelay=500"
                               f"&timeout={params.client_timeout_ms}", heartbeat_ms=params.heartbeat_ms)
    r = params.rate
    selected = SelectorProducer("p-select", pair, history, clock, dest="/queue/nemesis.select", rate=r,
                                seed=params.seed)
    consumers = [
        Consumer("c-indiv", pair, history, clock, dest="/queue/nemesis.indiv", ack="client-individual"),
        Consumer("c-client", pair, history, clock, dest="/queue/nemesis.client", ack="client"),
        Consumer("c-auto", pair, history, clock, dest="/queue/nemesis.auto", ack="auto"),
        Consumer("c-txq", pair, history, clock, dest="/queue/nemesis.txq", ack="client-individual"),
        Consumer("d-indiv", pair, history, clock, dest="/topic/nemesis.txt", ack="client-individual", durable=True),
        Consumer("d-client", pair, history, clock, dest="/topic/nemesis.txt", ack="client", durable=True),
        Consumer("c-ff", pair, history, clock, dest="/queue/nemesis.ff", ack="client-individual"),
        Consumer("c-bridged", pair, history, clock, dest=BRIDGED_QUEUE, ack="client-individual"),
        Consumer("c-sched", pair, history, clock, dest="/queue/nemesis.sched", ack="client-individual"),
        *(GroupConsumer(f"c-group{i}", pair, history, clock, dest="/queue/nemesis.group", ack="client-individual")
          for i in (1, 2, 3)),
        PriorityBacklog("c-prio", pair, history, clock, dest="/queue/nemesis.prio", seed=params.seed),
        SelectiveConsumer("c-select", pair, history, clock, producer=selected),
    ]
    producers: list[Worker] = [
        ReceiptedProducer("p-indiv", pair, history, clock, dest="/queue/nemesis.indiv", rate=r),
        ReceiptedProducer("p-client", pair, history, clock, dest="/queue/nemesis.client", rate=r),
        ReceiptedProducer("p-auto", pair, history, clock, dest="/queue/nemesis.auto", rate=r),
        TxProducer("tx-queue", pair, history, clock, dest="/queue/nemesis.txq", rate=r / 5, size=3),
        TxProducer("tx-topic", pair, history, clock, dest="/topic/nemesis.txt", rate=r / 5, size=3),
        FireAndForgetProducer("ff", pair, history, clock, dest="/queue/nemesis.ff", rate=r),
        ReceiptedProducer("p-bridged", spoke, history, clock, dest=BRIDGED_QUEUE, rate=r / 2),
        ScheduledProducer("p-sched", pair, history, clock, dest="/queue/nemesis.sched", rate=r / 4, seed=params.seed),
        GroupProducer("p-group", pair, history, clock, dest="/queue/nemesis.group", rate=r / 2),
        selected,
    ]
    for c in consumers:
        if not c.competing:
            history.add(Subscriber(c.client, c.dest, c.ack, c.durable, c.selector))
        if isinstance(c, SelectiveConsumer):  # its drain starts at the end (SelectiveConsumer.hand_over)
            history.add(Subscriber(c.drain.client, c.drain.dest, c.drain.ack))
    return consumers, producers


def _biggest(root: Path, n: int = 8) -> str:
    """The ``n`` biggest files under ``root`` (path: KiB), for the disk log line."""
    sizes: list[tuple[int, str]] = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                p = Path(dirpath) / f
                sizes.append((p.stat().st_size, str(p.relative_to(root))))
    sizes.sort(reverse=True)
    return ", ".join(f"{p}: {sz >> 10}" for sz, p in sizes[:n]) + f" ({len(sizes)} files)"


class _Drain:
    """What must have reached which consumer: receipted sends and committed keys, read
    incrementally from the history."""

    def __init__(self, history: History, consumers: Sequence[Consumer]) -> None:
        self.history = history
        # who must get a message of each destination: every subscriber, or one of the
        # competing consumers of a shared queue (one entry for all of them)
        self.by_dest: dict[str, list[tuple[Consumer, ...]]] = {}
        shared: dict[str, list[Consumer]] = {}
        for c in consumers:
            if c.competing:
                shared.setdefault(c.dest, []).append(c)
            elif c.ack != "auto" and not c.selector:  # a selective one: SelectiveConsumer.hand_over
                self.by_dest.setdefault(c.dest, []).append((c,))
        for dest, cs in shared.items():
            self.by_dest.setdefault(dest, []).append(tuple(cs))
        self.sends_seen = 0
        self.txs_seen = 0
        self.pending: list[tuple[tuple[Consumer, ...], str, float]] = []  # (who, key, receipted at)

    def refresh(self) -> None:
        sends = self.history.sends[self.sends_seen:]
        txs = self.history.txs[self.txs_seen:]
        self.sends_seen += len(sends)
        self.txs_seen += len(txs)
        for s in sends:
            if s.kind == "rcpt" and s.outcome == "ok":
                self.pending.extend((cs, s.key, s.t_done) for cs in self.by_dest.get(s.dest, ()))
        for tx in txs:
            if tx.outcome == "committed":
                self.pending.extend((cs, k, tx.t_done) for cs in self.by_dest.get(tx.dest, ()) for k in tx.keys)
        self.pending = [(cs, k, t) for cs, k, t in self.pending if not any(c.has(k) for c in cs)]

    def wait(self, timeout: float, until: float = float("inf")) -> int:
        """Wait until nothing receipted by ``until`` (history time) is pending (or
        ``timeout``); how many of those are still pending. (The producers go on meanwhile:
        a scheduled message is always due a little later, the round need not wait for it.)"""
        deadline = time.monotonic() + timeout
        self.refresh()
        while self.count(until) and time.monotonic() < deadline:
            time.sleep(0.1)
            self.refresh()
        return self.count(until)

    def count(self, until: float = float("inf")) -> int:
        return sum(1 for _, _, t in self.pending if t <= until)


class ModeRun:
    def __init__(self, mode: str, params: NemesisParams, workdir: Path, echo: Echo,
                 clock: Callable[[], float]) -> None:
        self.mode = mode
        self.params = params
        self.workdir = workdir
        self.echo = echo
        self.clock = clock
        self.kinds = params.kinds_for(mode)
        self.history = History({"mode": mode, "seed": params.seed, "rounds": params.rounds,
                                "kinds": self.kinds, "double_faults": params.double_faults,
                                "link_timeout_s": params.link_timeout_s,
                                "witness": params.witness})
        self.result = ModeResult(mode, params, self.kinds, self.history)
        self.cluster: NemesisCluster | None = None
        self.stage: Stage | None = None
        self.nemesis: Nemesis | None = None
        self.consumers: list[Consumer] = []
        self.producers: list[Worker] = []
        self.prober: Prober | None = None
        self.drain: _Drain | None = None
        self.round_check = RoundCheck()

    def label(self) -> str:
        return f"nemesis[{self.mode}]"

    def run(self) -> ModeResult:
        """The whole run of this mode (see the module docstring); always cleans up."""
        t0 = time.monotonic()
        interrupted = False
        try:
            self._start()
            self._rounds()
            self._finish()
        except KeyboardInterrupt:
            interrupted = True
            self.result.aborted = "interrupted (Ctrl-C)"
            self.echo(f"{self.label()}: interrupted; stopping every process and unmounting")
        except ClusterError as exc:
            self.result.aborted = str(exc)
            self.echo(f"{self.label()}: stopped: {exc}")
        finally:
            self._teardown()
            self.result.duration_s = time.monotonic() - t0
        if self.result.result is None:
            self.result.result = check(self.history.snapshot(), complete=False)
        if interrupted:
            raise KeyboardInterrupt
        return self.result

    # -- phases -------------------------------------------------------------------------
    def _start(self) -> None:
        self.echo(f"{self.label()}: starting the pair, the spoke, the bridge and the proxies")
        base = self.workdir / self.mode
        try:
            self.cluster = NemesisCluster(base, self.mode, disk=self.params.disk, disk_mb=self.params.disk_mb,
                                          link_timeout=self.params.link_timeout_s,
                                          broker_config={"dedupe_window_size": self.params.dedupe_window_keys},
                                          net=self.params.netns, lazy=self.params.lazyfs,
                                          witness=self.params.witness)
        except ClusterError:
            raise
        except Exception as exc:
            raise ClusterError(f"the {self.mode} cluster did not start: {exc}") from exc
        cl = self.cluster
        missing = {"disk-full": cl.disk_reason, "power-loss": cl.lazy_reason,
                   **dict.fromkeys(NET_KINDS, None if cl.net_reason is None
                                   else f"no network namespaces: {cl.net_reason}"),
                   "partition-witness": cl.witness_reason or (None if cl.net_reason is None
                                                              else f"no network namespaces: {cl.net_reason}")}
        for kind, reason in missing.items():
            if reason is not None and kind in self.kinds:
                note = f"{kind} skipped: {reason}"
                self.result.notes.append(note)
                self.echo(f"{self.label()}: {note}")
                self.kinds.remove(kind)
        self.stage = Stage(self.cluster, prefix=f"nemesis-{self.mode}", server=self.cluster.server)
        self.nemesis = Nemesis(self.cluster, self.stage, self.history, self.clock)
        nodes = [(n.name, n.host, n.port) for n in self.cluster.pair.nodes]
        self.prober = Prober(nodes, self.history, self.clock).start()
        assert self.cluster.spoke is not None
        self.consumers, self.producers = build_workload(self.stage, self.cluster.spoke.uri, self.history,
                                                        self.clock, self.params)
        pair_settings = self.consumers[0].settings
        self.nemesis.in_flight = lambda name: InFlightCheck(name, pair_settings, self.history, self.clock)
        for c in self.consumers:
            c.start()
        for c in self.consumers:
            if not c.started_work.wait(30):
                raise ClusterError(f"consumer {c.client} could not connect")
        time.sleep(0.5)  # subscriptions (durable ones) in place before the first message
        for p in self.producers:
            p.start()
        warm = time.monotonic()
        while time.monotonic() - warm < self.params.warmup_s + 30:
            if time.monotonic() - warm >= self.params.warmup_s and self._receipted() >= 20:
                break
            time.sleep(0.1)
        self.echo(f"{self.label()}: workload running ({len(self.producers)} producers, {len(self.consumers)} "
                  f"consumers, {self.params.rate:g} msg/s each); fault kinds: {', '.join(self.kinds)}")

    def _receipted(self) -> int:
        return sum(1 for s in self.history.sends[-500:] if s.outcome == "ok")

    def _rounds(self) -> None:
        assert self.nemesis is not None
        drain = self.drain = _Drain(self.history, self.consumers)
        for n, seed in enumerate(round_seeds(self.params.seed, self.params.rounds), start=1):
            plan = plan_round(seed, self.mode, self.kinds, round_no=n, double_faults=self.params.double_faults)
            outcome = self._round(plan, drain)
            self.result.rounds.append(outcome)
            self.echo(outcome.line)
            if not outcome.healthy and not self._repair():
                raise ClusterError(f"round {n}: the pair did not come back even after a repair: {outcome.detail}")

    def _round(self, plan: RoundPlan, drain: _Drain) -> RoundOutcome:
        nemesis = self.nemesis
        assert nemesis is not None and self.stage is not None
        out = RoundOutcome(self.mode, plan.round, plan.seed, plan)
        t_start = self.clock()
        sends0, txs0 = len(self.history.sends), len(self.history.txs)
        events: list[tuple[float, int, Any]] = [(s.at, i, s) for i, s in enumerate(plan.steps)]
        heals: list[tuple[float, Active]] = []
        while events or heals:
            next_heal = min((h[0] for h in heals), default=float("inf"))
            next_step = events[0][0] if events else float("inf")
            at = min(next_heal, next_step)
            delay = t_start + at - self.clock()
            if delay > 0:
                time.sleep(delay)
            if next_heal <= next_step:
                h = min(heals, key=lambda x: x[0])
                heals.remove(h)
                nemesis.heal(h[1])
            else:
                _, _, step = events.pop(0)
                active = nemesis.inject(step, plan.round)
                if active is not None:
                    heals.append((step.at + step.hold, active))
        delay = t_start + plan.window_s - self.clock()
        if delay > 0:
            time.sleep(delay)
        restarted: list[str] = []
        try:
            nemesis.heal_all()
            self.stage.reset()
            restarted = nemesis.restart_dead()
            ok, took, desc = nemesis.wait_healthy(self.params.health_timeout_s, restarted)
        except Exception as exc:  # a node that would not start: the round is unhealthy, then repaired
            log.exception("round %d: healing failed", plan.round)
            ok, took, desc = False, 0.0, f"healing failed: {exc!r}"
        out.healthy, out.health_s, out.detail = ok, took, desc
        until = self.clock() if ok else float("inf")
        out.pending = drain.wait(self.params.round_drain_s, until=until) if ok else drain.count()
        out.late = [(k, tuple(c.client for c in cs)) for cs, k, t in drain.pending if t <= until]
        if out.pending:
            sample = ", ".join(f"{k} (to {'/'.join(cs)})" for k, cs in out.late[:4])
            out.stacks = str(self._dump_threads(
                f"round {plan.round}: {out.pending} receipted messages still undelivered at the round's end: {sample}",
                note=False) or "")
        self._log_disk(plan.round)
        self.history.add(RoundRecord(plan.round, plan.seed, self.mode, t_start, self.clock(), plan.describe(), ok,
                                     round(took, 3), desc))
        # a quick look at this round (the last minute of history); the verdict is the
        # final check of the complete history
        recent = self.round_check.violations(self.history.since(t_start - 60.0))
        out.violations = [v for v in recent if v.round == plan.round]
        new = len(out.violations)
        sends = self.history.sends[sends0:]
        txs = self.history.txs[txs0:]
        replay = replay_command(self.mode, plan.seed, 1, self.params.kinds, self.params.double_faults,
                                self.params.witness)
        verdict = "OK" if new == 0 else (  # the final check confirms or withdraws it (ModeResult.withdrawn_lines)
            "SUSPECT (the final check decides): " + ", ".join(f"{v.rule}: {v.summary}" for v in out.violations[:3])
            + f" -- replay: {replay}")
        restart = f", restarted {','.join(restarted)}" if restarted else ""
        out.line = (
            f"{self.label()} round {plan.round}/{self.params.rounds} seed {plan.seed}: {plan.describe()} | "
            f"{'healthy' if ok else 'NOT HEALTHY'} in {took:.1f}s{restart} | "
            f"{sum(1 for s in sends if s.outcome == 'ok')}/{sum(1 for s in sends if s.kind == 'rcpt')} sends "
            f"receipted (+{sum(1 for s in sends if s.kind == 'ff')} fire-and-forget), "
            f"{sum(1 for t in txs if t.outcome == 'committed')}/{len(txs)} tx committed "
            f"({sum(1 for t in txs if t.outcome == 'in-doubt')} in doubt), pending {out.pending} | {verdict}"
        )
        return out

    def _log_disk(self, round_no: int) -> None:
        """Into nemesis.log: each data filesystem's use and the LazyFS's unsynced bytes
        (what a long run's full disk is made of)."""
        cl = self.cluster
        if cl is None:
            return
        parts = []
        for name, m in cl.mounts.items():
            with contextlib.suppress(OSError):
                st = os.statvfs(m.path)
                used = (st.f_blocks - st.f_bfree) * st.f_frsize
                parts.append(f"{name} {used >> 10} KiB used")
                if used * 2 > st.f_blocks * st.f_frsize:  # over half full: what is it made of
                    parts.append(f"{name} biggest: {_biggest(m.path)}")
        if cl.lazy is not None:
            with contextlib.suppress(OSError):
                parts.append(f"lazyfs {cl.lazy.command('stats', timeout=5)}")
        log.info("round %d disk: %s", round_no, "; ".join(parts))

    def _dump_threads(self, why: str, *, note: bool = True) -> Path | None:
        """Every thread's stack (the clients', the bridge's) into ``threads-<mode>.txt``
        in the scratch directory: what a stuck consumer or bridge was waiting for. Noted
        in the result (``note``) with ``why``; returns the file (None: not written)."""
        path = self.workdir / f"threads-{self.mode}.txt"
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"=== t={self.clock():.3f} {why}\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError:
            log.exception("could not write %s", path)
            return None
        if note:
            self.result.notes.append(f"{why}: thread stacks in {path}")
        return path

    def _repair(self) -> bool:
        """After an unhealthy round: thaw, restart the node that is not master, wait again."""
        nemesis = self.nemesis
        assert nemesis is not None
        nemesis.thaw_all()
        try:
            master = nemesis.master(timeout=10)
            for node in nemesis.nodes:
                if node is not master:
                    self.echo(f"{self.label()}: repair: restarting node {node.name}")
                    node.kill()
                    node.start(timeout=30)
            ok, _took, desc = nemesis.wait_healthy(self.params.health_timeout_s)
        except Exception as exc:
            ok, desc = False, f"repair failed: {exc!r}"
        self.result.notes.append(f"repair after round {len(self.result.rounds)}: {'ok' if ok else 'failed'}: {desc}")
        return ok

    def _finish(self) -> None:
        self.echo(f"{self.label()}: stopping the producers and draining the consumers")
        self.history.meta["workload_stopped_s"] = self.clock()  # availability counts no window after this
        for p in self.producers:
            p.stop()
        for c in self.consumers:
            if isinstance(c, PriorityBacklog):
                c.stop_sending()
        for p in self.producers:
            p.join(self.params.client_timeout_ms / 1000 + 10)
        left = self.drain.wait(self.params.drain_timeout_s) if self.drain is not None else 0
        for c in list(self.consumers):
            if isinstance(c, SelectiveConsumer):
                try:
                    left += c.hand_over(self.params.drain_timeout_s)
                finally:
                    if c.drain.ident is not None:  # started: stopped with the others
                        self.consumers.append(c.drain)
        if self.nemesis is not None:
            self.nemesis.join_background(self.params.drain_timeout_s)
        if left:
            self.echo(f"{self.label()}: {left} receipted messages still undelivered after "
                      f"{self.params.drain_timeout_s:g}s")
            self._dump_threads(f"final drain: {left} receipted messages not delivered")
        time.sleep(0.5)  # a late duplicate would arrive now
        self._stop_clients()
        self.history.t_end = self.clock()
        self.result.result = check(self.history.snapshot(), complete=True)

    def _stop_clients(self) -> None:
        for w in [*self.producers, *self.consumers]:
            w.stop()
        for w in [*self.producers, *self.consumers]:
            w.join(5)
        if self.prober is not None:
            self.prober.stop()
            self.prober = None

    def _teardown(self) -> None:
        self.round_check.close()
        try:
            if self.nemesis is not None:
                self.nemesis.heal_all()
                self.result.skipped = list(self.nemesis.skipped)
            self._stop_clients()
        finally:
            try:
                if self.stage is not None:
                    self.stage.close()
            finally:
                if self.cluster is not None:
                    self.cluster.close()

